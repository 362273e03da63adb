"""Report pages of rankopt runs: self-contained HTML (inline CSS, no JavaScript, no network).

:func:`write_run_report` builds ``RUN/report.html`` from a run folder; :mod:`rankopt.report.html`
holds the page primitives shared with ``rankopt compare``, whose :func:`compare_runs` and
:func:`write_comparison` compare groups of runs over seeds (statistics in :mod:`rankopt.report.stats`).
"""

from rankopt.report.compare import (
    Comparison,
    Pairing,
    RunRecord,
    UnfinishedRunError,
    compare_runs,
    load_run,
    markdown_tables,
    write_comparison,
)
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
from rankopt.report.run_report import RunFolder, read_run, surrogates_for, write_run_report
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
