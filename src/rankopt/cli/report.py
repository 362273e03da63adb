"""``rankopt report RUN_DIR [--check]``: rebuild a run's figures and its page ``RUN_DIR/report.html``."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report", help="rebuild a run folder's report.html (and its training figures) from the folder alone",
        description="Draw the training diagnostics of a run folder (loss terms, learning rates, metrics per "
                    "evaluation, AP per level, the loss's step surrogate) into RUN_DIR/figures and write "
                    "RUN_DIR/report.html: one self-contained page (no JavaScript, no network). Nothing is "
                    "retrained and no model is loaded; missing pieces are said on the page.")
    parser.add_argument("run_dir", metavar="RUN_DIR",
                        help="a folder written by rankopt train or rankopt evaluate --output")
    parser.add_argument("--check", action="store_true",
                        help="then check the page (local files exist, PNGs valid, no network resource); "
                             "exit 1 listing the problems")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankopt.report import check_page, write_run_report

    path = write_run_report(args.run_dir)
    print(path)
    if args.check:
        problems = check_page(path)
        for problem in problems:
            print(f"rankopt report: {path}: {problem}", file=sys.stderr)
        return 1 if problems else 0
    return 0
