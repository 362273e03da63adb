"""``rankopt compare``: group finished runs by config keys, summarize each metric over the seeds
of a group, and test each group against a baseline with differences paired by seed.

Metrics are the runs' *last* evaluation (``report.json["trained"]``), never the best epoch,
which is chosen on the evaluation split and so biased upwards.
"""

from __future__ import annotations

import csv
import json
import math
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rankopt.report.html import DASH, Raw, escape, figure, key_values, link, note, page, section, table, write_page
from rankopt.report.run_report import RunFolder, _finite, _metric_names, read_run
from rankopt.report.stats import PairedDifference, Summary, paired_difference, summarize

if TYPE_CHECKING:
    from rankopt.viz.comparison import GroupNeighbours

__all__ = ["Comparison", "Pairing", "RunRecord", "UnfinishedRunError", "compare_runs", "load_run", "markdown_tables",
           "write_comparison"]

CONFIG_YAML, REPORT_JSON, METRICS_JSON, RETRIEVAL_NPZ = "config.yaml", "report.json", "metrics.json", "retrieval.npz"
MAIN_METRICS = ("recall@1", "map@r")
"""Metrics drawn as learning curves when the runs have them (else the first two compared)."""
SIGNIFICANCE = 0.05
_MISSING = object()


class UnfinishedRunError(FileNotFoundError):
    """A run folder without ``report.json``: still training, or interrupted."""


@dataclass
class RunRecord(RunFolder):
    """One finished run folder (:class:`rankopt.report.run_report.RunFolder`: config as a nested
    dict, report.json, metrics.json history, ...) and the path of its ``retrieval.npz`` (None when absent)."""

    retrieval: Path | None = None

    @property
    def name(self) -> str:
        return self.path.name

    def value(self, key: str) -> Any:
        """The config value at dotted ``key`` (e.g. ``loss.kwargs.lam``); ``_MISSING`` when absent."""
        return self.setting(key, _MISSING)

    def metric(self, name: str) -> float:
        """``report.json["trained"][name]``, checked to be a finite number."""
        value = self.report["trained"].get(name, _MISSING)
        if value is _MISSING:
            raise ValueError(f"{self.path / REPORT_JSON}: no metric {name!r} in 'trained' "
                             f"(has: {', '.join(_metric_names([self.report['trained']]))})")
        if not _finite(value):
            raise ValueError(f"{self.path / REPORT_JSON}: 'trained' {name!r} is {value!r}, not a finite number")
        return float(value)


def load_run(run_dir: str | os.PathLike[str]) -> RunRecord:
    """Read a finished run folder written by ``rankopt train`` (config.yaml, report.json,
    metrics.json, optional retrieval.npz). :class:`UnfinishedRunError` when it has no report.json;
    FileNotFoundError / ValueError naming the folder or file when one is missing or corrupt."""
    folder = read_run(run_dir)
    path = folder.path
    for name in (CONFIG_YAML, REPORT_JSON, METRICS_JSON):
        if not (path / name).is_file():
            error = UnfinishedRunError if name == REPORT_JSON else FileNotFoundError
            raise error(f"{path} has no {name}" + (": the run has not finished" if name == REPORT_JSON else ""))
    if not isinstance(folder.report.get("trained"), dict) or not _metric_names([folder.report["trained"]]):
        raise ValueError(f"{path / REPORT_JSON} is corrupt: no 'trained' metrics (the last evaluation)")
    retrieval = path / RETRIEVAL_NPZ
    return RunRecord(**vars(folder), retrieval=retrieval if retrieval.is_file() else None)


def _text(value: Any) -> str:
    if value is _MISSING:
        return "unset"
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _sort_key(value: Any) -> tuple[int, float, str]:
    """Numbers in numeric order, then text, then unset."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value), "")
    return (2, 0.0, "") if value is _MISSING else (1, 0.0, _text(value))


def _check_key(runs: Sequence[RunRecord], key: str, option: str) -> None:
    if all(run.value(key) is _MISSING for run in runs):
        top = sorted(runs[0].config)
        raise ValueError(f"{option} {key!r} is in no run's {CONFIG_YAML} (its top-level keys: {', '.join(top)})")


@dataclass(frozen=True)
class Pairing:
    """Runs of a group matched to baseline runs with the same ``pair_by`` value; runs without a
    partner, or whose value repeats within their group (ambiguous), are left out and listed."""

    pairs: tuple[tuple[RunRecord, RunRecord], ...]
    unpaired: tuple[RunRecord, ...]

    @property
    def n_pairs(self) -> int:
        return len(self.pairs)


def _pair(runs: Sequence[RunRecord], baseline: Sequence[RunRecord], key: str) -> Pairing:
    def unique(group: Sequence[RunRecord]) -> dict[str, RunRecord]:
        by_value: dict[str, list[RunRecord]] = {}
        for run in group:
            if (value := run.value(key)) is not _MISSING:
                by_value.setdefault(json.dumps(value, sort_keys=True), []).append(run)
        return {v: rs[0] for v, rs in by_value.items() if len(rs) == 1}

    mine, theirs = unique(runs), unique(baseline)
    common = sorted(mine.keys() & theirs.keys(), key=lambda v: _sort_key(json.loads(v)))
    pairs = tuple((mine[v], theirs[v]) for v in common)
    paired = {id(r) for pair in pairs for r in pair}
    return Pairing(pairs, tuple(r for r in (*runs, *baseline) if id(r) not in paired))


@dataclass(frozen=True)
class Comparison:
    """Groups of runs (baseline first), per group and metric a :class:`Summary`, and per
    non-baseline group its :class:`Pairing` and :class:`PairedDifference` to the baseline
    (None for a metric without any pair)."""

    runs: tuple[RunRecord, ...]
    skipped: tuple[Path, ...]
    by: tuple[str, ...]
    baseline: str | None
    pair_by: str
    confidence: float
    metrics: tuple[str, ...]
    groups: dict[str, tuple[RunRecord, ...]]
    summaries: dict[str, dict[str, Summary]]
    pairings: dict[str, Pairing]
    differences: dict[str, dict[str, PairedDifference | None]]

    def best_groups(self, metric: str) -> tuple[str, ...]:
        """The group(s) with the highest mean, ties included (every rankopt metric is higher-is-better)."""
        top = max(self.summaries[g][metric].mean for g in self.groups)
        return tuple(g for g in self.groups if self.summaries[g][metric].mean == top)

    def group_values(self, key: str) -> dict[str, list[str]]:
        """Per group, the distinct values of config ``key`` among its runs (as text, sorted)."""
        return {g: sorted({_text(r.value(key)) for r in runs}, key=lambda t: _sort_key(_parse(t)))
                for g, runs in self.groups.items()}


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _group_label(run: RunRecord, keys: Sequence[str]) -> str:
    """The value of the one key, or ``leaf=value`` pairs (full keys where leaves collide) for several."""
    if len(keys) == 1:
        return _text(run.value(keys[0]))
    leaves = [k.rsplit(".", 1)[-1] for k in keys]
    names = leaves if len(set(leaves)) == len(leaves) else list(keys)
    return ", ".join(f"{n}={_text(run.value(k))}" for n, k in zip(names, keys, strict=True))


def compare_runs(
    run_dirs: Sequence[str | os.PathLike[str]],
    *,
    by: str | Sequence[str] = "loss.name",
    baseline: str | None = None,
    metrics: Sequence[str] | None = None,
    pair_by: str = "train.seed",
    confidence: float = 0.95,
) -> Comparison:
    """Group the finished runs of ``run_dirs`` by the value(s) of dotted config key(s) ``by``.

    Unfinished runs (no report.json) are skipped with a warning listing them. ``metrics``:
    default those in every run's ``report.json["trained"]`` (the last evaluation), in the
    first run's order. Each non-baseline group is paired with the ``baseline`` group on
    ``pair_by`` (e.g. the same seed) and ``d = group - baseline`` summarized by
    :func:`rankopt.report.stats.paired_difference` at ``confidence``.
    """
    keys = (by,) if isinstance(by, str) else tuple(by)
    if not keys:
        raise ValueError("by: give at least one config key to group the runs by")
    if not run_dirs:
        raise ValueError("no run folder given")
    dirs = list(dict.fromkeys(Path(d) for d in run_dirs))
    runs, skipped = [], []
    for d in dirs:
        try:
            runs.append(load_run(d))
        except UnfinishedRunError:
            skipped.append(d)
    if skipped:
        warnings.warn(f"skipped {len(skipped)} unfinished run(s) without {REPORT_JSON}: "
                      + ", ".join(str(d) for d in skipped), stacklevel=2)
    if not runs:
        raise ValueError(f"none of the {len(dirs)} run folder(s) has finished (no {REPORT_JSON})")
    for key in keys:
        _check_key(runs, key, "by")
    if baseline is not None:
        _check_key(runs, pair_by, "pair_by")

    if metrics is None:
        names = [m for m in _metric_names([runs[0].report["trained"]]) if all(m in r.report["trained"] for r in runs)]
        if not names:
            raise ValueError("the runs have no metric in common in report.json 'trained'")
    else:
        names = list(dict.fromkeys(metrics))
        if not names:
            raise ValueError("metrics: give at least one metric name")
    values = {r.path: {m: r.metric(m) for m in names} for r in runs}

    labelled: dict[str, list[RunRecord]] = {}
    for run in runs:
        labelled.setdefault(_group_label(run, keys), []).append(run)
    order = sorted(labelled, key=lambda g: tuple(_sort_key(labelled[g][0].value(k)) for k in keys))
    if baseline is not None:
        if baseline not in labelled:
            raise ValueError(f"baseline {baseline!r} is not a group of {' '.join(keys)}; groups: {', '.join(order)}")
        order = [baseline] + [g for g in order if g != baseline]
    groups = {g: tuple(labelled[g]) for g in order}

    summaries = {g: {m: summarize([values[r.path][m] for r in rs]) for m in names} for g, rs in groups.items()}
    pairings: dict[str, Pairing] = {}
    differences: dict[str, dict[str, PairedDifference | None]] = {}
    if baseline is not None:
        for g in order[1:]:
            pairing = pairings[g] = _pair(groups[g], groups[baseline], pair_by)
            differences[g] = {
                m: paired_difference([values[a.path][m] for a, _ in pairing.pairs], [values[b.path][m] for _, b in pairing.pairs],
                                     confidence=confidence) if pairing.pairs else None
                for m in names}
    return Comparison(tuple(runs), tuple(skipped), keys, baseline, pair_by, confidence, tuple(names), groups,
                      summaries, pairings, differences)


# ---------------------------------------------------------------- text renderings

def _mean_std(s: Summary) -> str:
    return f"{s.mean:.4f}" if math.isnan(s.std) else f"{s.mean:.4f} ± {s.std:.4f}"


def _p(p: float) -> str:
    return "n/a" if math.isnan(p) else "<0.001" if p < 0.001 else f"{p:.3f}"


def _difference(d: PairedDifference) -> str:
    """``+0.0123 [+0.0050, +0.0196] p=0.012``, or ``+0.0123 (1 pair)``."""
    return f"{d.mean:+.4f} (1 pair)" if d.n < 2 else f"{d.mean:+.4f} [{d.ci_low:+.4f}, {d.ci_high:+.4f}] p={_p(d.p_value)}"


def _md_row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _unpaired(c: Comparison, pairing: Pairing) -> str:
    return (f"{len(pairing.unpaired)} run(s) left out of the pairing with {c.baseline} (no partner with the same "
            f"{c.pair_by}, or a value repeated within a group): {', '.join(r.name for r in pairing.unpaired)}")


def _bold(c: Comparison) -> dict[str, tuple[str, ...]]:
    """Per metric, the groups whose mean is shown in bold: the best, when there is more than one group."""
    return {m: c.best_groups(m) if len(c.groups) > 1 else () for m in c.metrics}


def markdown_tables(comparison: Comparison) -> str:
    """The means table (groups × metrics, ``mean ± std``, best in bold) and, with a baseline, the
    table of paired differences ``+d [CI] p`` (bold when p < 0.05), with a legend line each."""
    c = comparison
    header = [" / ".join(c.by), "runs", *c.metrics]
    best = _bold(c)
    lines = [_md_row(header), _md_row("---" for _ in header)]
    for g, rs in c.groups.items():
        cells = [f"**{_mean_std(c.summaries[g][m])}**" if g in best[m] else _mean_std(c.summaries[g][m])
                 for m in c.metrics]
        lines.append(_md_row([g + (" (baseline)" if g == c.baseline else ""), str(len(rs)), *cells]))
    lines += ["", "Last evaluation of each run: mean ± sample std over its runs; bold: best mean."]
    if c.baseline is not None and c.differences:
        header = [" / ".join(c.by), "pairs", *c.metrics]
        lines += ["", f"Paired difference to {c.baseline} (matched on {c.pair_by}):", "", _md_row(header), _md_row("---" for _ in header)]
        for g, diffs in c.differences.items():
            cells = ["–" if d is None else f"**{_difference(d)}**" if d.significant(SIGNIFICANCE) else _difference(d)
                     for d in diffs.values()]
            lines.append(_md_row([g, str(c.pairings[g].n_pairs), *cells]))
        lines += ["", f"mean of d = group − {c.baseline} [{c.confidence:.0%} CI], p: paired t-test (two-sided); "
                      f"bold: p < {SIGNIFICANCE}."]
        lines += [f"{g}: {_unpaired(c, p)}." for g, p in c.pairings.items() if p.unpaired]
    return "\n".join(lines) + "\n"


def _csv_number(value: float | int | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return repr(value) if isinstance(value, float) else str(value)


def _write_csv(c: Comparison, path: Path) -> Path:
    columns = ["group", "metric", "n", "mean", "std", "diff_to_baseline", "ci_low", "ci_high", "p_value", "wilcoxon_p", "n_pairs"]
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


# ---------------------------------------------------------------- figures

def _main_metrics(metrics: Sequence[str]) -> list[str]:
    chosen = [m for m in MAIN_METRICS if m in metrics]
    return chosen or list(metrics[:2])


def _title_note(c: Comparison) -> str | None:
    return "SYNTHETIC data" if all(r.synthetic for r in c.runs) else None


@dataclass(frozen=True)
class _Retrieval:
    """The arrays of one run's retrieval.npz that the grid needs."""

    query_rows: dict[str, int]
    query_labels: np.ndarray
    ref_paths: np.ndarray
    ref_labels: np.ndarray
    neighbours: np.ndarray
    scores: np.ndarray


def _load_retrieval(path: Path) -> _Retrieval:
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in ("query_paths", "query_labels", "ref_paths", "ref_labels", "neighbours", "scores")}
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"{path} is corrupt: {err}") from err
    labels = [a.reshape(len(a), -1) for a in (arrays["query_labels"], arrays["ref_labels"])]
    return _Retrieval({str(p): i for i, p in enumerate(arrays["query_paths"])}, labels[0], arrays["ref_paths"], labels[1],
                      arrays["neighbours"], arrays["scores"])


def _grid_runs(c: Comparison, grid_seed: int | None, notes: list[str]) -> dict[str, RunRecord]:
    """Per group, the run whose retrieval.npz is drawn: its first run, or the one with ``train.seed = grid_seed``."""
    chosen: dict[str, RunRecord] = {}
    for g, runs in c.groups.items():
        candidates = [r for r in runs if grid_seed is None or r.value("train.seed") == grid_seed]
        with_npz = [r for r in candidates if r.retrieval is not None]
        if with_npz:
            chosen[g] = with_npz[0]
        else:
            seed = "" if grid_seed is None else f" with train.seed={grid_seed}"
            notes.append(f"{g}: no run{seed} has a {RETRIEVAL_NPZ}")
    return chosen


def _group_neighbours(label: str, r: _Retrieval, rows: list[int], k: int) -> GroupNeighbours:
    """The top-``k`` of query ``rows`` of one retrieval.npz, with the levels each result shares with its query."""
    import torch

    from rankopt.labels import relevance_levels
    from rankopt.viz.comparison import GroupNeighbours

    nb = r.neighbours[rows, :k]
    levels = np.stack([relevance_levels(torch.from_numpy(r.query_labels[i : i + 1]), torch.from_numpy(r.ref_labels[n]))[0].numpy()
                       for i, n in zip(rows, nb, strict=True)])
    return GroupNeighbours(label, [[str(p) for p in r.ref_paths[n]] for n in nb], levels, r.scores[rows, :k])


def _retrieval_rows(c: Comparison, out_path: Path, *, num_queries: int, top_k: int, grid_seed: int | None,
                    query_seed: int) -> tuple[Path | None, list[str]]:
    """Draw the same ``num_queries`` query paths (drawn with ``query_seed`` among those every group's
    retrieval.npz holds; else among the first group's) for each group; returns the figure (None
    when no group has a retrieval.npz) and notes on the groups left out."""
    from rankopt.viz.comparison import plot_retrieval_rows

    notes: list[str] = []
    loaded: dict[str, tuple[RunRecord, _Retrieval]] = {}
    for g, run in _grid_runs(c, grid_seed, notes).items():
        try:
            loaded[g] = (run, _load_retrieval(run.retrieval))  # type: ignore[arg-type]
        except ValueError as err:
            notes.append(f"{g}: {err}")
    if not loaded:
        return None, notes
    first_run, first = next(iter(loaded.values()))
    pool = sorted(set(first.query_rows).intersection(*(r.query_rows for _, r in loaded.values())) or first.query_rows)
    drawn = np.random.default_rng(query_seed).choice(len(pool), size=min(num_queries, len(pool)), replace=False)
    queries = [pool[i] for i in sorted(drawn)]
    kept = {g: gr for g, gr in loaded.items() if all(q in gr[1].query_rows for q in queries)}
    notes += [f"{g}: its {RETRIEVAL_NPZ} lacks the drawn queries (another evaluation set)" for g in loaded if g not in kept]
    k = min(top_k, *(r.neighbours.shape[1] for _, r in kept.values()))
    leaf = c.pair_by.rsplit(".", 1)[-1]
    groups = [_group_neighbours(f"{g} ({leaf} {_text(run.value(c.pair_by))})", r, [r.query_rows[q] for q in queries], k)
              for g, (run, r) in kept.items()]
    titles = [f"{Path(q).parent.name}/{Path(q).name}\nclass {int(first.query_labels[first.query_rows[q], 0])}" for q in queries]
    path = plot_retrieval_rows(out_path, queries, groups, num_levels=int(first.query_labels.shape[1]),
                               level_names=first_run.report.get("data", {}).get("level_names"), query_titles=titles,
                               title_note=_title_note(c))
    return path, notes


# ---------------------------------------------------------------- the page

def _flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _config_keys(runs: Sequence[RunRecord]) -> tuple[dict[str, str], list[str]]:
    """Dotted config keys with one value in every run (key -> value text), and those that differ."""
    flat = [_flatten(r.config) for r in runs]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    texts = {k: {_text(f.get(k, _MISSING)) for f in flat} for k in keys}
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
    rows = [[g, link(os.path.relpath(r.path, out_dir), r.name), _text(r.value(c.pair_by)), r.report.get("epochs"),
             *[r.metric(m) for m in c.metrics]] for g, rs in c.groups.items() for r in rs]
    parts.append(table([" / ".join(c.by), "run", c.pair_by, "epochs", *c.metrics], rows, caption="Runs"))
    if differ:
        values = {k: c.group_values(k) for k in differ}
        parts.append(table(["config key", *c.groups], [[k, *(", ".join(v) for v in values[k].values())] for k in differ],
                           caption="Config keys that differ between runs (values per group)"))
    fixed_table = table(["config key", "value"], [[k, v] for k, v in fixed.items()])
    parts.append(Raw(f"<details><summary>{len(fixed)} config keys held fixed across all runs</summary>{fixed_table}</details>"))
    return section("Setup", "\n".join(parts))


def _cell(head: str, lines: Sequence[str], bold: bool) -> Raw:
    """A table cell: ``head`` (bold when ``bold``) above ``lines`` in small print, none of them wrapped."""
    small = "".join(f'<br><small class="num">{escape(line)}</small>' for line in lines)
    return Raw(f'<span class="num">{_strong(escape(head), bold)}</span>{small}')


def _mean_cell(s: Summary, best: bool) -> Raw:
    return _cell(f"{s.mean:.4f}", [] if math.isnan(s.std) else [f"± {s.std:.4f}"], best)


def _results_section(c: Comparison) -> str:
    best = _bold(c)
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
    lines = ["1 pair"] if d.n < 2 else [f"[{d.ci_low:+.4f},{d.ci_high:+.4f}]", f"p={_p(d.p_value)}", f"W={_p(d.wilcoxon_p)}"]
    return _cell(f"{d.mean:+.4f}" + (" ✱" if significant else ""), lines, significant)


def _differences_section(c: Comparison) -> str:
    rows = [[_cell(g, [f"{c.pairings[g].n_pairs} pairs"], False), *map(_difference_cell, diffs.values())]
            for g, diffs in c.differences.items()]
    notes = [f"d = group − {c.baseline} for runs with the same {c.pair_by}: mean of d [{c.confidence:.0%} confidence "
             f"interval, Student t with n − 1 degrees of freedom]; p: two-sided paired t-test; W: Wilcoxon signed-rank p-value. "
             f"Bold with ✱: p < {SIGNIFICANCE} (t-test)."]
    fewest = min((p.n_pairs for p in c.pairings.values()), default=0)
    if 1 < fewest < 6:
        notes.append(f"With n pairs the two-sided Wilcoxon p-value cannot go below 2/2ⁿ ({2 / 2**fewest:.3g} for {fewest} pairs): "
                     "it cannot reach 0.05 with fewer than 6 pairs.")
    for g, pairing in c.pairings.items():
        if pairing.unpaired:
            notes.append(f"{g}: {_unpaired(c, pairing)}.")
        if not pairing.pairs:
            notes.append(f"{g}: no run shares a {c.pair_by} value with {c.baseline}: no difference computed.")
    body = table([" / ".join(c.by), *c.metrics], rows) + "".join(map(note, notes))
    return section(f"Differences to {c.baseline}", Raw(body), anchor="differences")


def _figure_section(title: str, path: Path | None, out_dir: Path, caption: str, notes: Sequence[str], missing: str) -> str:
    body = figure(Path(os.path.relpath(path, out_dir)).as_posix(), caption) if path is not None else note(missing)
    return section(title, body + "".join(map(note, notes)))


def write_comparison(comparison: Comparison, out_dir: str | os.PathLike[str], *, grid_queries: int = 4, grid_top_k: int = 6,
                     grid_seed: int | None = None, query_seed: int = 0) -> dict[str, Path]:
    """Write ``compare.csv`` (one row per group × metric), ``compare.md`` (:func:`markdown_tables`),
    ``figures/learning_curves.png``, ``figures/retrieval_rows.png`` (``grid_queries`` queries drawn with
    ``query_seed``, top ``grid_top_k`` of each group's first run, or of its run with ``train.seed =
    grid_seed``) and ``compare.html`` into ``out_dir``; returns the paths by name."""
    from rankopt.viz.comparison import plot_learning_curves_by_group

    c, out = comparison, Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": _write_csv(c, out / "compare.csv")}
    paths["md"] = out / "compare.md"
    paths["md"].write_text(markdown_tables(c), encoding="utf-8")

    main = _main_metrics(c.metrics)
    curve_notes: list[str] = []
    try:
        paths["learning_curves"] = plot_learning_curves_by_group(
            {g: [r.history for r in rs] for g, rs in c.groups.items()}, out / "figures" / "learning_curves.png",
            metrics=main, title_note=_title_note(c))
    except ValueError as err:
        curve_notes.append(f"no learning curves: {err}")
    grid, grid_notes = _retrieval_rows(c, out / "figures" / "retrieval_rows.png", num_queries=grid_queries, top_k=grid_top_k,
                                       grid_seed=grid_seed, query_seed=query_seed)
    if grid is not None:
        paths["retrieval_rows"] = grid
    sections = [_setup_section(c, out), _results_section(c)]
    if c.differences:
        sections.append(_differences_section(c))
    sections.append(_figure_section(
        "Learning curves", paths.get("learning_curves"), out,
        f"{', '.join(main)} and the training loss per epoch (metrics.json): mean over each group's runs, band ± one std.",
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
