"""``rankopt embed CHECKPOINT (--images DIR | --dataset NAME --root PATH --split S) --out E.npy``.

Writes ``E.npy`` (float32 ``(N, D)``), ``E.labels.npy`` (int64 ``(N, L)``),
``E.paths.txt`` (one image path per line, same order) and ``E.json`` (the checkpoint, the
preprocessing and the fingerprint of the embeddings, for ``Index.from_embeddings``). With
``--images DIR`` every image under DIR is embedded (sorted paths), labelled by its folders
when they form a class tree (every level, as the ``image_folder`` dataset; ``-1`` for files
directly in DIR): :func:`rankopt.data.image_folder.folder_dataset`.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rankopt.cli._postprocess import add_postprocess_arguments
from rankopt.cli._model import add_model_data_arguments
from rankopt.cli._outputs import check_output


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "embed", help="write embeddings (+ labels and paths) of images or a dataset split",
        description="Embed a folder of images or a dataset split with a checkpoint; writes OUT.npy, "
                    "OUT.labels.npy and OUT.paths.txt.")
    add_model_data_arguments(parser)
    parser.add_argument("--images", metavar="DIR", help="embed every image under DIR instead of a dataset")
    parser.add_argument("--split", metavar="SPLIT", help="dataset split (default: the first evaluation split)")
    parser.add_argument("--out", required=True, metavar="E.npy", help="output embeddings file")
    add_postprocess_arguments(parser, query_side=False, gallery_side=False)
    parser.set_defaults(func=run)


def output_paths(out: str) -> tuple[Path, Path, Path, Path]:
    """``E.npy`` -> (``E.npy``, ``E.labels.npy``, ``E.paths.txt``, ``E.json``)."""
    path = Path(out)
    stem = path.with_suffix("") if path.suffix == ".npy" else path
    return stem.with_suffix(".npy"), Path(f"{stem}.labels.npy"), Path(f"{stem}.paths.txt"), Path(f"{stem}.json")


def run(args: argparse.Namespace) -> int:
    import json

    import numpy as np

    from rankopt.cli._postprocess import postprocessing_from_args
    from rankopt.cli._model import load_from_args, runtime_network
    from rankopt.engine.assembly import inference_preprocessing
    from rankopt.engine.embed_and_score import embed_dataset
    from rankopt.files import open_npy_atomic, write_text_atomic
    from rankopt.models.fingerprint import model_fingerprint
    from rankopt.runtime import freeze_imports

    freeze_imports()

    if args.images is not None and (args.dataset is not None or args.split is not None):
        raise ValueError("use either --images DIR or --dataset/--split, not both")
    emb_path, labels_path, paths_path, info_path = output_paths(args.out)
    for path in (emb_path, labels_path, paths_path, info_path):  # before any image is embedded
        check_output(str(path), "--out", inputs=[args.checkpoint, args.images, args.whiten])
    if args.images is not None:
        from rankopt.data.image_folder import folder_dataset
        from rankopt.data.transforms import build_transform

        model, cfg, _, device, _ = load_from_args(args, [])
        transform = build_transform(cfg.data.test_transform, cfg.data.image_size)
        dataset, batch_transform = folder_dataset(args.images, transform), None
    else:
        model, cfg, datasets, device, batch_transform = load_from_args(args, [args.split] if args.split else None)
        dataset = next(iter(datasets.values()))
    preprocessing = inference_preprocessing(cfg)
    post = postprocessing_from_args(args, model_fingerprint(model, preprocessing))
    preprocessing |= post.preprocessing()
    # bounded memory: one batch of images, the embeddings written straight into E.npy (whitened batch by batch)
    network = runtime_network(args, post.wrap_model(model), preprocessing, device)
    split = embed_dataset(network, dataset, batch_size=args.batch_size or cfg.eval.batch_size,
                          device=device, num_workers=args.num_workers, show_progress=not args.no_progress,
                          batch_transform=batch_transform, embedding_transform=post.whiten, out=emb_path)
    with open_npy_atomic(labels_path, tuple(split.labels.shape), np.int64) as labels:
        labels[:] = split.labels.numpy()
    write_text_atomic(paths_path, "".join(f"{p}\n" for p in split.paths))
    fingerprint = model_fingerprint(model, preprocessing)
    write_text_atomic(info_path,
                      json.dumps({"checkpoint": str(Path(args.checkpoint).resolve()), "fingerprint": fingerprint,
                                             "preprocessing": preprocessing, "shape": list(split.embeddings.shape)},
                                            indent=2))
    print(f"wrote {emb_path} {tuple(split.embeddings.shape)}, {labels_path}, {paths_path}, {info_path} "
          f"(fingerprint {fingerprint})")
    return 0
