"""``compare.html`` and :func:`write_comparison`, which writes every output of ``rankopt compare``: the CSV,
the Markdown tables, the figures and the page (setup, results, paired differences, figures)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from rankopt.nested import flatten
from rankopt.layout import FIGURES_DIR, REPORT_JSON, RETRIEVAL_NPZ
from rankopt.report.compare import MISSING, Comparison, RunRecord, value_text
from rankopt.report.compare_figures import main_metrics, retrieval_rows, synthetic_note
from rankopt.report.compare_text import SIGNIFICANCE, best_in_bold, markdown_tables, p_text, unpaired_note, write_csv
from rankopt.report.html import DASH, Raw, escape, figure, key_values, link, note, page, section, table, write_page
from rankopt.report.stats import PairedDifference, Summary

__all__ = ["write_comparison"]


def _config_keys(runs: Sequence[RunRecord]) -> tuple[dict[str, str], list[str]]:
    """Dotted config keys with one value in every run (key -> value text), and those that differ."""
    flat = [flatten(r.config) for r in runs]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    texts = {k: {value_text(f.get(k, MISSING)) for f in flat} for k in keys}
    return ({k: next(iter(t)) for k, t in texts.items() if len(t) == 1}, [k for k, t in texts.items() if len(t) > 1])


def _strong(html_text: str, on: bool) -> str:
    return f"<strong>{html_text}</strong>" if on else html_text


def _group_sizes(c: Comparison) -> str:
    """``"3"`` when every group has 3 runs, ``"2 to 3"`` otherwise."""
    sizes = sorted({len(rs) for rs in c.groups.values()})
    return str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]} to {sizes[-1]}"


def _setup_section(c: Comparison, out_dir: Path) -> str:
    fixed, differ = _config_keys(c.runs)
    datasets = sorted({str(r.report.get("dataset", r.config.get("data", {}).get("name", "?"))) for r in c.runs})
    facts = [
        ("runs", f"{len(c.runs)} finished, in {len(c.groups)} groups of {_group_sizes(c)}"),
        ("grouped by", " + ".join(c.by)),
        ("baseline", c.baseline or "none: pass --baseline to get paired differences"),
        ("paired on", f"{c.pair_by} (runs of two groups with the same value are compared with each other)"),
        ("metrics", "the last evaluation of each run (report.json 'trained'), never the best epoch, "
                    "which is selected on the evaluation split"),
        ("data", ", ".join(datasets)),
    ]
    parts = [key_values(facts)]
    if c.skipped:
        parts.append(note(f"Skipped {len(c.skipped)} unfinished run(s) without {REPORT_JSON}: "
                          + ", ".join(str(d) for d in c.skipped), warning=True))
    rows = [[g, link(os.path.relpath(r.path, out_dir), r.name), value_text(r.value(c.pair_by)), r.report.get("epochs"),
             *[r.metric(m) for m in c.metrics]] for g, rs in c.groups.items() for r in rs]
    parts.append(table([" / ".join(c.by), "run", c.pair_by, "epochs", *c.metrics], rows, caption="Runs"))
    if differ:
        values = {k: c.group_values(k) for k in differ}
        parts.append(table(["config key", *c.groups],
                           [[k, *(", ".join(v) for v in values[k].values())] for k in differ],
                           caption="Config keys that differ between runs (values per group)"))
    fixed_table = table(["config key", "value"], [[k, v] for k, v in fixed.items()])
    parts.append(Raw(f"<details><summary>{len(fixed)} config keys held fixed across all "
                     f"runs</summary>{fixed_table}</details>"))
    return section("Setup", "\n".join(parts))


def _cell(head: str, lines: Sequence[str], bold: bool) -> Raw:
    """A table cell: ``head`` (bold when ``bold``) above ``lines`` in small print, none of them wrapped."""
    small = "".join(f'<br><small class="num">{escape(line)}</small>' for line in lines)
    return Raw(f'<span class="num">{_strong(escape(head), bold)}</span>{small}')


def _mean_cell(s: Summary, best: bool) -> Raw:
    return _cell(f"{s.mean:.4f}", [] if math.isnan(s.std) else [f"± {s.std:.4f}"], best)


def _results_section(c: Comparison) -> str:
    best = best_in_bold(c)
    rows = [[g + (" (baseline)" if g == c.baseline else ""), len(rs),
             *[_mean_cell(c.summaries[g][m], g in best[m]) for m in c.metrics]]
            for g, rs in c.groups.items()]
    fewest = min(len(rs) for rs in c.groups.values())
    text = (f"Each cell: mean ± sample standard deviation (n − 1) over the group's runs; bold: the best mean. "
            f"Runs per group: {_group_sizes(c)}. "
            + ("With so few seeds a standard deviation is itself a rough estimate; read the paired differences "
               "before calling a gap real." if fewest < 5 else ""))
    return section("Results", table([" / ".join(c.by), "runs", *c.metrics], rows) + note(text),
                   intro="Metrics of the trained models (last evaluation).")


def _difference_cell(d: PairedDifference | None) -> str:
    """Mean difference (bold with ✱ when significant), its interval, then ``p`` (t-test) and ``W`` (Wilcoxon)."""
    if d is None:
        return DASH
    significant = d.significant(SIGNIFICANCE)
    lines = ["1 pair"] if d.n < 2 else [f"[{d.ci_low:+.4f},{d.ci_high:+.4f}]", f"p={p_text(d.p_value)}",
                                        f"W={p_text(d.wilcoxon_p)}"]
    return _cell(f"{d.mean:+.4f}" + (" ✱" if significant else ""), lines, significant)


def _differences_section(c: Comparison) -> str:
    rows = [[_cell(g, [f"{c.pairings[g].n_pairs} pairs"], False), *map(_difference_cell, diffs.values())]
            for g, diffs in c.differences.items()]
    notes = [f"d = group − {c.baseline} for runs with the same {c.pair_by}: mean of d [{c.confidence:.0%} confidence "
             f"interval, Student t with n − 1 degrees of freedom]; p: two-sided paired t-test; "
             f"W: Wilcoxon signed-rank p-value. "
             f"Bold with ✱: p < {SIGNIFICANCE} (t-test)."]
    fewest = min((p.n_pairs for p in c.pairings.values()), default=0)
    if 1 < fewest < 6:
        notes.append(f"With n pairs the two-sided Wilcoxon p-value cannot go below 2/2ⁿ ({2 / 2**fewest:.3g} for "
                     f"{fewest} pairs): "
                     "it cannot reach 0.05 with fewer than 6 pairs.")
    for g, pairing in c.pairings.items():
        if pairing.unpaired:
            notes.append(f"{g}: {unpaired_note(c, pairing)}.")
        if not pairing.pairs:
            notes.append(f"{g}: no run shares a {c.pair_by} value with {c.baseline}: no difference computed.")
    body = table([" / ".join(c.by), *c.metrics], rows) + "".join(map(note, notes))
    return section(f"Differences to {c.baseline}", Raw(body), anchor="differences")


def _figure_section(title: str, path: Path | None, out_dir: Path, caption: str, notes: Sequence[str],
                    missing: str) -> str:
    body = figure(Path(os.path.relpath(path, out_dir)).as_posix(), caption) if path is not None else note(missing)
    return section(title, body + "".join(map(note, notes)))


def write_comparison(comparison: Comparison, out_dir: str | os.PathLike[str], *, grid_queries: int = 4,
                     grid_top_k: int = 6,
                     grid_seed: int | None = None, query_seed: int = 0) -> dict[str, Path]:
    """Write ``compare.csv`` (one row per group × metric), ``compare.md`` (:func:`markdown_tables`),
    ``figures/learning_curves.png``, ``figures/retrieval_rows.png`` (``grid_queries`` queries drawn with
    ``query_seed``, top ``grid_top_k`` of each group's first run, or of its run with ``train.seed =
    grid_seed``) and ``compare.html`` into ``out_dir``; returns the paths by name."""
    from rankopt.viz.comparison import plot_learning_curves_by_group  # matplotlib (slow import): only when drawn

    c, out = comparison, Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": write_csv(c, out / "compare.csv")}
    paths["md"] = out / "compare.md"
    paths["md"].write_text(markdown_tables(c), encoding="utf-8")

    main = main_metrics(c.metrics)
    curve_notes: list[str] = []
    try:
        paths["learning_curves"] = plot_learning_curves_by_group(
            {g: [r.history for r in rs] for g, rs in c.groups.items()}, out / FIGURES_DIR / "learning_curves.png",
            metrics=main, title_note=synthetic_note(c))
    except ValueError as err:
        curve_notes.append(f"no learning curves: {err}")
    grid, grid_notes = retrieval_rows(c, out / FIGURES_DIR / "retrieval_rows.png", num_queries=grid_queries,
                                      top_k=grid_top_k,
                                      grid_seed=grid_seed, query_seed=query_seed)
    if grid is not None:
        paths["retrieval_rows"] = grid
    sections = [_setup_section(c, out), _results_section(c)]
    if c.differences:
        sections.append(_differences_section(c))
    sections.append(_figure_section(
        "Learning curves", paths.get("learning_curves"), out,
        f"{', '.join(main)} and the training loss per epoch (metrics.json): mean over each group's runs, band ± one "
        "std.",
        curve_notes, "No learning curves."))
    sections.append(_figure_section(
        "Retrieval", grid, out,
        "The same queries (left) and, one row per group, the top results of one run of the group. Frames: green = same "
        "finest class, orange = shares only a coarser level, red = unrelated; grey 'missing' = image not readable.",
        grid_notes, f"No group has a {RETRIEVAL_NPZ}: no retrieval grid."))
    title = f"Comparison by {' + '.join(c.by)}"
    subtitle = f"{len(c.runs)} runs in {len(c.groups)} groups" + (f", baseline {c.baseline}" if c.baseline else "")
    paths["html"] = write_page(out / "compare.html", page(title, sections, subtitle=subtitle))
    return paths
