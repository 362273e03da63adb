"""Text renderings of a :class:`~rankopt.report.compare.Comparison`: the Markdown tables (means, paired
differences) and ``compare.csv``, with the cell texts the HTML page shares."""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from pathlib import Path

from rankopt.report.compare import Comparison, Pairing, value_text
from rankopt.report.stats import PairedDifference, Summary

__all__ = ["SIGNIFICANCE", "best_in_bold", "markdown_tables", "p_text", "per_run_table", "unpaired_note", "write_csv"]

SIGNIFICANCE = 0.05


def _mean_std(s: Summary) -> str:
    return f"{s.mean:.4f}" if math.isnan(s.std) else f"{s.mean:.4f} ± {s.std:.4f}"


def p_text(p: float) -> str:
    """A p-value as text: ``n/a``, ``<0.001`` or three decimals."""
    return "n/a" if math.isnan(p) else "<0.001" if p < 0.001 else f"{p:.3f}"


def _difference(d: PairedDifference) -> str:
    """``+0.0123 [+0.0050, +0.0196] p=0.012``, or ``+0.0123 (1 pair)``."""
    return f"{d.mean:+.4f} (1 pair)" if d.n < 2 else (f"{d.mean:+.4f} [{d.ci_low:+.4f}, {d.ci_high:+.4f}] "
                                                      f"p={p_text(d.p_value)}")


def _md_row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def unpaired_note(c: Comparison, pairing: Pairing) -> str:
    """The sentence listing the runs ``pairing`` left out."""
    return (f"{len(pairing.unpaired)} run(s) left out of the pairing with {c.baseline} (no partner with the same "
            f"{c.pair_by}, or a value repeated within a group): {', '.join(r.name for r in pairing.unpaired)}")


def best_in_bold(c: Comparison) -> dict[str, tuple[str, ...]]:
    """Per metric, the groups whose mean is shown in bold: the best, when there is more than one group."""
    return {m: c.best_groups(m) if len(c.groups) > 1 else () for m in c.metrics}


def markdown_tables(comparison: Comparison) -> str:
    """The means table (groups × metrics, ``mean ± std``, best in bold) and, with a baseline, the
    table of paired differences ``+d [CI] p`` (bold when p < 0.05), with a legend line each."""
    c = comparison
    header = [" / ".join(c.by), "runs", *c.metrics]
    best = best_in_bold(c)
    lines = [_md_row(header), _md_row("---" for _ in header)]
    for g, rs in c.groups.items():
        cells = [f"**{_mean_std(c.summaries[g][m])}**" if g in best[m] else _mean_std(c.summaries[g][m])
                 for m in c.metrics]
        lines.append(_md_row([g + (" (baseline)" if g == c.baseline else ""), str(len(rs)), *cells]))
    lines += ["", "Last evaluation of each run: mean ± sample std over its runs; bold: best mean."]
    if c.baseline is not None and c.differences:
        header = [" / ".join(c.by), "pairs", *c.metrics]
        lines += ["", f"Paired difference to {c.baseline} (matched on {c.pair_by}):", "", _md_row(header),
                  _md_row("---" for _ in header)]
        for g, diffs in c.differences.items():
            cells = ["–" if d is None else f"**{_difference(d)}**" if d.significant(SIGNIFICANCE) else _difference(d)
                     for d in diffs.values()]
            lines.append(_md_row([g, str(c.pairings[g].n_pairs), *cells]))
        lines += ["", f"mean of d = group − {c.baseline} [{c.confidence:.0%} CI], p: paired t-test (two-sided); "
                      f"bold: p < {SIGNIFICANCE}."]
        lines += [f"{g}: {unpaired_note(c, p)}." for g, p in c.pairings.items() if p.unpaired]
    return "\n".join(lines + ["", *per_run_table(c)]) + "\n"


def per_run_table(c: Comparison) -> list[str]:
    """Every run's values with the torch threads it ran on and the source commit it ran (``run.json``), so that a
    rerun can be checked value by value."""
    header = ["run", " / ".join(c.by), c.pair_by, *c.metrics, "threads", "commit"]
    lines = ["Per run:", "", _md_row(header), _md_row("---" for _ in header)]
    for g, runs in c.groups.items():
        for r in runs:
            commit = r.run.get("commit") or f"rankopt {r.run.get('rankopt_version', '?')}"
            lines.append(_md_row([r.name, g, value_text(r.value(c.pair_by)), *(f"{r.metric(m):.4f}" for m in c.metrics),
                                  str(r.report.get("machine", {}).get("torch_threads", "?")), commit[:12] +
                                  ("+dirty" if commit.endswith("+dirty") else "")]))
    return lines


def _csv_number(value: float | int | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return repr(value) if isinstance(value, float) else str(value)


def write_csv(c: Comparison, path: Path) -> Path:
    """``compare.csv``: one row per group × metric (summary, then the paired difference to the baseline)."""
    columns = ["group", "metric", "n", "mean", "std", "diff_to_baseline", "ci_low", "ci_high", "p_value", "wilcoxon_p",
               "n_pairs"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for g in c.groups:
            for m in c.metrics:
                s, d = c.summaries[g][m], c.differences.get(g, {}).get(m)
                pairs = c.pairings[g].n_pairs if g in c.pairings else None
                diff = [None] * 5 if d is None else [d.mean, d.ci_low, d.ci_high, d.p_value, d.wilcoxon_p]
                writer.writerow([g, m, *map(_csv_number, [s.n, s.mean, s.std, *diff, pairs])])
    return path
