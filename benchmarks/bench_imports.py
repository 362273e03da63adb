"""Import cost of the modules rankopt imports lazily (inside the function that needs them).

Each row runs in a fresh interpreter: it imports the module the lazy import sits in (the context), then
times the lazy import alone: what a caller that never reaches it is spared. Median of ``--repeats``
interpreters; the files are in the page cache after the first.

    python benchmarks/bench_imports.py              # writes benchmarks/results/imports.md
    python benchmarks/bench_imports.py --no-write   # print only
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "imports.md"
CASES = [  # (lazy import, the module it is imported from, where the code imports it lazily)
    ("rankopt.metrics._tile_kernels", "rankopt.metrics.tiled", "`metrics/tiled.py` (numba)"),
    ("rankopt.losses._calibration_kernels", "rankopt.losses.calibration", "`losses/calibration.py` (numba)"),
    ("rankopt.rank._surrogate_kernels", "rankopt.rank.surrogates", "`rank/surrogates.py` (numba)"),
    ("rankopt.rank._step_kernels", "rankopt.rank.surrogates", "`rank/surrogates.py` (numba)"),
    ("rankopt.data._resample_kernels", "rankopt.data.fast_transform", "`data/fast_transform.py` (numba)"),
    ("rankopt.losses", "rankopt.engine.assembly", "`engine/assembly.py` (pytorch-metric-learning etc.)"),
    ("rankopt.viz", "rankopt.engine.run_writer", "`engine/run_writer.py`, `report/*` (matplotlib)"),
    ("torch", "rankopt.report", "`report/loss_surrogates.py`, `report/compare_figures.py`"),
    ("rankopt.data.transforms", "rankopt.search", "`search/embedder.py` (kornia)"),
]
CHILD = ("import importlib, sys, time\nimportlib.import_module(sys.argv[1])\nstart = time.perf_counter()\n"
         "importlib.import_module(sys.argv[2])\nprint(time.perf_counter() - start)")


def seconds(lazy: str, context: str) -> float:
    """The import time of ``lazy`` in a fresh interpreter that imported ``context`` first."""
    out = subprocess.run([sys.executable, "-c", CHILD, context, lazy], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="fresh interpreters per row (median)")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    from rankopt.describe import machine_info

    load_start = os.getloadavg()[0]
    rows = [(lazy, context, where, statistics.median(seconds(lazy, context) for _ in range(args.repeats)))
            for lazy, context, where in CASES]
    info = machine_info("cpu")
    lines = ["# Import cost of rankopt's lazy imports", "",
             f"- command: `{' '.join(['python benchmarks/bench_imports.py', *sys.argv[1:]])}`",
             f"- machine: {info['platform']}, {info['cpu_count']} CPU cores, torch {info['torch']}, Python {info['python']}",
             f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; load average (1 min) "
             f"{load_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end",
             f"- each row: a fresh interpreter imports the context, then the lazy import is timed; median of "
             f"{args.repeats} interpreters", "",
             "| lazy import | after importing | imported lazily in | seconds |", "|---|---|---|---:|"]
    lines += [f"| `{lazy}` | `{context}` | {where} | {s:.2f} |" for lazy, context, where, s in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
