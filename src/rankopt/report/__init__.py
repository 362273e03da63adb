"""Report pages of rankopt runs: self-contained HTML (inline CSS, no JavaScript, no network).

:func:`write_run_report` builds ``RUN/report.html`` from a run folder (read by :mod:`rankopt.report.run_reader`;
tables in :mod:`~rankopt.report.run_tables`, the loss's surrogate in :mod:`~rankopt.report.loss_surrogates`);
:mod:`rankopt.report.html` holds the page primitives shared with ``rankopt compare``, whose :func:`compare_runs`
and :func:`write_comparison` compare groups of runs over seeds (statistics in :mod:`rankopt.report.stats`; text,
figures and page in :mod:`~rankopt.report.compare_text`, :mod:`~rankopt.report.compare_figures`,
:mod:`~rankopt.report.compare_page`).
"""

from rankopt.report.compare import Comparison, Pairing, RunRecord, UnfinishedRunError, compare_runs, load_run
from rankopt.report.compare_page import write_comparison
from rankopt.report.compare_text import markdown_tables
from rankopt.report.html import (
    DASH,
    Raw,
    check_page,
    code,
    columns,
    escape,
    figure,
    format_value,
    key_values,
    link,
    note,
    page,
    png_problem,
    section,
    table,
    write_page,
)
from rankopt.report.loss_surrogates import surrogates_for
from rankopt.report.run_reader import RunFolder, read_run
from rankopt.report.run_report import write_run_report
from rankopt.report.stats import PairedDifference, Summary, paired_difference, summarize

__all__ = [
    "Comparison",
    "DASH",
    "PairedDifference",
    "Pairing",
    "Raw",
    "RunFolder",
    "RunRecord",
    "Summary",
    "UnfinishedRunError",
    "check_page",
    "code",
    "columns",
    "compare_runs",
    "escape",
    "figure",
    "format_value",
    "key_values",
    "link",
    "load_run",
    "markdown_tables",
    "note",
    "page",
    "paired_difference",
    "png_problem",
    "read_run",
    "section",
    "summarize",
    "surrogates_for",
    "table",
    "write_comparison",
    "write_page",
    "write_run_report",
]
