"""A run's metrics history: ``metrics.csv`` and ``metrics.json`` rewritten at every evaluation, TensorBoard when
installed (:class:`RunLogger`)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rankopt.files import write_text_atomic
from rankopt.layout import METRICS_CSV, METRICS_JSON



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
