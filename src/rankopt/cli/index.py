"""``rankopt index (CHECKPOINT | --onnx MODEL.onnx) (--images DIR | --dataset NAME --root ROOT [--split S]) --out INDEX_DIR``.

Embeds a gallery with a checkpoint (or its ONNX export, run by onnxruntime) and saves a searchable index
folder (``rankopt.search.Index``): exact search by default, ``--faiss SPEC`` (a faiss factory string such as
``IVF4096,PQ64`` or ``HNSW32``) for large galleries, its recall@10 against exact search measured and stored.
``--multiscale``/``--whiten`` join the index's embedding pipeline (applied to queries too);
``--dba K`` augments the indexed vectors with their neighbours. ``--metadata FILE.csv|.parquet`` (a ``path``
column) adds metadata columns keyed by image path, besides a CSV dataset's own extra columns (its ``id``
column gives the item ids). Change an index with ``index-add``/``index-remove``/``index-update``
(``rankopt.cli.index_change``), export it with ``index-export``/``index-import``. ``--backend qdrant`` keeps the
vectors, ids and metadata in a Qdrant collection too (local mode in ``INDEX_DIR/qdrant``, or ``--qdrant-url``), which
``search``, ``serve`` and the ``index-*`` changes then use (``rankopt.search.qdrant``). Under ``torchrun
--nproc_per_node=N -m rankopt index ...`` each rank embeds a shard of the gallery and rank 0 saves the one index
(``rankopt.search.sharded``).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from rankopt.cli._model import add_device_argument, add_model_arguments
from rankopt.cli._postprocess import add_postprocess_arguments
from rankopt.cli._threads import add_threads_argument
from rankopt.files import write_text_atomic
from rankopt.layout import SKIPPED_TXT
from rankopt.search.settings import BACKENDS, EMBED, INDEX, SIMILARITIES


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "index", help="embed a gallery with a checkpoint and save a searchable index",
        description="Embed every image under --images DIR (labelled by class folders when DIR is a class tree) "
                    "or a dataset split with a checkpoint, and save the index folder for `rankopt search`.")
    add_model_arguments(parser)
    add_source_arguments(parser, "index")
    parser.add_argument("--out", required=True, metavar="INDEX_DIR", help="index folder to write (replaced atomically)")
    parser.add_argument("--similarity", choices=SIMILARITIES, default=INDEX.similarity,
                        help=f"similarity of the search (default: {INDEX.similarity})")
    parser.add_argument("--faiss", metavar="SPEC",
                        help="faiss factory string, e.g. HNSW32 or IVF1024,PQ32 (default: exact)")
    parser.add_argument("--faiss-params", metavar="P", help="faiss search parameters, e.g. nprobe=32 or efSearch=128")
    parser.add_argument("--backend", choices=BACKENDS, default=INDEX.backend,
                        help=f"qdrant: also keep a Qdrant collection, searched by search/serve (default: "
                             f"{INDEX.backend})")
    parser.add_argument("--qdrant-url", metavar="URL", help="a Qdrant server or cluster (default: local mode in "
                                                            "INDEX_DIR/qdrant)")
    parser.add_argument("--qdrant-collection", metavar="NAME", help="the Qdrant collection (default: rankopt)")
    parser.add_argument("--batch-size", type=int, default=EMBED.batch_size, metavar="B",
                        help=f"embedding batch size ({EMBED.batch_size})")
    add_device_argument(parser)
    parser.add_argument("--num-workers", type=int, default=EMBED.num_workers, metavar="W", help="DataLoader workers")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    add_threads_argument(parser)
    add_postprocess_arguments(parser, query_side=False, gallery_side=True)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankopt.cli._model import embedder_from_args
    from rankopt.cli._postprocess import postprocessing_from_args
    from rankopt.runtime import freeze_imports
    from rankopt.search import qdrant, sharded
    from rankopt.search.storage import check_target

    freeze_imports()

    if args.backend != "qdrant" and (args.qdrant_url or args.qdrant_collection):
        raise ValueError("--qdrant-url/--qdrant-collection go with --backend qdrant")
    if args.backend == "qdrant":  # before the embedding
        qdrant.import_qdrant()
        if args.faiss:
            raise ValueError("--faiss and --backend qdrant: an index is searched through one of them")
    check_target(args.out)  # before the embedding: a user's folder is never overwritten
    gallery, skipped, found = checked_source(args)
    place, device = sharded.start(args.device, cpu_gather=args.onnx is not None)  # torchrun: one shard per rank
    embedder = embedder_from_args(args, device=device, batch_size=args.batch_size, num_workers=args.num_workers,
                                  progress=not args.no_progress)
    post = postprocessing_from_args(args, embedder.fingerprint)
    index = sharded.build(embedder, gallery, similarity=args.similarity, postprocessing=post, faiss=args.faiss,
                          faiss_params=args.faiss_params, metadata=args.metadata, progress=not args.no_progress,
                          **found)
    sharded.finish(place)
    if index is None:  # another rank than 0: its shard is in rank 0's index
        return 0
    if args.backend == "qdrant":
        qdrant.attach(index, url=args.qdrant_url, collection=args.qdrant_collection)
    folder = index.save(args.out)
    write_skipped(folder, skipped, replace=True)
    print(summary(index))
    print(f"embedded by {embedder.active_runtime.describe()}")
    print(f"saved {folder}")
    return 0


def add_source_arguments(parser: argparse.ArgumentParser, verb: str, *, metadata: bool = True) -> None:
    """``--images DIR | --dataset NAME [--root ROOT] [--split S]`` (one required) and ``--metadata FILE``."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--images", metavar="DIR", help=f"{verb} every image under DIR")
    source.add_argument("--dataset", metavar="NAME", help=f"{verb} a dataset split (with --root)")
    parser.add_argument("--root", metavar="ROOT", help="the dataset's folder (or file)")
    parser.add_argument("--split", metavar="S", help="dataset split (default: its first evaluation split)")
    parser.add_argument("--strict", action="store_true",
                        help=f"refuse the images when one cannot be read, naming every bad file (by default an "
                             f"unreadable image is left out and listed in the index folder's {SKIPPED_TXT})")
    if metadata:
        parser.add_argument("--metadata", metavar="FILE", help="metadata columns keyed by image path: a .csv or "
                            ".parquet file with a 'path' column (relative paths: to the file's folder)")


def source_from_args(args: argparse.Namespace) -> Any:
    """The images of ``--images`` (one folder: a class tree) or the dataset split of ``--dataset``."""
    if args.images is not None:
        if args.root is not None or args.split is not None:
            raise ValueError("--root/--split go with --dataset, not --images")
        return args.images
    from rankopt.data import build_dataset, evaluation_splits

    split = args.split or next(iter(evaluation_splits(args.dataset, args.root)), "train")
    return build_dataset(args.dataset, args.root, split)


def checked_source(args: argparse.Namespace) -> tuple[Any, list[str], dict[str, list[str]]]:
    """``(the images of source_from_args, a line per one left out, options for Index.build/add)``. By default the
    embedding pass finds the unreadable images itself (the options' ``skipped`` list fills as it runs: each photo
    decoded once). ``--strict``, and each rank under torchrun, decode every image first
    (:func:`rankopt.data.readable.readable_images`): ``--strict`` refuses them all before any embedding, and every
    rank shards the same readable list."""
    source = source_from_args(args)
    if not args.strict and int(os.environ.get("WORLD_SIZE", 1)) <= 1:
        skipped: list[str] = []
        return source, skipped, {"skipped": skipped}
    from rankopt.data.readable import readable_images

    return *readable_images(source, strict=args.strict), {}


def write_skipped(folder: str | os.PathLike[str], skipped: list[str], *, replace: bool) -> None:
    """List the images left out in ``folder/skipped.txt`` and say so in one line: a new index's list replaces the
    file (removed when none was left out), an addition's is appended to it."""
    path = Path(folder) / SKIPPED_TXT
    if not skipped:
        if replace:
            path.unlink(missing_ok=True)
        return
    earlier = "" if replace or not path.is_file() else path.read_text(encoding="utf-8")
    write_text_atomic(path, earlier + "".join(f"{line}\n" for line in skipped))
    print(f"left out {len(skipped)} unreadable image(s), listed in {path} (--strict: refuse instead)")


def summary(index: Any) -> str:
    """Count, dimension, fingerprint, backend (with its measured recall) and labels of an index."""
    recall = (index.info.get("faiss") or {}).get("recall")
    backend = index.backend + (f" (recall@{recall['k']} vs exact = {recall['value']:.3f} on {recall['queries']} "
                               "queries)" if recall else "")
    labelled = index.labels[:, 0] >= 0
    if index.label_names:
        labels = f"{len(index.label_names[0])} classes, levels {', '.join(index.level_names)}"
    else:
        labels = f"{index.labels[labelled, 0].unique().numel()} label ids" if bool(labelled.any()) else "unlabelled"
    steps = []
    if index.post is not None and index.post.scales:
        steps.append(f"multi-scale {', '.join(f'{s:.3g}' for s in index.post.scales)}")
    if index.post is not None and index.post.whitening is not None:
        steps.append(f"{index.post.whitening.kind} whitening")
    if index.info.get("dba"):
        steps.append(f"DBA k={index.info['dba']['k']} alpha={index.info['dba']['alpha']}")
    if index.query_expansion is not None:
        steps.append(f"αQE k={index.query_expansion.k} alpha={index.query_expansion.alpha:g} on every search")
    pipeline = f", {', '.join(steps)}" if steps else ""
    extras = ""
    if index.metadata:
        extras += f", metadata {', '.join(sorted(index.metadata))}"
    if index.threshold is not None:
        extras += f", threshold {index.threshold['value']:.6f} (FMR {index.threshold['fmr']:g})"
    return (f"{len(index)} items ({labels}), {index.dim}-d {index.similarity}{pipeline}, "
            f"fingerprint {index.fingerprint}, {backend}{extras}")
