"""Console output: lines that keep progress bars intact, progress bars only on a terminal, metric tables."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def bars_shown(enabled: bool = True) -> bool:
    """Whether progress bars are drawn: asked for, and stderr is a terminal (redrawn in a log file or a
    pipe, a bar leaves one line per update: CI logs, ``train.log``, ``> log 2>&1``)."""
    return enabled and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()


def progress(iterable: Iterable[T], *, desc: str, total: int | None = None, enabled: bool = True) -> Iterable[T]:
    """A tqdm progress bar over ``iterable`` (a plain iterator when disabled or not :func:`bars_shown`)."""
    return tqdm(iterable, desc=desc, total=total, disable=not bars_shown(enabled), leave=False, dynamic_ncols=True)


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
