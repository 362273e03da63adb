"""Run logs: console lines and progress bars, metrics history as CSV + JSON, TensorBoard when installed."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tqdm.auto import tqdm

from rankopt.files import write_text_atomic

T = TypeVar("T")
METRICS_CSV = "metrics.csv"
METRICS_JSON = "metrics.json"


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
