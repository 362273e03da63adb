"""Precision-recall curves (per hierarchy level) and training curves."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from pathlib import Path

import numpy as np
import torch

from rankopt.viz._common import (ArrayLike, new_figure, note_few_points, retrieval_inputs, sample_indices, save_figure,
                                 score_chunks, titled)
from rankopt.viz.pictures import column_name

PANEL_INCHES = (6.0, 4.5)
"""Size of one panel; the PR figure is one panel, training curves one panel per group (loss, learning rate, metrics)."""
_BOOKKEEPING = frozenset({"epoch", "step", "iteration", "time", "seconds"})


@dataclass(frozen=True)
class PRCurve:
    """Mean interpolated precision at fixed recall levels, over the queries with a positive."""

    name: str
    recall: np.ndarray
    precision: np.ndarray
    num_queries: int
    num_queries_without_positive: int

    @property
    def interpolated_ap(self) -> float:
        """``len(recall)``-point interpolated AP (11-/101-point AP of PASCAL/COCO)."""
        return float(self.precision.mean())


def _interpolated_precision(sorted_scores: torch.Tensor, positive: torch.Tensor,
                            grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query: ``p_interp(r) = max {P(t) : R(t) >= r}`` over score thresholds ``t``.

    ``sorted_scores`` is ``(q, R)`` decreasing, ``positive`` the matching relevance mask.
    The operating points are the distinct finite scores (the ends of tie groups), so
    tied items enter together: the pessimistic tie convention of rankopt. Returns the
    ``(q, len(grid))`` interpolated precisions and the ``(q,)`` mask of queries with a positive.
    """
    tp = positive.to(torch.float64).cumsum(dim=1)
    num_pos = tp[:, -1:]
    retrieved = torch.arange(1, sorted_scores.shape[1] + 1, dtype=torch.float64)
    group_end = torch.ones_like(positive)
    group_end[:, :-1] = sorted_scores[:, :-1] != sorted_scores[:, 1:]
    operating = group_end & torch.isfinite(sorted_scores)
    precision = torch.where(operating, tp / retrieved, 0.0)
    best_after = precision.flip(1).cummax(dim=1).values.flip(1)
    recall = tp / num_pos.clamp(min=1)
    first = torch.searchsorted(recall.contiguous(), grid.expand(recall.shape[0], -1).contiguous())
    return best_after.gather(1, first.clamp(max=recall.shape[1] - 1)), num_pos[:, 0] > 0


def precision_recall(
    query_embeddings: ArrayLike,
    query_labels: ArrayLike,
    ref_embeddings: ArrayLike | None = None,
    ref_labels: ArrayLike | None = None,
    *,
    similarity: str = "cosine",
    num_points: int = 101,
    max_queries: int | None = None,
    seed: int = 0,
    level_names: Sequence[str] | None = None,
) -> list[PRCurve]:
    """Mean interpolated precision-recall curve, one per label level (finest first).

    For label column ``c`` of ``L`` the positives of a query are the references sharing
    its labels at column ``c`` and coarser (relevance level ``>= L - c``). Precision at
    recall ``r`` is interpolated, ``max_{r' >= r} P(r')``, at ``num_points`` recall levels
    in ``[0, 1]``, then averaged over the queries with a positive (others are counted).
    ``ref_embeddings=None``: the queries are the gallery, each excluded from its own
    results by index. ``max_queries`` draws that many queries with ``seed``.
    """
    if num_points < 2:
        raise ValueError(f"num_points must be >= 2, got {num_points}")
    data = retrieval_inputs(query_embeddings, query_labels, ref_embeddings, ref_labels, similarity)
    num_levels = data.num_levels
    grid = torch.arange(num_points, dtype=torch.float64) / (num_points - 1)
    sums = torch.zeros(num_levels, num_points, dtype=torch.float64)
    counts = torch.zeros(num_levels, dtype=torch.long)
    queries = sample_indices(data.query.shape[0], max_queries, seed)
    for scores, levels in score_chunks(data, queries):
        sorted_scores, order = torch.sort(scores, dim=1, descending=True)
        sorted_levels = levels.gather(1, order)
        for column in range(num_levels):
            interp, has_pos = _interpolated_precision(sorted_scores, sorted_levels >= num_levels - column, grid)
            sums[column] += interp[has_pos].sum(dim=0)
            counts[column] += int(has_pos.sum())
    curves = []
    for column in range(num_levels):
        n = int(counts[column])
        mean = (sums[column] / n).numpy() if n else np.full(num_points, np.nan)
        curves.append(PRCurve(column_name(column, level_names), grid.numpy(), mean, n, queries.numel() - n))
    return curves


def plot_pr_curves(curves: Sequence[PRCurve], out_path: str | Path, *, title_note: str | None = None) -> Path:
    """Plot :func:`precision_recall` curves; the legend gives each interpolated AP and query count."""
    if not curves:
        raise ValueError("curves is empty: nothing to plot")
    fig = new_figure(*PANEL_INCHES)
    ax = fig.add_subplot()
    for curve in curves:
        label = f"{curve.name}: interp. AP {curve.interpolated_ap:.3f} ({curve.num_queries} queries)"
        ax.plot(curve.recall, curve.precision, label=label, linewidth=1.8)
    ax.set(xlim=(0, 1), ylim=(0, 1.02), xlabel="recall", ylabel="mean interpolated precision")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_title(titled("Precision-recall per label level", title_note), fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_path)


def _history_series(history: Sequence[Mapping[str, object]]) -> tuple[np.ndarray, str, dict[str, np.ndarray]]:
    """x values (``epoch`` when every entry has one) and one float series per numeric key (NaN where missing)."""
    if isinstance(history, Mapping) or not isinstance(history, Sequence) or len(history) == 0:
        raise ValueError("history must be a non-empty list of dicts, one per evaluation")
    bad = [i for i, h in enumerate(history) if not isinstance(h, Mapping)]
    if bad:
        raise TypeError(f"history entries must be dicts; entries {bad[:5]} are not")

    def number(value: object) -> float:
        return float(value) if isinstance(value, Real) and not isinstance(value, bool) else math.nan

    keys = list(dict.fromkeys(k for h in history for k, v in h.items() if _group(k) and not math.isnan(number(v))))
    if not keys:
        raise ValueError("history has no numeric metric to plot")
    has_epoch = all(not math.isnan(number(h.get("epoch"))) for h in history)
    x = np.array([number(h["epoch"]) for h in history] if has_epoch else range(1, len(history) + 1), dtype=float)
    series = {k: np.array([number(h.get(k)) for h in history]) for k in keys}
    return x, "epoch" if has_epoch else "evaluation", series


def _group(key: str) -> str | None:
    """Panel of a history key: ``loss``, ``learning rate`` (``lr*``), ``metrics``; None for bookkeeping."""
    k = key.lower()
    if k in _BOOKKEEPING or k.startswith("num_"):
        return None
    return "loss" if "loss" in k else "learning rate" if k.startswith("lr") else "metrics"


def plot_training_curves(history: Sequence[Mapping[str, object]], out_path: str | Path, *,
                         title_note: str | None = None) -> Path:
    """One line per numeric key of ``history`` (``[{"epoch": 1, "loss": ..., "recall@1": ...}, ...]``),
    one panel per group: losses, learning rates (``lr*``), metrics. Bookkeeping keys
    (``epoch``, ``step``, ``num_*``, times) are not plotted; missing or NaN values leave gaps. Markers
    at the evaluations; a panel says so when a line has fewer than ``MIN_CURVE_POINTS`` of them."""
    x, xlabel, series = _history_series(history)
    groups: dict[str, dict[str, np.ndarray]] = {}
    for key, values in series.items():
        groups.setdefault(str(_group(key)), {})[key] = values
    groups = {name: groups[name] for name in ("loss", "learning rate", "metrics") if name in groups}
    fig = new_figure(PANEL_INCHES[0] * len(groups), PANEL_INCHES[1])
    for ax, (name, group) in zip(fig.subplots(1, len(groups), squeeze=False)[0], groups.items(), strict=True):
        for key, values in group.items():
            ax.plot(x, values, marker="o", markersize=4, label=key)
        ax.set(xlabel=xlabel, ylabel=name)
        note_few_points(ax, min(int(np.isfinite(v).sum()) for v in group.values()))
        ax.set_title(titled(f"Training {name}", title_note), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out_path)
