"""``rankopt search INDEX_DIR QUERY... [--top-k 10] [--json OUT] [--html OUT] [--checkpoint CKPT]``.

A QUERY is an image file or a folder of images (recursively). Queries are embedded with the
index's checkpoint (or ``--checkpoint``, whose fingerprint must equal the index's) through the
index's embedding pipeline (multi-scale, whitening; ``--onnx MODEL.onnx``: its ONNX export); ``--qe K [--qe-alpha A]``
expands each query with its top K items (αQE) first. ``--filter KEY=VALUE`` / ``--filter "KEY in [A, B]"`` (repeatable,
ANDed) searches only the items whose metadata matches (``label``: the finest class), exactly. Prints
each query's top-k (item id, and "no match" below the index's calibrated threshold: ``rankopt
calibrate``), ``--json`` writes one record per query (``"match"`` per result when calibrated),
``--html`` the results page.
"""

from __future__ import annotations

import argparse
from typing import Any

from rankopt.cli._model import add_index_argument, add_index_model_options, index_embedder
from rankopt.cli._postprocess import add_postprocess_arguments


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "search", help="search an index (rankopt index) with query images",
        description="Embed query images with the index's model and print each query's top-k items.")
    add_index_argument(parser)
    parser.add_argument("queries", nargs="+", metavar="QUERY", help="image files or folders of images")
    parser.add_argument("--top-k", type=int, default=10, metavar="K", help="results per query (10)")
    parser.add_argument("--filter", action="append", metavar="COND",
                        help="KEY=VALUE or 'KEY in [A, B]' on the items' metadata (or label); repeatable, ANDed")
    parser.add_argument("--json", metavar="OUT", help="write one record per query as JSON")
    parser.add_argument("--html", metavar="OUT", help="write the results page (thumbnails in OUT_files/)")
    add_index_model_options(parser)
    add_postprocess_arguments(parser, query_side=True, gallery_side=False, embedding_side=False)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from rankopt.cli._postprocess import expansion_from_args
    from rankopt.cli.index import summary
    from rankopt.files import write_text_atomic
    from rankopt.search import Index

    index = Index.load(args.index)
    embedder = index_embedder(index, args)
    result = index.search(args.queries, args.top_k, filter=args.filter, model=embedder,
                          qe=expansion_from_args(args, "qe"))
    print(f"index {args.index}: {summary(index)}")
    if result.note:
        print(result.note)
    for record in result.records():
        print(format_record(record))
    if args.json:
        write_text_atomic(args.json, json.dumps(result.records(), indent=2))
        print(f"wrote {args.json}")
    if args.html:
        from rankopt.search.page import write_results_page

        details = [("index", str(Path(args.index).resolve())), ("items", len(index)),
                   ("fingerprint", index.fingerprint), ("search", index.backend), ("model", embedder.checkpoint)]
        page = write_results_page(result, args.html, details=details)
        print(f"wrote {page}")
    return 0


def format_record(record: dict[str, Any]) -> str:
    """A query's results as a small table: rank, score (and "no match" below the threshold), id, label, path."""
    label = f" (label {record['query_label']})" if "query_label" in record else ""
    lines = [f"\nquery {record['query']}{label}", f"{'rank':>4}  {'score':>8}  {'':<8}  {'id':<8}  {'label':<16}  path"]
    for r in record["results"]:
        text = "-" if r["label"] is None else str(r["label"])
        match = "no match" if r.get("match") is False else ""
        lines.append(f"{r['rank']:>4}  {r['score']:>8.4f}  {match:<8}  {r['id']:<8}  {text:<16}  "
                     f"{r['path'] if r['path'] is not None else '-'}")
    return "\n".join(lines)
