"""``rankopt export CHECKPOINT --format onnx --out MODEL.onnx [--check-images DIR | --dataset NAME --root ROOT
[--split S]] [--check-limit N]``.

Writes the model as ONNX (dynamic batch axis; preprocessing, input convention and fingerprint in its metadata,
:mod:`rankopt.export.onnx`) after checking it against PyTorch (:mod:`rankopt.export.parity`): the per-row cosine
of both embeddings on the given images (a synthetic batch when none) and, on labelled images, R@1 and mAP@R of both.
An export outside the tolerances is refused. `rankopt index --onnx MODEL.onnx` then embeds through onnxruntime.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "export", help="export a checkpoint to ONNX, checked against PyTorch",
        description="Export a rankopt checkpoint to ONNX (onnxruntime and other runtimes) with its preprocessing "
                    "and fingerprint in the model's metadata. The export is written only if its embeddings match "
                    "PyTorch's (per-row cosine >= 0.99999; R@1 and mAP@R within 1e-3 on labelled images).")
    parser.add_argument("checkpoint", help="a rankopt checkpoint (training or `rankopt convert`)")
    parser.add_argument("--format", choices=("onnx",), default="onnx", help="the export format (onnx)")
    parser.add_argument("--out", required=True, metavar="MODEL.onnx", help="the file to write")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--check-images", metavar="DIR",
                        help="check on the images under DIR (R@1 and mAP@R too when DIR is a class tree); "
                             "default: a synthetic batch of random images")
    source.add_argument("--dataset", metavar="NAME", help="check on a dataset split (with --root)")
    parser.add_argument("--root", metavar="ROOT", help="the dataset's folder")
    parser.add_argument("--split", metavar="S", help="dataset split (default: its first evaluation split)")
    parser.add_argument("--check-limit", type=int, metavar="N",
                        help="images checked at most: the first images of evenly spaced classes (default 1000; 0: all)")
    parser.add_argument("--batch-size", type=int, default=64, metavar="B", help="embedding batch size (64)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankopt.export import export_checkpoint
    from rankopt.export.parity import DEFAULT_LIMIT

    if args.dataset is None and (args.root is not None or args.split is not None):
        raise ValueError("--root/--split go with --dataset")
    if args.check_limit is not None and args.check_limit < 0:
        raise ValueError(f"--check-limit must be >= 0 (0: every image), got {args.check_limit}")
    images, description = None, None
    if args.check_images is not None:
        from rankopt.data.image_folder import folder_dataset

        images, description = folder_dataset(args.check_images), args.check_images
    elif args.dataset is not None:
        from rankopt.data import build_dataset, evaluation_splits

        split = args.split or next(iter(evaluation_splits(args.dataset, args.root)), "train")
        images, description = build_dataset(args.dataset, args.root, split), f"{args.dataset} split {split!r}"
    else:
        print("no --check-images DIR or --dataset given: parity is checked on a synthetic batch of random images")
    limit = DEFAULT_LIMIT if args.check_limit is None else (args.check_limit or None)
    exported = export_checkpoint(args.checkpoint, args.out, images=images, limit=limit, batch_size=args.batch_size,
                                 progress=not args.no_progress, description=description)
    for line in exported.parity.lines():
        print(line)
    print(summary(exported))
    print(f"next: rankopt index --onnx {exported.path} --images DIR --out INDEX")
    return 0


def summary(exported: Any) -> str:
    """One line: file, model, input convention, fingerprint."""
    from rankopt.export import describe_input

    spec = describe_input(exported.preprocessing)
    model = exported.summary
    size = exported.path.stat().st_size / 2**20
    return (f"wrote {exported.path} ({size:.1f} MiB): {model['backbone']}, {model['embedding_dim']}-d embeddings of "
            f"(batch, 3, {spec['height']}, {spec['width']}) float32 {spec['colour_order']} images (pixels / 255, "
            f"mean {spec['mean']}, std {spec['std']}; test transform {exported.preprocessing['transform']}), "
            f"dynamic batch axis, fingerprint {exported.fingerprint} (the checkpoint's)")
