"""``rankopt compare RUN_DIR... [--by KEY...] [--baseline GROUP] [--pair-by KEY] [--metrics ...] [--out DIR]``."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "compare", help="statistics over seeds and paired differences between groups of finished runs",
        description="Group finished run folders by config key(s), summarize each metric of the last evaluation "
                    "(mean ± std over the group's runs) and, with --baseline, the paired difference of every other "
                    "group to it over runs with the same --pair-by value (confidence interval, paired t-test, "
                    "Wilcoxon). Writes compare.html, compare.csv, compare.md and figures into --out; prints the "
                    "Markdown tables. Unfinished runs (no report.json) are skipped with a warning.")
    parser.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", help="run folders written by rankopt train")
    parser.add_argument("--by", nargs="+", default=["loss.name"], metavar="KEY",
                        help="dotted config key(s) whose values name the groups (default: loss.name)")
    parser.add_argument("--baseline", metavar="GROUP", help="group the others are compared with (e.g. smooth_ap)")
    parser.add_argument("--pair-by", default="train.seed", metavar="KEY",
                        help="config key matching runs of two groups (default: train.seed)")
    parser.add_argument("--metrics", nargs="+", metavar="METRIC", help="default: those every run reports")
    parser.add_argument("--confidence", type=float, default=0.95, help="level of the intervals (default: 0.95)")
    parser.add_argument("--out", default="compare", metavar="DIR", help="output folder (default: ./compare)")
    parser.add_argument("--grid-seed", type=int, metavar="SEED",
                        help="draw each group's retrieval row from its run with train.seed=SEED (default: its first "
                             "run)")
    parser.add_argument("--grid-queries", type=int, default=4, metavar="Q",
                        help="queries in the retrieval grid (default: 4)")
    parser.add_argument("--top-k", type=int, default=6, metavar="K", help="results per group and query (default: 6)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys
    import warnings

    from rankopt.report import compare_runs, markdown_tables, write_comparison

    if not args.run_dirs:
        raise ValueError("no run folder given: rankopt compare RUN_DIR [RUN_DIR ...]")
    if args.grid_queries < 1 or args.top_k < 1:
        raise ValueError(f"--grid-queries and --top-k must be >= 1, got {args.grid_queries} and {args.top_k}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        comparison = compare_runs(args.run_dirs, by=args.by, baseline=args.baseline, metrics=args.metrics,
                                  pair_by=args.pair_by, confidence=args.confidence)
    for warning in caught:
        print(f"rankopt compare: warning: {warning.message}", file=sys.stderr)
    paths = write_comparison(comparison, args.out, grid_queries=args.grid_queries, grid_top_k=args.top_k,
                             grid_seed=args.grid_seed)
    print(markdown_tables(comparison))
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0
