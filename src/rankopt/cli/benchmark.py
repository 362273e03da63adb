"""``rankopt benchmark NAME [--root PATH] [--quick] [--losses ...] [--seeds ...] [--jobs N] [--out DIR] [--tune]``."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "benchmark", help="train and compare every loss under identical settings (resumable)",
        description="Train and evaluate each loss over seeds under identical settings (the benchmark's recipe), "
                    "then write the comparison (compare.md/.csv/.html: mean ± std over seeds, paired differences "
                    "to the baseline). Finished runs are skipped; an interrupted run resumes from its checkpoint. "
                    "--tune instead runs the learning-rate grid on a validation split carved from the training "
                    "classes and prints the chosen value (the test split is never used for it).")
    parser.add_argument("name", help="omniglot, caltech101, yaleb (CPU-sized), sop, cub or inat (the papers' "
                                      "recipes; GPU)")
    parser.add_argument("--root", metavar="PATH", help="dataset folder (default: the recipe's data.root)")
    parser.add_argument("--quick", action="store_true", help="tiny settings (minutes on 2 CPU cores; for CI)")
    parser.add_argument("--losses", nargs="+", metavar="LOSS", help="default: every row of the benchmark")
    parser.add_argument("--weights", metavar="FILE",
                        help="pretrained weights of caltech101/yaleb (default: $RANKOPT_WEIGHTS_MOBILENETV2 / "
                             "$RANKOPT_WEIGHTS_MOBILEFACENET)")
    parser.add_argument("--seeds", nargs="+", type=int, default=None, metavar="S",
                        help="default: 0 1 2 (0 with --quick)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="trainings side by side (default 1)")
    parser.add_argument("--threads-per-run", type=int, default=None, metavar="N",
                        help="torch threads of each training, whatever --jobs is, so that a seed gives the same "
                             "numbers with any --jobs (default 1)")
    parser.add_argument("--out", metavar="DIR", help="default: benchmarks/runs/NAME[-quick|-tuning]")
    parser.add_argument("--baseline", default=None, help="group the differences are taken to (default: the "
                                                          "benchmark's: smooth_ap, or released for yaleb)")
    parser.add_argument("--set", nargs="+", default=[], metavar="key=value", help="extra overrides for every run")
    parser.add_argument("--tune", action="store_true", help="learning-rate grid on the validation split")
    parser.add_argument("--lrs", nargs="+", type=float, metavar="LR",
                        help="--tune's grid (default: the benchmark's), extended beyond an end while its best value "
                             "sits there")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from rankopt.engine.optim import lr_beyond
    from rankopt.experiments import benchmark as bench

    definition = bench.get_benchmark(args.name)
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    suffix = "-tuning" if args.tune else "-quick" if args.quick else ""
    out = Path(args.out or f"benchmarks/runs/{args.name}{suffix}")
    threads = {} if args.threads_per_run is None else {"threads": args.threads_per_run}
    if args.tune:
        lrs = list(args.lrs or definition.lrs)
        for _ in range(bench.GRID_EXTENSIONS + 1):
            specs = bench.tuning_specs(args.name, root=args.root, quick=args.quick, extra=args.set, lrs=lrs,
                                       losses=args.losses, weights=args.weights)
            outcomes = bench.run_benchmark(specs, out, jobs=args.jobs, baseline=None,
                                           by=(*definition.group_by, "optim.lr"), **threads).outcomes
            lr, table = bench.select_learning_rate(outcomes)
            beyond = lr_beyond(lrs, lr)
            if beyond is None:
                break
            print(f"the best learning rate {lr:g} is an end of the grid: {beyond:g} is tried too")
            lrs.append(beyond)
        for value, row in sorted(table.items(), key=lambda item: float(item[0])):
            print(f"lr={value}: " + ", ".join(f"{loss} map@r={v:.4f}" for loss, v in row.items()))
        inside = "" if beyond is None else f" (still an end of the grid after {bench.GRID_EXTENSIONS} extensions)"
        print(f"chosen learning rate (best mean validation map@r): {lr:g}{inside}")
        return 0 if all(o.status != "failed" for o in outcomes) else 1
    specs = bench.benchmark_specs(args.name, root=args.root, losses=args.losses, seeds=seeds, quick=args.quick,
                                  extra=args.set, weights=args.weights)
    result = bench.run_benchmark(specs, out, jobs=args.jobs, baseline=args.baseline or definition.baseline,
                                 by=definition.group_by, **threads)
    failed = [o.spec.name for o in result.outcomes if o.status == "failed"]
    if "md" in result.comparison:
        print(result.comparison["md"].read_text())
    print(f"benchmark folder: {out} ({len(specs)} runs, {result.wall_seconds:.0f} s this invocation)")
    for key, path in result.comparison.items():
        print(f"  {key}: {path}")
    if failed:
        print(f"failed runs ({len(failed)}): {', '.join(failed)} — see their train.log")
    return 1 if failed else 0
