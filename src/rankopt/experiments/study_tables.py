"""The result of a study: its :class:`Table` (``Summary`` cells as ``mean ± std``, Markdown and CSV) and
the :class:`Findings` a study function hands to :func:`rankopt.experiments.studies.run_study`."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rankopt.files import write_text_atomic
from rankopt.report.stats import Summary, summarize

Cell = str | int | float | Summary | None


@dataclass
class Table:
    """A result table: ``Summary`` cells print as ``mean ± std`` (and become two CSV columns)."""

    columns: list[str]
    rows: list[list[Cell]] = field(default_factory=list)

    def markdown(self) -> str:
        """A Markdown table (``|`` inside a cell escaped)."""
        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        lines = [line(self.columns), "|" + "---|" * len(self.columns)]
        lines += [line([_text(c) for c in row]) for row in self.rows]
        return "\n".join(lines)

    def write_csv(self, path: Path) -> Path:
        """Numbers only: a ``Summary`` column ``c`` becomes ``c mean``, ``c std``, ``c n``."""
        summary_cols = {i for row in self.rows for i, c in enumerate(row) if isinstance(c, Summary)}
        header = [h for i, col in enumerate(self.columns)
                  for h in ((f"{col} mean", f"{col} std", f"{col} n") if i in summary_cols else (col,))]
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(header)
        for row in self.rows:
            writer.writerow([v for i, c in enumerate(row) for v in _csv_values(c, i in summary_cols)])
        return write_text_atomic(path, buffer.getvalue())


def _text(cell: Cell) -> str:
    if isinstance(cell, Summary):
        if cell.n == 0:
            return "–"
        return f"{cell.mean:.4g}" if cell.n == 1 else f"{cell.mean:.4g} ± {cell.std:.2g}"
    if isinstance(cell, float):
        return "–" if math.isnan(cell) else f"{cell:.4g}"
    return "–" if cell is None else str(cell)


def _csv_values(cell: Cell, summary_column: bool) -> list[object]:
    if isinstance(cell, Summary):
        return [cell.mean, cell.std, cell.n] if cell.n else ["", "", 0]
    value = "" if cell is None else cell
    return [value, "", ""] if summary_column else [value]


NO_VALUE = Summary(math.nan, math.nan, 0, math.nan, math.nan)
"""The summary of no value (shown as ``–``)."""


def finite_summary(values: Sequence[float]) -> Summary:
    """Mean ± std (``ddof=1``) of the finite ``values``; :data:`NO_VALUE` when there is none."""
    finite = [float(v) for v in values if math.isfinite(v)]
    return summarize(finite) if finite else NO_VALUE


@dataclass
class Findings:
    """What a study function returns to :func:`run_study`."""

    title: str
    measured_on: str
    table: Table
    figures: list[Path]
    notes: list[str] = field(default_factory=list)
