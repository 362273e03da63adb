"""Console output: lines that keep progress bars intact, progress (a bar on a terminal, plain lines in a log),
metric tables."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from typing import TextIO, TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")
PROGRESS_EVERY = 10.0
"""Seconds between plain progress lines (no terminal)."""


def bars_shown(enabled: bool = True) -> bool:
    """Whether progress bars are drawn: asked for, and stderr is a terminal (redrawn in a log file or a
    pipe, a bar leaves one line per update: CI logs, ``train.log``, ``> log 2>&1``)."""
    return enabled and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


def progress(iterable: Iterable[T], *, desc: str, total: int | None = None, enabled: bool = True,
             count: Callable[[T], int] | None = None, every: float | None = None,
             stream: TextIO | None = None) -> Iterable[T]:
    """Progress over ``iterable``: a live tqdm bar on a terminal (:func:`bars_shown`); elsewhere (a log
    file, a pipe, CI) a plain line every ``every`` seconds (default :data:`PROGRESS_EVERY`),
    ``desc: step i/N, R images/s, ETA h:mm:ss, h:mm:ss elapsed``, on ``stream`` (default: stderr, where the bar
    would be, so a command's output on stdout stays clean), and a last one when the loop ends if any was printed.
    ``count(item)``: the images in an item (without it, rates in steps/s). ``total``: default ``len(iterable)``."""
    if not enabled:
        return iterable
    if bars_shown():
        return tqdm(iterable, desc=desc, total=total, leave=False, dynamic_ncols=True)
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


def echo(message: str) -> None:
    """Print a console line without breaking active progress bars."""
    tqdm.write(message)


def format_table(columns: Mapping[str, Mapping[str, float]], title: str = "") -> str:
    """Metrics side by side: one row per metric, one column per model/run (e.g. untrained, trained)."""
    names = list(dict.fromkeys(k for col in columns.values() for k in col))
    width = max([len(n) for n in names] + [6])
    heads = list(columns)
    colw = [max(len(h), 8) for h in heads]
    lines = [title] if title else []
    lines.append(f"{'metric':<{width}}  " + "  ".join(f"{h:>{w}}" for h, w in zip(heads, colw)))
    for name in names:
        cells = []
        for h, w in zip(heads, colw):
            value = columns[h].get(name)
            cells.append(f"{'-' if value is None or math.isnan(value) else f'{value:.4f}':>{w}}")
        lines.append(f"{name:<{width}}  " + "  ".join(cells))
    return "\n".join(lines)
