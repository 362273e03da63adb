"""Run logs: metrics history as CSV + JSON, TensorBoard when installed, and progress that a log file shows
(:func:`progress`; console output: :mod:`rankopt.console`)."""

from __future__ import annotations

import csv
import io
import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any, TextIO, TypeVar

from rankopt import console
from rankopt.files import write_text_atomic

T = TypeVar("T")
PROGRESS_EVERY = 10.0  # seconds between plain progress lines

METRICS_CSV = "metrics.csv"
METRICS_JSON = "metrics.json"


def write_csv_atomic(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Rows as CSV with the union of their keys as columns (first-seen order; missing cells empty)."""
    rows = list(rows)
    keys = list(dict.fromkeys(k for row in rows for k in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=keys)
    writer.writeheader()
    writer.writerows(rows)
    return write_text_atomic(path, buffer.getvalue())


class RunLogger:
    """Accumulates one record per evaluation (``{"epoch", "step", "loss", <metrics>...}``).

    Every :meth:`log` rewrites ``metrics.csv`` and ``metrics.json`` in ``run_dir`` and
    adds the numeric values to TensorBoard (``run_dir/tensorboard``) when the
    ``tensorboard`` package is installed and ``tensorboard=True``.
    """

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True, history: list[dict[str, Any]] | None = None):
        self.run_dir = Path(run_dir)
        self.history: list[dict[str, Any]] = list(history or [])
        self._writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard not installed: CSV/JSON only
                SummaryWriter = None
            if SummaryWriter is not None:
                self._writer = SummaryWriter(str(self.run_dir / "tensorboard"))

    def log(self, record: Mapping[str, Any]) -> None:
        self.history.append(dict(record))
        self._write_files()
        if self._writer is not None:
            step = int(record.get("step", len(self.history)))
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("epoch", "step"):
                    self._writer.add_scalar(key, value, step)
            self._writer.flush()

    def _write_files(self) -> None:
        write_csv_atomic(self.run_dir / METRICS_CSV, self.history)
        write_text_atomic(self.run_dir / METRICS_JSON, json.dumps(self.history, indent=2))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def progress(iterable: Iterable[T], *, desc: str, total: int | None = None, enabled: bool = True,
             count: Callable[[T], int] | None = None, every: float | None = None,
             stream: TextIO | None = None) -> Iterable[T]:
    """Progress over ``iterable``: a live bar on a terminal (:func:`rankopt.console.progress`); elsewhere (a log
    file, a pipe, CI) a plain line every ``every`` seconds (default :data:`PROGRESS_EVERY`),
    ``desc: step i/N, R images/s, ETA h:mm:ss, h:mm:ss elapsed``, on ``stream`` (default: stderr, where the bar
    would be, so a command's output on stdout stays clean), and a last one when the loop ends if any was printed.
    ``count(item)``: the images in an item (without it, rates in steps/s). ``total``: default ``len(iterable)``."""
    if not enabled:
        return iterable
    if console.bars_shown():
        return console.progress(iterable, desc=desc, total=total)
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    return _lines(iterable, desc, total, count, PROGRESS_EVERY if every is None else every, stream)


def _lines(iterable: Iterable[T], desc: str, total: int | None, count: Callable[[T], int] | None, every: float,
           stream: TextIO | None) -> Iterator[T]:
    start = last = time.monotonic()
    steps = images = 0
    printed = False

    def line(now: float) -> str:
        elapsed = max(now - start, 1e-9)
        rate = f"{images / elapsed:.1f} images/s" if count is not None else f"{steps / elapsed:.2f} steps/s"
        left = f", ETA {timedelta(seconds=round(elapsed / steps * (total - steps)))}" if total else ""
        return f"{desc}: step {steps}/{total or '?'}, {rate}{left}, {timedelta(seconds=round(elapsed))} elapsed"

    for item in iterable:
        yield item
        steps += 1
        images += count(item) if count is not None else 0
        now = time.monotonic()
        if now - last >= every:
            print(line(now), file=stream or sys.stderr, flush=True)
            last, printed = now, True
    if printed:
        print(line(time.monotonic()) + " (done)", file=stream or sys.stderr, flush=True)
