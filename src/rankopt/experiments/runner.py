"""Run a grid of trainings, ``jobs`` side by side, resumable.

Each :class:`RunSpec` is ``rankopt train RECIPE OVERRIDES --output OUT/NAME --resume auto`` in
its own process (so runs never share state and ``jobs`` processes use the cores side by side), each on a fixed
number of torch threads (:data:`RUN_THREADS` unless given) whatever ``jobs`` is: float sums are reduced in an order
that follows the threads, so a run's numbers depend on them and not on how many runs share the machine. A run folder with ``report.json`` is finished and
skipped; one with ``checkpoints/last.ckpt`` but no report was interrupted and resumes exactly
from it (``Trainer`` restores every RNG). Each run's console output goes to ``OUT/NAME/train.log``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from rankopt.layout import REPORT_JSON

RUN_THREADS = 1
"""Torch threads of each run of a grid (``--threads-per-run``): the same for every ``jobs``."""
REPORT = REPORT_JSON
LOG = "train.log"


@dataclass(frozen=True)
class RunSpec:
    """One training run: a folder name (unique in the grid), a recipe and ``key=value`` overrides."""

    name: str
    recipe: str
    overrides: tuple[str, ...] = ()
    tags: dict[str, str] = field(default_factory=dict, compare=False)

    def command(self, out_dir: Path) -> list[str]:
        return [sys.executable, "-m", "rankopt", "train", self.recipe, *self.overrides, "output.progress=false",
                "--output", str(out_dir / self.name), "--resume", "auto"]


@dataclass(frozen=True)
class RunOutcome:
    """What became of a run: ``status`` is ``done`` (trained now), ``skipped`` (already finished) or
    ``failed`` (see ``log``)."""

    spec: RunSpec
    run_dir: Path
    status: str
    seconds: float
    log: Path


def is_finished(run_dir: Path) -> bool:
    return (run_dir / REPORT).is_file()


def _check_names(specs: Sequence[RunSpec]) -> None:
    seen: set[str] = set()
    for spec in specs:
        if not spec.name or "/" in spec.name or spec.name.startswith("."):
            raise ValueError(f"run name {spec.name!r} must be a plain folder name")
        if spec.name in seen:
            raise ValueError(f"run name {spec.name!r} appears twice in the grid")
        seen.add(spec.name)


def run_one(spec: RunSpec, out_dir: Path, *, threads: int) -> RunOutcome:
    """Train ``spec`` in a child process unless it is finished; resume it if it was interrupted."""
    run_dir = out_dir / spec.name
    log = run_dir / LOG
    if is_finished(run_dir):
        return RunOutcome(spec, run_dir, "skipped", 0.0, log)
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    with open(log, "a") as handle:
        handle.write(f"$ {' '.join(spec.command(out_dir))}\n")
        handle.flush()
        code = subprocess.call(spec.command(out_dir), stdout=handle, stderr=subprocess.STDOUT, env=env)
    status = "done" if code == 0 and is_finished(run_dir) else "failed"
    return RunOutcome(spec, run_dir, status, time.perf_counter() - start, log)


def run_grid(
    specs: Sequence[RunSpec],
    out_dir: str | Path,
    *,
    jobs: int = 1,
    threads: int = RUN_THREADS,
    on_outcome: Callable[[RunOutcome], None] | None = None,
) -> list[RunOutcome]:
    """Run every spec (finished ones skipped), ``jobs`` at a time, each on ``threads`` torch threads; outcomes in
    the order of ``specs``.

    A failed run does not stop the others; ``on_outcome`` is called as each run ends.
    """
    if jobs < 1 or threads < 1:
        raise ValueError(f"jobs and threads must be >= 1, got {jobs} and {threads}")
    _check_names(specs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    def work(spec: RunSpec) -> RunOutcome:
        outcome = run_one(spec, out, threads=threads)
        if on_outcome is not None:
            on_outcome(outcome)
        return outcome

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(work, specs))
