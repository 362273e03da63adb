"""Hierarchical metrics from each query's relevant items (TPAMI §5, Eq. 18-20, 23, Property 1, Table VI, Sec. C-A1).

Inputs per query: its relevant items ``Omega^+`` (level ``l >= 1``: number of shared hierarchy
levels), their pessimistic ranks ``rank(k) = #{j in Omega : s_j >= s_k}`` among the whole
retrieval set ``Omega`` and the level sizes ``|Omega^(l)|``. Every metric below depends on the
level-0 items only through these ranks and ``|Omega^(0)|`` (NDCG with a gain ``g_0 != 0`` also
through their own ranks), so no ranked list of the whole gallery is built: the ranks come from
the row's scores sorted without indices (:class:`RankedLevels`).

* ``h-ap``     ``(1/sum_{k in Omega^+} rel(k)) sum_{k in Omega^+} H-rank+(k)/rank(k)`` (Eq. 19), with
  ``H-rank+(k) = rel(k) + sum_{j in Omega^+, j != k, s_j >= s_k} min(rel(k), rel(j))`` (Eq. 18)
  and ``rel(k) = (l/L)^alpha / |Omega^(l)|`` (Eq. 20, ``alpha`` default 1).
* ``sum_wap``  the same with the relevance of Property 1, equal to ``sum_l w_l AP^(l)`` (uniform ``w``).
* ``ap@level{c}``  binary AP whose positives share the label of column ``c`` (``c = 0`` finest),
  i.e. ``AP^(L-c)`` with positives ``level >= L - c`` (Eq. 34, TPAMI Table VI).
* ``ndcg``     ``DCG/iDCG``, ``DCG = sum_k g(l_k)/log2(1 + rank(k))`` (Eq. 23), gains ``2^l - 1`` by
  default; ``iDCG`` sorts the items by decreasing gain (no ties).
* ``asi``      ``(1/N) sum_{n=1}^{N} SI(n)``, ``N = |Omega^+|``, ``SI(n) = sum_{l>=1} min(#level-l items
  with rank <= n, #level-l items in the ideal top n) / n`` (Sec. C-A1).

Queries whose ``Omega^+`` (or positives at the level, or ideal gain) is empty get NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rankopt.metrics.ranking import ClassIndex, count_below, list_ranks, sorted_rows, tie_ends
from rankopt.rank.levels import ndcg_gains, relevance


class LevelIndex:
    """The references of each class of each label column, to list a query's relevant references.

    ``level(q, k) = #{c : label_c(k) = label_c(q)}``, so the relevant references of ``q`` are the union
    of its classes' members over the columns: ``O(sum_c |class_c(q)|)`` per query, no pass over the gallery.
    """

    def __init__(self, ref_labels: torch.Tensor) -> None:
        self.columns = [ClassIndex(ref_labels[:, c]) for c in range(ref_labels.shape[1])]
        self.labels = [ref_labels[:, c].contiguous() for c in range(ref_labels.shape[1])]

    def relevant(self, query_labels: torch.Tensor, exclude: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(idx, levels)``, both ``(Q, W)``: the references sharing a label column with each query and
        their level; each is listed once (under the first column it shares), padding has level 0.
        ``exclude``: ``(Q,)`` each query's own reference (``-1``: none), left out."""
        idx_parts, level_parts = [], []
        for c, classes in enumerate(self.columns):
            idx, valid = classes.members(query_labels[:, c], exclude)
            level = valid.to(torch.int64)  # shares column c
            for other, labels in enumerate(self.labels):
                if other != c:
                    shared = labels[idx] == query_labels[:, other : other + 1]
                    level += shared
                    if other < c:
                        valid &= ~shared  # listed under that earlier column
            idx_parts.append(idx)
            level_parts.append(level * valid)
        return torch.cat(idx_parts, dim=1), torch.cat(level_parts, dim=1)


def argsort_descending(x: torch.Tensor) -> torch.Tensor:
    """Positions sorting each row of ``x`` decreasingly, ties in any order (numpy's vectorised sort on
    CPU, faster than ``torch.sort`` there; measured: benchmarks/results/metrics.md); ``-inf`` last."""
    if x.device.type != "cpu":
        return x.argsort(dim=1, descending=True)
    return torch.from_numpy(np.argsort(-x.detach().numpy(), axis=1))


@dataclass
class RankedLevels:
    """Each query's relevant items in decreasing score order, with what every metric shares.

    ``levels``/``ranks``: ``(Q, P)`` (``P`` = most relevant items of a query; padding, last, has
    level 0): each item's level and pessimistic rank (int64) among the whole retrieval set;
    ``at_rank[l - 1]``: number of level-``l`` items ranked at or before each item (ties included);
    ``counts``: ``(Q, L + 1)`` float64 ``|Omega^(l)|``; ``ascending``: the ``(Q, R)`` score rows
    sorted increasingly (excluded items at ``-inf``), read by NDCG with ``g_0 != 0`` only.
    """

    levels: torch.Tensor
    ranks: torch.Tensor
    at_rank: torch.Tensor
    counts: torch.Tensor
    ascending: torch.Tensor
    num_levels: int

    @classmethod
    def from_scores(cls, scores: torch.Tensor, idx: torch.Tensor, levels: torch.Tensor, sizes: torch.Tensor,
                    num_levels: int) -> RankedLevels:
        """From a ``(Q, R)`` chunk of scores (excluded items at ``-inf``), the relevant references
        ``idx``/``levels`` of :meth:`LevelIndex.relevant` and the retrieval-set sizes ``(Q,)``:
        ``rank(k) = R - #{j : s_j < s_k}``, counted in the row sorted without indices."""
        rel_scores = scores.gather(1, idx).masked_fill(levels == 0, float("-inf"))
        order = argsort_descending(rel_scores)
        levels = levels.gather(1, order)
        width = max(int((levels > 0).sum(dim=1).max()), 1)
        levels, rel_scores = levels[:, :width], rel_scores.gather(1, order[:, :width])
        ascending = sorted_rows(scores)
        ranks = scores.shape[1] - count_below(ascending, rel_scores)
        end = tie_ends(rel_scores)
        at_rank = torch.stack([torch.cumsum(levels == lv, dim=1, dtype=torch.int32).gather(1, end)
                               for lv in range(1, num_levels + 1)])
        relevant = at_rank[:, :, -1].T.to(torch.float64)  # (Q, L): |Omega^(l)|, l >= 1
        counts = torch.cat([(sizes - relevant.sum(dim=1)).unsqueeze(1), relevant], dim=1)
        return cls(levels, ranks, at_rank, counts, ascending, num_levels)


def h_ap(r: RankedLevels, **relevance_kwargs: object) -> torch.Tensor:
    """H-AP (Eq. 19) per query; ``relevance_kwargs`` go to :func:`rankopt.rank.levels.relevance`."""
    levels, num_levels = r.levels, r.num_levels
    per_level = torch.arange(num_levels + 1, device=levels.device).expand(levels.shape[0], -1)
    # (Q, L + 1)
    table = relevance(per_level, num_levels, counts=r.counts, **relevance_kwargs)  # type: ignore[arg-type]
    rel = table.gather(1, levels)
    h_rank = rel.clone()
    for lv in range(1, num_levels + 1):
        others = r.at_rank[lv - 1] - (levels == lv).to(torch.int32)  # j != k
        h_rank += torch.minimum(rel, table[:, lv : lv + 1]) * others
    total = rel.sum(dim=1)  # padding (level 0) has rel 0, hence h_rank 0
    value = (h_rank / r.ranks.to(torch.float64)).sum(dim=1) / total
    return torch.where(total > 0, value, torch.nan)


def ap_at_level(r: RankedLevels, min_level: int) -> torch.Tensor:
    """Binary AP with positives ``level >= min_level >= 1`` (TPAMI Eq. 34): ``mean rank+/rank`` over positives."""
    positive = r.levels >= min_level
    rank_plus = r.at_rank[min_level - 1 :].sum(dim=0).to(torch.float64)
    num_pos = r.counts[:, min_level:].sum(dim=1)
    value = torch.where(positive, rank_plus / r.ranks.to(torch.float64), 0.0).sum(dim=1) / num_pos
    return torch.where(num_pos > 0, value, torch.nan)


def ndcg(r: RankedLevels, gains: str | Sequence[float] = "exp") -> torch.Tensor:
    """NDCG (Eq. 23) with pessimistic ranks; the ideal ranking sorts items by decreasing gain.

    The level-0 items add ``g_0 sum_{k in Omega^(0)} 1/log2(1 + rank(k))``, from the sorted rows, only when
    ``g_0 != 0``."""
    levels, device = r.levels, r.levels.device
    level_gain = ndcg_gains(torch.arange(r.num_levels + 1, device=device), gains)
    # [r]: log2(1 + r)
    log_rank = torch.log2(1.0 + torch.arange(r.ascending.shape[1] + 1, dtype=torch.float64, device=device))
    relevant_gain = torch.cat([torch.zeros(1, dtype=torch.float64, device=device), level_gain[1:]])
    dcg = (relevant_gain[levels] / log_rank[r.ranks]).sum(dim=1)
    if float(level_gain[0]) != 0.0:
        descending = r.ascending.flip(1)  # excluded items (-inf) last
        every = torch.where(descending > float("-inf"), 1.0 / log_rank[list_ranks(descending, complete=True)],
                            0.0).sum(dim=1)
        dcg += level_gain[0] * (every - torch.where(levels > 0, 1.0 / log_rank[r.ranks], 0.0).sum(dim=1))
    order = level_gain.argsort(descending=True, stable=True)
    discount = torch.cat([torch.zeros(1, dtype=torch.float64, device=device), (1.0 / log_rank[1:]).cumsum(0)])
    sorted_counts = r.counts[:, order].long()
    end = sorted_counts.cumsum(dim=1)
    start = end - sorted_counts
    idcg = (level_gain[order] * (discount[end] - discount[start])).sum(dim=1)
    return torch.where(idcg > 0, dcg / idcg, torch.nan)


def asi(r: RankedLevels) -> torch.Tensor:
    """Average set intersection (Sec. C-A1) per query, ranks pessimistic; depths ``n <= P``.

    ``#level-l items with rank <= n`` is the running sum of a per-level histogram of the ranks ``<= P``;
    the intersections are integers, divided by ``n`` once."""
    (num, width), num_levels, device = r.levels.shape, r.num_levels, r.levels.device
    bins = (r.levels - 1) * (width + 1) + r.ranks
    bins = torch.where((r.levels > 0) & (r.ranks <= width), bins, num_levels * (width + 1))  # last bin: not counted
    hist = torch.zeros(num, num_levels * (width + 1) + 1, dtype=torch.int32, device=device)
    hist.scatter_add_(1, bins, torch.ones_like(bins, dtype=torch.int32))
    in_top = hist[:, :-1].view(num, num_levels, width + 1).cumsum(dim=2)[:, :, 1:]  # (Q, L, P): depths 1..P
    n = torch.arange(1, width + 1, device=device)
    counts = r.counts.long()
    above = torch.zeros(num, 1, dtype=torch.int64, device=device)
    inter = torch.zeros(num, width, dtype=torch.int64, device=device)
    for lv in range(num_levels, 0, -1):
        ideal = (n - above).clamp(min=0).minimum(counts[:, lv : lv + 1])
        inter += torch.minimum(in_top[:, lv - 1], ideal)
        above += counts[:, lv : lv + 1]
    num_pos = r.counts[:, 1:].sum(dim=1)
    value = torch.where(n <= num_pos.unsqueeze(1), inter.to(torch.float64) / n, 0.0).sum(dim=1) / num_pos
    return torch.where(num_pos > 0, value, torch.nan)


def hierarchical_metrics(
    r: RankedLevels,
    requests: list[tuple[str, str, int]],
    *,
    alpha: float = 1.0,
    weights: Sequence[float] | None = None,
    gains: str | Sequence[float] = "exp",
) -> dict[str, torch.Tensor]:
    """Per-query hierarchical metrics from :class:`RankedLevels`; ``requests``: ``(name, family, k)``."""
    out = {}
    for name, family, k in requests:
        if family == "h-ap":
            out[name] = h_ap(r, kind="hap", alpha=alpha)
        elif family == "sum_wap":
            out[name] = h_ap(r, kind="sum_wap", weights=weights)
        elif family == "ap@level":
            out[name] = ap_at_level(r, r.num_levels - k)
        elif family == "ndcg":
            out[name] = ndcg(r, gains)
        elif family == "asi":
            out[name] = asi(r)
    return out
