"""Two or more versions of ``rankopt index`` timed in alternation on one folder of Caltech-101 photos.

    python benchmarks/bench_index_ab.py --weights mobilenet_v2.ckpt --code before=OLD/src --code after=src \
        --photos 64 --rounds 10 --out benchmarks/results/index_ab.md

``OLD`` is a checkout of the earlier code (``git worktree add OLD COMMIT``; compile its modules once,
``python -m compileall -q OLD/src/rankopt``, as ``scripts/bootstrap.sh`` does for this checkout, or it pays the
compilation at every start). Each round runs ``rankopt index WEIGHTS --images DIR`` once per version (``PYTHONPATH``
set to its ``SRC``, the order reversed every other round) on the first ``--photos`` photos of
:func:`bench_runtimes.photos`, read once before; one untimed run per version first. A folder of 64 photos measures
the command's fixed cost (start, imports, model, first batch, save, exit), which two runs of a 2,000-photo index
minutes apart cannot resolve on a machine whose forward drifts by 10-25 %. Prints and writes each version's wall
times, their median and the median's difference to the first version's.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench_runtimes import photos
from bench_serve_ab import code_versions, described, emit


def timed_index(weights: Path, folder: Path, out: Path, source: Path) -> float:
    """Wall seconds of ``rankopt index weights --images folder --out out`` with ``PYTHONPATH=source``."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    began = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rankopt", "index", str(weights), "--images", str(folder), "--out", str(out),
                    "--no-progress"], env=env, check=True, capture_output=True)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=os.environ.get("RANKOPT_CALTECH101"), help="101_ObjectCategories")
    parser.add_argument("--weights", type=Path, required=True, help="a checkpoint (e.g. `rankopt weights path`'s)")
    parser.add_argument("--code", action="append", required=True, metavar="NAME=SRC",
                        help="a version: its name and the folder holding its rankopt package (twice or more)")
    parser.add_argument("--photos", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, help="write the table there too")
    args = parser.parse_args()
    if args.root is None or not args.root.is_dir():
        raise SystemExit("needs --root (Caltech-101's 101_ObjectCategories) or RANKOPT_CALTECH101")
    versions = code_versions(args.code)
    date = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
    walls: list[list[float]] = [[] for _ in versions]
    with tempfile.TemporaryDirectory(prefix="bench_index_ab.") as work:
        folder = Path(work) / "photos"
        for path in photos(args.root, args.photos):
            link = folder / path.parent.name / path.name
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(path, link)
            path.read_bytes()  # read warm
        for number, (_, source) in enumerate(versions):  # warm-up: the runtime's cache, the files
            timed_index(args.weights, folder, Path(work) / f"warm{number}", Path(source).resolve())
        for round_ in range(args.rounds):
            order = range(len(versions)) if round_ % 2 == 0 else reversed(range(len(versions)))
            for number in order:
                out = Path(work) / f"v{number}-r{round_}"
                walls[number].append(timed_index(args.weights, folder, out, Path(versions[number][1]).resolve()))
    first = statistics.median(walls[0])
    shown = [f"--weights {args.weights}", *(f"--code {name}=SRC" for name, _ in versions), f"--photos {args.photos}",
             f"--rounds {args.rounds}", *([f"--out {args.out}"] if args.out else [])]
    lines = ["# `rankopt index`: versions timed in alternation", "",
             f"- command: `python benchmarks/bench_index_ab.py {' '.join(shown)}` (photos from `$RANKOPT_CALTECH101`)",
             "- code: " + "; ".join(f"{name}: {described(Path(source))}" for name, source in versions),
             f"- machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, Python "
             f"{platform.python_version()}; {date}",
             f"- `rankopt index WEIGHTS --images DIR --no-progress` with its defaults on {args.photos} Caltech-101 photos "
             f"(read warm), one untimed run per version first, then {args.rounds} rounds in alternation", "",
             "| code | wall of each run (s) | median (s) | median against the first |", "|---|---|---|---|"]
    for (name, _), values in zip(versions, walls):
        median = statistics.median(values)
        lines.append(f"| {name} | {' '.join(f'{v:.2f}' for v in values)} | {median:.2f} | {median - first:+.2f} s |")
    emit("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
