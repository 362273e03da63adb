"""``rankopt index CHECKPOINT (--images DIR | --dataset NAME --root ROOT [--split S]) --out INDEX_DIR``.

Embeds a gallery with a checkpoint and saves a searchable index folder (``rankopt.search.Index``):
exact search by default, ``--faiss SPEC`` (a faiss factory string such as ``IVF4096,PQ64`` or
``HNSW32``) for large galleries, its recall@10 against exact search measured and stored.
``--multiscale``/``--whiten`` join the index's embedding pipeline (applied to queries too);
``--dba K`` augments the indexed vectors with their neighbours.
"""

from __future__ import annotations

import argparse
from typing import Any

from rankopt.cli._postprocess import add_postprocess_arguments


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "index", help="embed a gallery with a checkpoint and save a searchable index",
        description="Embed every image under --images DIR (labelled by class folders when DIR is a class tree) "
                    "or a dataset split with a checkpoint, and save the index folder for `rankopt search`.")
    parser.add_argument("checkpoint", help="a rankopt checkpoint (e.g. RUN/checkpoints/best.ckpt)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--images", metavar="DIR", help="index every image under DIR")
    source.add_argument("--dataset", metavar="NAME", help="index a dataset split (with --root)")
    parser.add_argument("--root", metavar="ROOT", help="the dataset's folder")
    parser.add_argument("--split", metavar="S", help="dataset split (default: its first evaluation split)")
    parser.add_argument("--out", required=True, metavar="INDEX_DIR", help="index folder to write (replaced atomically)")
    parser.add_argument("--similarity", choices=("cosine", "dot", "neg_l2"), default="cosine",
                        help="similarity of the search (default: cosine)")
    parser.add_argument("--faiss", metavar="SPEC", help="faiss factory string, e.g. HNSW32 or IVF1024,PQ32 (default: exact)")
    parser.add_argument("--faiss-params", metavar="P", help="faiss search parameters, e.g. nprobe=32 or efSearch=128")
    parser.add_argument("--batch-size", type=int, default=256, metavar="B", help="embedding batch size (256)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: auto)")
    parser.add_argument("--num-workers", type=int, default=0, metavar="W", help="DataLoader workers")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    add_postprocess_arguments(parser, query_side=False, gallery_side=True)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankopt.cli._postprocess import postprocessing_from_args
    from rankopt.search import Embedder, Index
    from rankopt.search.storage import check_target

    if args.images is not None and (args.root is not None or args.split is not None):
        raise ValueError("--root/--split go with --dataset, not --images")
    check_target(args.out)  # before the embedding: a user's folder is never overwritten
    if args.images is not None:
        gallery: Any = args.images
    else:
        from rankopt.data import build_dataset, evaluation_splits

        split = args.split or next(iter(evaluation_splits(args.dataset, args.root)), "train")
        gallery = build_dataset(args.dataset, args.root, split)
    embedder = Embedder.from_checkpoint(args.checkpoint, device=args.device, batch_size=args.batch_size,
                                        num_workers=args.num_workers, progress=not args.no_progress)
    post = postprocessing_from_args(args, embedder.fingerprint)
    index = Index.build(embedder, gallery, similarity=args.similarity, postprocessing=post, faiss=args.faiss,
                        faiss_params=args.faiss_params, progress=not args.no_progress)
    folder = index.save(args.out)
    print(summary(index))
    print(f"saved {folder}")
    return 0


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
    pipeline = f", {', '.join(steps)}" if steps else ""
    return (f"{len(index)} items ({labels}), {index.dim}-d {index.similarity}{pipeline}, "
            f"fingerprint {index.fingerprint}, {backend}")
