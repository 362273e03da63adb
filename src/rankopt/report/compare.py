"""``rankopt compare``: group finished runs by config keys, summarize each metric over the seeds
of a group, and test each group against a baseline with differences paired by seed.

Metrics are the runs' *last* evaluation (``report.json["trained"]``), never the best epoch,
which is chosen on the evaluation split and so biased upwards.

The outputs are written by :func:`rankopt.report.compare_page.write_comparison` (the Markdown and CSV in
:mod:`rankopt.report.compare_text`, the figures in :mod:`rankopt.report.compare_figures`).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankopt.layout import CONFIG_YAML, METRICS_JSON, REPORT_JSON, RETRIEVAL_NPZ
from rankopt.report.run_reader import RunFolder, is_finite, metric_names, read_run
from rankopt.report.stats import PairedDifference, Summary, paired_difference, summarize

__all__ = ["MISSING", "Comparison", "Pairing", "RunRecord", "UnfinishedRunError", "compare_runs", "load_run",
           "value_text"]

MISSING = object()
"""The value of a config key a run does not have."""


class UnfinishedRunError(FileNotFoundError):
    """A run folder without ``report.json``: still training, or interrupted."""


@dataclass
class RunRecord(RunFolder):
    """One finished run folder (:class:`rankopt.report.run_reader.RunFolder`: config as a nested
    dict, report.json, metrics.json history, ...) and the path of its ``retrieval.npz`` (None when absent)."""

    retrieval: Path | None = None

    @property
    def name(self) -> str:
        return self.path.name

    def value(self, key: str) -> Any:
        """The config value at dotted ``key`` (e.g. ``loss.kwargs.lam``); ``MISSING`` when absent."""
        return self.setting(key, MISSING)

    def metric(self, name: str) -> float:
        """``report.json["trained"][name]``, checked to be a finite number."""
        value = self.report["trained"].get(name, MISSING)
        if value is MISSING:
            raise ValueError(f"{self.path / REPORT_JSON}: no metric {name!r} in 'trained' "
                             f"(has: {', '.join(metric_names([self.report['trained']]))})")
        if not is_finite(value):
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
    if not isinstance(folder.report.get("trained"), dict) or not metric_names([folder.report["trained"]]):
        raise ValueError(f"{path / REPORT_JSON} is corrupt: no 'trained' metrics (the last evaluation)")
    retrieval = path / RETRIEVAL_NPZ
    return RunRecord(**vars(folder), retrieval=retrieval if retrieval.is_file() else None)


def value_text(value: Any) -> str:
    """A config value as text: strings as they are, :data:`MISSING` as ``unset``, others as JSON."""
    if value is MISSING:
        return "unset"
    if isinstance(value, str):
        return value
    return json.dumps(value)


def _sort_key(value: Any) -> tuple[int, float, str]:
    """Numbers in numeric order, then text, then unset."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value), "")
    return (2, 0.0, "") if value is MISSING else (1, 0.0, value_text(value))


def _check_key(runs: Sequence[RunRecord], key: str, option: str) -> None:
    if all(run.value(key) is MISSING for run in runs):
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
            if (value := run.value(key)) is not MISSING:
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
        return {g: sorted({value_text(r.value(key)) for r in runs}, key=lambda t: _sort_key(_parse(t)))
                for g, runs in self.groups.items()}


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _group_label(run: RunRecord, keys: Sequence[str]) -> str:
    """The value of the one key, or ``leaf=value`` pairs (full keys where leaves collide) for several."""
    if len(keys) == 1:
        return value_text(run.value(keys[0]))
    leaves = [k.rsplit(".", 1)[-1] for k in keys]
    names = leaves if len(set(leaves)) == len(leaves) else list(keys)
    return ", ".join(f"{n}={value_text(run.value(k))}" for n, k in zip(names, keys, strict=True))


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
        names = [m for m in metric_names([runs[0].report["trained"]]) if all(m in r.report["trained"] for r in runs)]
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
                m: paired_difference([values[a.path][m] for a, _ in pairing.pairs],
                                     [values[b.path][m] for _, b in pairing.pairs],
                                     confidence=confidence) if pairing.pairs else None
                for m in names}
    return Comparison(tuple(runs), tuple(skipped), keys, baseline, pair_by, confidence, tuple(names), groups,
                      summaries, pairings, differences)
