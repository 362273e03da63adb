"""``rankopt fit --minutes 1`` alone and beside a CPU-bound process: does the budget hold on a busy machine?

    python benchmarks/fit_busy.py --caltech $RANKOPT_CALTECH101 [--before SRC]

The folder: 12 Caltech-101 categories with 60 photos or more, their first 60 photos each (720 photos, linked under
``--out``). Each fit is a child process (``python -m rankopt fit FOLDER --out RUN --minutes 1``), timed from start
to end (Python's start and imports included), alone and with a neighbour spinning on one core (``python -c "while
True: pass"``), each on a cold cache first (a fresh ``RANKOPT_CACHE`` holding only the downloaded weights: the
first fit a person runs, which makes the ONNX exports) and then on the same cache, warm; with this code and, with
``--before SRC``, with the ``src`` folder of an earlier checkout. Writes ``benchmarks/results/fit_busy.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fit import LEFT_OUT, link_tree, machine_text  # noqa: E402

from rankopt.data.cache import cache_dir  # noqa: E402
from rankopt.files import write_text_atomic  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "fit_busy.md"
CLASSES, PER_CLASS, MINUTES = 12, 60, 1.0


def fresh_cache(folder: Path) -> Path:
    """An empty rankopt cache at ``folder`` but for the weights (linked to the usual cache's: nothing is
    downloaded); the ONNX exports are made by the next fit."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    (folder / "weights").symlink_to(cache_dir("weights").resolve())
    return folder


def fit_once(src: Path, photos: Path, run: Path, busy: bool, cache: Path) -> dict:
    shutil.rmtree(run, ignore_errors=True)
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    try:
        env = {**os.environ, "PYTHONPATH": str(src), "RANKOPT_CACHE": str(cache)}
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "rankopt", "fit", str(photos), "--out", str(run), "--minutes",
                               str(MINUTES)], env=env, capture_output=True, text=True)
        wall = time.monotonic() - began
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    if done.returncode != 0:
        raise RuntimeError(f"fit failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    record = json.loads((run / "fit.json").read_text())
    said = [line for line in done.stdout.splitlines() if "cores are busy" in line or "not compared" in line
            or "too big" in line]
    return {"wall_s": wall, "stages": record["seconds"], "served": record["chosen"]["model"],
            "threads": record["sizing"]["threads"], "said": said}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--caltech", type=Path, required=True, help="101_ObjectCategories")
    parser.add_argument("--before", type=Path, help="the src folder of an earlier checkout, fitted the same way")
    parser.add_argument("--out", type=Path, default=Path("fit-busy"))
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    names = [p.name for p in sorted(args.caltech.iterdir()) if p.is_dir() and p.name not in LEFT_OUT
             and sum(1 for _ in p.iterdir()) >= PER_CLASS][:CLASSES]
    photos = link_tree(args.caltech, args.out / "photos", names, PER_CLASS)
    here = Path(__file__).resolve().parents[1] / "src"
    codes = [("this code", here)] + ([("before", args.before)] if args.before else [])
    rows = []
    for label, src in codes:
        for busy in (False, True):
            cache = fresh_cache(args.out / f"cache-{label.replace(' ', '-')}-{'busy' if busy else 'alone'}")
            for warm in (False, True):
                name = f"run-{label.replace(' ', '-')}-{'busy' if busy else 'alone'}-{'warm' if warm else 'cold'}"
                result = fit_once(src, photos, args.out / name, busy, cache)
                print(label, busy, warm, json.dumps(result), flush=True)
                stages = ", ".join(f"{k} {v:.0f}" for k, v in result["stages"].items() if k != "total")
                rows.append(f"| {label} | {'beside a spinning process' if busy else 'alone'} | "
                            f"{'warm' if warm else 'cold'} | {result['wall_s']:.1f} | "
                            f"{result['wall_s'] / (60 * MINUTES):.2f} | {result['stages']['total']:.1f} | "
                            f"{result['threads']} | {result['served']} | {stages} | "
                            f"{'; '.join(result['said']) or '-'} |")
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# `rankopt fit --minutes 1` on a busy machine", "",
             f"Generated by `benchmarks/fit_busy.py` on {now}; {machine_text()}.", "",
             "    python benchmarks/fit_busy.py --caltech $RANKOPT_CALTECH101" + (" --before OLD/src" if args.before else ""),
             "",
             f"{CLASSES * PER_CLASS} Caltech-101 photos ({CLASSES} categories x {PER_CLASS}); the target: the whole "
             "command within the budget + 10 % (66 s). Cache: `cold`, a fresh `RANKOPT_CACHE` (the ONNX exports made "
             "by this fit), `warm`, the same cache after it. `in fit (s)`: the time `fit` counts from its start; the "
             "rest of the wall is Python's start and imports.", "",
             "| code | machine | cache | wall (s) | wall / budget | in fit (s) | threads | served | stages (s) | "
             "what the fit said |",
             "|---|---|---|---|---|---|---|---|---|---|", *rows, ""]
    write_text_atomic(args.results, "\n".join(lines))
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
