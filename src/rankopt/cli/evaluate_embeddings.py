"""``rankopt evaluate-embeddings --embeddings E.npy (--labels L.npy | --multilabels M.npy [--graded] | --relevance
REL.npy|.npz) [--query-embeddings Q.npy [--query-labels QL.npy | --query-multilabels QM.npy]
[--query-ref-index IDX.npy]] [--ref-block-size ROWS] [--method auto|tiled|chunked] [--metrics ...]
[--similarity cosine] [--json OUT.json]``."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "evaluate-embeddings", help="retrieval metrics of embeddings stored as .npy files",
        description="Exact retrieval metrics of precomputed embeddings. Without --query-embeddings the "
                    "set is its own gallery (each query excluded from its results by index). Labels may be "
                    "1-D or 2-D (N, L), column 0 the finest level; or give multi-label items (--multilabels) or a "
                    "relevance matrix (--relevance), evaluated by the exact chunked path. Ties are pessimistic.")
    parser.add_argument("--embeddings", required=True, metavar="E.npy", help="gallery embeddings (N, D)")
    parser.add_argument("--labels", metavar="L.npy", help="gallery labels (N,) or (N, L), integers")
    parser.add_argument("--multilabels", metavar="M.npy",
                        help="gallery multi-label items, a 0/1 (N, C) matrix: relevant when sharing a label")
    parser.add_argument("--graded", action="store_true",
                        help="with --multilabels: the number of shared labels is the relevance grade (h-ap, ndcg)")
    parser.add_argument("--relevance", metavar="REL.npy|.npz",
                        help="relevance grades of each query to each gallery item, (Q, N) non-negative integers: a "
                             "dense .npy, or a sparse .npz (scipy.sparse.save_npz of a CSR/COO matrix, or arrays "
                             "row, col, data, shape)")
    parser.add_argument("--query-embeddings", metavar="Q.npy", help="separate query embeddings (Q, D)")
    parser.add_argument("--query-labels", metavar="QL.npy", help="labels of the separate queries")
    parser.add_argument("--query-multilabels", metavar="QM.npy", help="multi-label matrix (Q, C) of the separate queries")
    parser.add_argument("--query-ref-index", metavar="IDX.npy",
                        help="(Q,) integers: row of each query's own copy in the gallery, excluded from its "
                             "results (-1: none), for galleries that contain the queries (DyML)")
    parser.add_argument("--metrics", nargs="+", metavar="METRIC",
                        help="e.g. recall@1 recall@10 map@r map h-ap asi ndcg, or 'all' (default: by label levels)")
    parser.add_argument("--similarity", choices=("cosine", "dot", "neg_l2"), default="cosine")
    parser.add_argument("--chunk-size", type=int, metavar="ROWS", help="queries per chunk (default: fits 256 MiB)")
    parser.add_argument("--ref-block-size", type=int, metavar="ROWS",
                        help="read and prepare the gallery ROWS rows at a time, never whole (sets larger than memory; "
                             "top-k metrics, map and mrr)")
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cpu)")
    parser.add_argument("--backend", choices=("torch", "faiss"), default="torch", help="faiss: top-k metrics only")
    parser.add_argument("--method", choices=("auto", "tiled", "chunked"), default="auto",
                        help="tiled: one pass of compiled kernels over the score matrix (CPU, binary metrics); "
                             "chunked: torch per query chunk; auto: tiled where it applies to large sets")
    parser.add_argument("--alpha", type=float, default=1.0, help="H-AP relevance exponent (TPAMI Eq. 20)")
    parser.add_argument("--json", metavar="OUT", help="write {metrics, num_queries, num_queries_without_positive}")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(func=run)


def _load(path: str, what: str) -> Any:
    """The array of ``path`` as a tensor over its memory map (pages read on demand: sets larger than memory)."""
    import numpy as np
    import torch

    from rankopt.files import read_npy

    array = read_npy(path, what, mmap=True)
    if array.ndim == 0 or array.shape[0] == 0:
        raise ValueError(f"{what} file {path} has 0 rows")
    return torch.from_numpy(array if array.flags.c_contiguous else np.ascontiguousarray(array))


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from rankopt.metrics import ALL_METRICS, evaluate

    given = [flag for flag, value in (("--labels", args.labels), ("--multilabels", args.multilabels),
                                      ("--relevance", args.relevance)) if value is not None]
    if len(given) != 1:
        raise ValueError(f"give one of --labels, --multilabels, --relevance (got {', '.join(given) or 'none'})")
    query_given = {"--labels": args.query_labels, "--multilabels": args.query_multilabels, "--relevance": True}[given[0]]
    if args.query_embeddings is not None and query_given is None:
        raise ValueError(f"--query-embeddings with {given[0]} needs --query-{given[0][2:]}")
    if args.query_embeddings is None and (args.query_labels or args.query_multilabels):
        raise ValueError("--query-labels/--query-multilabels need --query-embeddings")
    if args.query_ref_index is not None and args.query_embeddings is None:
        raise ValueError("--query-ref-index needs --query-embeddings (without it each item is already excluded from "
                         "its own results)")
    ref = _load(args.embeddings, "--embeddings")
    query = ref if args.query_embeddings is None else _load(args.query_embeddings, "--query-embeddings")
    relevance = None
    if args.labels is not None:
        ref_labels = _load(args.labels, "--labels")
        query_labels = ref_labels if args.query_embeddings is None else _load(args.query_labels, "--query-labels")
    else:
        query_labels = ref_labels = None
        relevance = _relevance(args)
    if args.query_embeddings is None:
        ref, ref_labels = None, None
    own = None if args.query_ref_index is None else _load(args.query_ref_index, "--query-ref-index")
    metrics = list(ALL_METRICS) if args.metrics == ["all"] else args.metrics
    result = evaluate(query, query_labels, ref, ref_labels, metrics=metrics, similarity=args.similarity,
                      chunk_size=args.chunk_size, device=args.device, backend=args.backend,
                      progress=not args.no_progress, query_ref_index=own,
                      ref_block_size=args.ref_block_size, method=args.method, relevance=relevance,
                      **({"alpha": args.alpha} if args.alpha != 1.0 else {}))
    width = max(len(name) for name in result.metrics)
    print(f"{result.num_queries} queries, {result.num_queries_without_positive} without a positive (excluded)")
    for name, value in result.metrics.items():
        print(f"  {name:<{width}}  {100 * value:7.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_dict(), indent=2))
        print(f"wrote {args.json}")
    return 0


def _relevance(args: argparse.Namespace) -> Any:
    """The :class:`~rankopt.rank.Relevance` of ``--multilabels`` (with ``--query-multilabels``) or ``--relevance``."""
    import numpy as np
    import torch

    from rankopt.rank import Relevance

    if args.multilabels is not None:
        items = _load(args.multilabels, "--multilabels")
        queries = None if args.query_multilabels is None else _load(args.query_multilabels, "--query-multilabels")
        return Relevance.multilabel(items if queries is None else queries, items, graded=args.graded)
    if args.graded:
        raise ValueError("--graded goes with --multilabels (a --relevance matrix holds its grades)")
    if not str(args.relevance).endswith(".npz"):
        return Relevance.matrix(_load(args.relevance, "--relevance"))
    with np.load(args.relevance, allow_pickle=False) as npz:
        arrays = dict(npz)
    if "shape" not in arrays or "data" not in arrays:
        raise ValueError(f"--relevance {args.relevance}: a sparse .npz needs arrays 'shape' and 'data' with 'row'/'col' "
                         f"(COO) or 'indices'/'indptr' (CSR, scipy.sparse.save_npz); found {sorted(arrays)}")
    shape = tuple(int(n) for n in arrays["shape"])
    if "indptr" in arrays:
        rows = np.repeat(np.arange(shape[0]), np.diff(arrays["indptr"]))
        cols = arrays["indices"]
    else:
        rows, cols = arrays["row"], arrays["col"]
    index = torch.from_numpy(np.stack([rows, cols]).astype(np.int64))
    return Relevance.matrix(torch.sparse_coo_tensor(index, torch.from_numpy(arrays["data"]), shape, check_invariants=True))
