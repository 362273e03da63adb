"""The figures of ``rankopt compare``: which metrics the learning curves show and the retrieval rows (the same
queries, one row per group, from each group's ``retrieval.npz``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rankopt.layout import RETRIEVAL_NPZ
from rankopt.report.compare import Comparison, RunRecord, value_text

if TYPE_CHECKING:
    from rankopt.viz.comparison import GroupNeighbours

__all__ = ["MAIN_METRICS", "main_metrics", "retrieval_rows", "synthetic_note"]

MAIN_METRICS = ("recall@1", "map@r")
"""Metrics drawn as learning curves when the runs have them (else the first two compared)."""


def main_metrics(metrics: Sequence[str]) -> list[str]:
    """The :data:`MAIN_METRICS` among ``metrics``, else the first two."""
    chosen = [m for m in MAIN_METRICS if m in metrics]
    return chosen or list(metrics[:2])


def synthetic_note(c: Comparison) -> str | None:
    """The figures' title note when every run is on synthetic data."""
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
            arrays = {k: npz[k]
                      for k in ("query_paths", "query_labels", "ref_paths", "ref_labels", "neighbours", "scores")}
    except (OSError, ValueError, KeyError) as err:
        raise ValueError(f"{path} is corrupt: {err}") from err
    labels = [a.reshape(len(a), -1) for a in (arrays["query_labels"], arrays["ref_labels"])]
    return _Retrieval({str(p): i for i, p in enumerate(arrays["query_paths"])}, labels[0], arrays["ref_paths"],
                      labels[1],
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
    # torch and matplotlib (slow imports) only here: rankopt.report reads run folders without them
    import torch

    from rankopt.labels import relevance_levels
    from rankopt.viz.comparison import GroupNeighbours

    nb = r.neighbours[rows, :k]
    levels = np.stack([relevance_levels(torch.from_numpy(r.query_labels[i : i + 1]),
                                        torch.from_numpy(r.ref_labels[n]))[0].numpy()
                       for i, n in zip(rows, nb, strict=True)])
    return GroupNeighbours(label, [[str(p) for p in r.ref_paths[n]] for n in nb], levels, r.scores[rows, :k])


def retrieval_rows(c: Comparison, out_path: Path, *, num_queries: int, top_k: int, grid_seed: int | None,
                   query_seed: int) -> tuple[Path | None, list[str]]:
    """Draw the same ``num_queries`` query paths (drawn with ``query_seed`` among those every group's
    retrieval.npz holds; else among the first group's) for each group; returns the figure (None
    when no group has a retrieval.npz) and notes on the groups left out."""
    from rankopt.viz.comparison import plot_retrieval_rows  # matplotlib (slow import): only when the figure is drawn

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
    notes += [f"{g}: its {RETRIEVAL_NPZ} lacks the drawn queries (another evaluation "
              "set)" for g in loaded if g not in kept]
    k = min(top_k, *(r.neighbours.shape[1] for _, r in kept.values()))
    leaf = c.pair_by.rsplit(".", 1)[-1]
    groups = [_group_neighbours(f"{g} ({leaf} {value_text(run.value(c.pair_by))})", r,
                                [r.query_rows[q] for q in queries], k)
              for g, (run, r) in kept.items()]
    titles = [f"{Path(q).parent.name}/{Path(q).name}\nclass {int(first.query_labels[first.query_rows[q], 0])}"
              for q in queries]
    path = plot_retrieval_rows(out_path, queries, groups, num_levels=int(first.query_labels.shape[1]),
                               level_names=first_run.report.get("data", {}).get("level_names"), query_titles=titles,
                               title_note=synthetic_note(c))
    return path, notes
