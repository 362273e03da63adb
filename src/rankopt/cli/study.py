"""``rankopt study NAME [--root PATH] [--recipe R] [--set k=v ...] [--seeds S ...] [--jobs N] [--out DIR]
[--quick] [--eval-split validation|test] [--values V ...] [--from-run RUN]``: the papers' studies
(:mod:`rankopt.experiments.studies`), each writing OUT/study.md, OUT/study.csv and OUT/*.png."""

from __future__ import annotations

import argparse
from typing import Any

STUDY_NAMES = ("batch_size", "lambda", "rho", "decomposability_gap", "approximation_error", "operating_region",
               "smooth_ap_tau", "smooth_ap_positives", "smooth_ap_batch")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "study", help="run one of the papers' studies (resumable): a table and a figure",
        description="Train the runs a study needs (one `rankopt train` per run; finished runs are skipped, "
                    "interrupted ones resumed), measure, and write OUT/study.md (table, command, machine, date, "
                    "wall time), OUT/study.csv and OUT/*.png. The sweeps (batch_size, lambda, rho, smooth_ap_*) "
                    "evaluate on a "
                    "validation split carved from the training classes unless --eval-split test.")
    parser.add_argument("name", choices=STUDY_NAMES, help="the study")
    parser.add_argument("--recipe", default="omniglot", help="recipe of every run (default: omniglot)")
    parser.add_argument("--root", metavar="PATH", help="dataset folder (default: the recipe's data.root)")
    parser.add_argument("--set", nargs="+", default=[], metavar="key=value", help="extra overrides for every run")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], metavar="S",
                        help="training seeds (default: 0 1 2; --quick keeps the first)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="trainings side by side (default 1)")
    parser.add_argument("--out", metavar="DIR", help="output folder (default: studies/NAME, studies/NAME-quick)")
    parser.add_argument("--quick", action="store_true", help="tiny settings for tests and CI (not a result)")
    parser.add_argument("--eval-split", choices=("validation", "test"), default="validation",
                        help="split the sweeps report (default: validation)")
    parser.add_argument("--values", nargs="+", type=float, metavar="V",
                        help="the swept values instead of the study's defaults (λ, ρ, τ, |P| or batch sizes)")
    parser.add_argument("--from-run", metavar="RUN", help="operating_region: measure this trained run folder")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from rankopt.experiments.studies import run_study
    from rankopt.experiments.study_settings import StudyError

    try:
        run_study(args.name, recipe=args.recipe, root=args.root, out_dir=args.out, seeds=args.seeds, jobs=args.jobs,
                  quick=args.quick, extra_overrides=args.set, eval_split=args.eval_split, values=args.values,
                  from_run=args.from_run)
    except StudyError as err:
        print(f"rankopt study: {err}", file=sys.stderr)
        return 1
    return 0
