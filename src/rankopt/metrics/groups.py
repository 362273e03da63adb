"""Per-query exclusion groups and per-category totals of :func:`rankopt.metrics.evaluate`.

Exclusion groups generalise the exclusion of a query's own item: each query and each reference
carries a group id (``-1``: none), and query ``i`` ignores every reference ``j`` with
``ref_groups[j] == query_groups[i] >= 0``, by index, as it ignores its own item: such a reference is
not ranked, not a positive and not counted in any retrieval-set size. open-metric-learning's
``sequence`` column is this rule (frames of one video never retrieve each other; OML's
``RetrievalResults`` ignores gallery items whose sequence id equals the query's, as it ignores the
query itself). The excluded set of query ``i`` is thus
``E_i = {own_i} ∪ {j : g_j = g_i >= 0}`` and its retrieval set ``Omega_i = {0..R-1} \\ E_i``.

Categories (OML's ``category``): every metric is averaged over the queries of each category as
well as over all of them, each query retrieving from the whole gallery (OML computes the retrieval
results once on the full gallery and reduces the per-query values by query category; the gallery is
never restricted to the category). A category's values therefore equal evaluating its queries alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def shared_counts(query_keys: torch.Tensor, ref_keys: torch.Tensor) -> torch.Tensor:
    """``(Q,)`` int64: ``#{j : ref_keys[j] == query_keys[i]}`` (keys ``(N,)`` or rows of ``(N, k)`` compared whole)."""
    _, inverse = torch.unique(torch.cat([query_keys, ref_keys]), dim=0, return_inverse=True)
    counts = torch.bincount(inverse[query_keys.shape[0] :], minlength=int(inverse.max()) + 1)
    return counts[inverse[: query_keys.shape[0]]]


class ExclusionGroups:
    """The group ids of the queries ``(Q,)`` and references ``(R,)`` (``-1``: none), on the metrics' device."""

    def __init__(self, query_groups: torch.Tensor, ref_groups: torch.Tensor) -> None:
        self.query, self.ref = query_groups, ref_groups

    def excluded_counts(self, q_fine: torch.Tensor, r_fine: torch.Tensor,
                        own: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(items, positives)``, both ``(Q,)``: the references of each query's group, and those sharing
        its finest label, leaving out its own item ``own`` (already excluded by index; ``-1``: none)."""
        grouped = self.query >= 0
        items = torch.where(grouped, shared_counts(self.query, self.ref), 0)
        same = shared_counts(torch.stack([self.query, q_fine], 1), torch.stack([self.ref, r_fine], 1))
        positives = torch.where(grouped, same, 0)
        if own is not None:
            mine = grouped & (own >= 0) & (self.ref[own.clamp(min=0)] == self.query)
            items -= mine.long()
            positives -= (mine & (r_fine[own.clamp(min=0)] == q_fine)).long()
        return items, positives

    def outside(self, idx: torch.Tensor, rows: slice | torch.Tensor) -> torch.Tensor:
        """``(rows, P)`` bool: whether each reference ``idx`` lies outside its query's group."""
        group = self.query[rows].unsqueeze(1)
        return (self.ref[idx] != group) | (group < 0)

    def exclude(self, scores: torch.Tensor, rows: slice, start: int = 0) -> torch.Tensor:
        """``scores`` (query rows ``rows`` x references ``[start, start + C)``) with each query's group
        scored ``-inf``, in place, so it sorts after every item of the retrieval set."""
        group = self.query[rows].unsqueeze(1)
        same = (self.ref[start : start + scores.shape[1]].unsqueeze(0) == group) & (group >= 0)
        return scores.masked_fill_(same, float("-inf"))


def category_codes(categories: Sequence[object], num_queries: int) -> tuple[list[str], torch.Tensor]:
    """``(names, codes)``: the sorted distinct category names (``str``) and each query's index in them
    (``-1`` for ``None``: the query counts in the overall values only)."""
    if isinstance(categories, (str, bytes)) or not hasattr(categories, "__len__"):
        raise TypeError(f"query_categories must be a sequence of names, one per query, got {type(categories).__name__}")
    if len(categories) != num_queries:
        raise ValueError(f"query_categories has {len(categories)} entries for {num_queries} queries (one name per "
                         "query, None: none)")
    text = [None if c is None else str(c) for c in categories]
    names = sorted({c for c in text if c is not None})
    position = {name: i for i, name in enumerate(names)}
    return names, torch.tensor([-1 if c is None else position[c] for c in text], dtype=torch.long)


class CategoryTotals:
    """Sums and counts of each metric's defined per-query values, per category."""

    def __init__(self, names: list[str], codes: torch.Tensor, metric_names: Sequence[str]) -> None:
        self.names, self.codes = names, codes
        self.sums = {m: torch.zeros(len(names), dtype=torch.float64) for m in metric_names}
        self.counts = {m: torch.zeros(len(names), dtype=torch.long) for m in metric_names}

    def add(self, name: str, values: torch.Tensor, rows: slice) -> None:
        """The values ``(n,)`` of metric ``name`` for the queries ``rows`` (NaN: undefined)."""
        values = values.detach().cpu()
        codes = self.codes[rows]
        keep = ~values.isnan() & (codes >= 0)
        size = len(self.names)
        self.sums[name] += torch.bincount(codes[keep], weights=values[keep].to(torch.float64), minlength=size)
        self.counts[name] += torch.bincount(codes[keep], minlength=size)

    def results(self, without_positive: torch.Tensor) -> dict[str, tuple[dict[str, float], int, int, dict[str, int]]]:
        """Per category: ``(metrics, num_queries, num_queries_without_positive, num_excluded)``;
        ``without_positive``: ``(Q,)`` bool."""
        size = len(self.names)
        known = self.codes >= 0
        queries = torch.bincount(self.codes[known], minlength=size)
        without = torch.bincount(self.codes[known & without_positive.cpu()], minlength=size)
        out = {}
        for c, category in enumerate(self.names):
            metrics = {m: float(self.sums[m][c]) / int(self.counts[m][c]) if self.counts[m][c] else math.nan
                       for m in self.sums}
            excluded = {m: int(queries[c] - self.counts[m][c]) for m in self.sums}
            out[category] = (metrics, int(queries[c]), int(without[c]), excluded)
        return out
