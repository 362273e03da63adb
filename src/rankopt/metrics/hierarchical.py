"""Hierarchical metrics from complete ranked lists (TPAMI §5, Eq. 18-20, 23, Property 1, Table VI, Sec. C-A1).

Inputs per query: the retrieval set sorted by decreasing score (``values``), the
relevance level ``l in [0, L]`` of each sorted item (number of shared hierarchy
levels) and the pessimistic ``rank`` (tied items all get the rank of the last of
their group). ``Omega^(l)``: items of level ``l``; ``Omega^+``: level ``>= 1``.

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

import torch

from rankopt.metrics.ranking import is_tie_end, tie_starts
from rankopt.rank.relevance import ndcg_gains, relevance


class RankedLevels:
    """Per-query ranked lists with the running level counts every metric shares.

    ``cums[l][q, p]``: number of level-``l`` items at list positions ``<= p``. The relevant
    items (level >= 1) are also gathered, in list order, into ``(Q, P)`` tensors
    (``P`` = most relevant items of a query; padding has level 0): their levels, ranks and
    ``at_rank[l]`` = number of level-``l`` items ranked at or before them (ties included),
    so that per-item work scales with the relevant items, not the gallery.
    """

    def __init__(self, values: torch.Tensor, levels: torch.Tensor, ranks: torch.Tensor, num_levels: int) -> None:
        self.values, self.levels, self.num_levels = values, levels, num_levels
        self.ranks = ranks.to(torch.float64)
        self.cums = torch.stack([torch.cumsum(levels == lv, dim=1, dtype=torch.int32) for lv in range(num_levels + 1)])
        self.counts = self.cums[:, :, -1].T.to(torch.float64)  # (Q, L + 1): |Omega^(l)|
        relevant = levels > 0
        self.width = max(int(relevant.sum(dim=1).max()), 1)
        slot = torch.where(relevant, torch.cumsum(relevant, dim=1) - 1, self.width)
        compact = torch.zeros(levels.shape[0], self.width + 1, dtype=torch.int64, device=levels.device)
        self.rel_levels = compact.scatter(1, slot, levels)[:, : self.width]
        rel_ranks = compact.scatter(1, slot, ranks)[:, : self.width]
        self.rel_ranks = rel_ranks.to(torch.float64)
        last = (rel_ranks - 1).clamp(min=0).unsqueeze(0).expand(num_levels + 1, -1, -1)
        self.at_rank = self.cums.gather(2, last)


def h_ap(r: RankedLevels, **relevance_kwargs: object) -> torch.Tensor:
    """H-AP (Eq. 19) per query; ``relevance_kwargs`` go to :func:`rankopt.rank.relevance.relevance`."""
    levels, num_levels = r.rel_levels, r.num_levels
    per_level = torch.arange(num_levels + 1, device=levels.device).expand(levels.shape[0], -1)
    table = relevance(per_level, num_levels, counts=r.counts, **relevance_kwargs)  # type: ignore[arg-type]  # (Q, L + 1)
    rel = table.gather(1, levels)
    h_rank = rel.clone()
    for lv in range(1, num_levels + 1):
        others = r.at_rank[lv] - (levels == lv).to(torch.int32)  # j != k
        h_rank += torch.minimum(rel, table[:, lv : lv + 1]) * others
    relevant = levels > 0
    total = (rel * relevant).sum(dim=1)
    value = torch.where(relevant, h_rank / r.rel_ranks, 0.0).sum(dim=1) / total
    return torch.where(total > 0, value, torch.nan)


def ap_at_level(r: RankedLevels, min_level: int) -> torch.Tensor:
    """Binary AP with positives ``level >= min_level >= 1`` (TPAMI Eq. 34): ``mean rank+/rank`` over positives."""
    positive = r.rel_levels >= min_level
    rank_plus = r.at_rank[min_level:].sum(dim=0).to(torch.float64)
    num_pos = r.counts[:, min_level:].sum(dim=1)
    value = torch.where(positive, rank_plus / r.rel_ranks, 0.0).sum(dim=1) / num_pos
    return torch.where(num_pos > 0, value, torch.nan)


def ndcg(r: RankedLevels, gains: str | Sequence[float] = "exp") -> torch.Tensor:
    """NDCG (Eq. 23) with pessimistic ranks; the ideal ranking sorts items by decreasing gain."""
    levels, device = r.levels, r.levels.device
    level_gain = ndcg_gains(torch.arange(r.num_levels + 1, device=device), gains)
    dcg = (level_gain[levels] / torch.log2(1.0 + r.ranks)).sum(dim=1)
    order = level_gain.argsort(descending=True, stable=True)
    positions = torch.arange(1, levels.shape[1] + 1, dtype=torch.float64, device=device)
    discount = torch.cat([torch.zeros(1, dtype=torch.float64, device=device), (1.0 / torch.log2(1.0 + positions)).cumsum(0)])
    sorted_counts = r.counts[:, order].long()
    end = sorted_counts.cumsum(dim=1)
    start = end - sorted_counts
    idcg = (level_gain[order] * (discount[end] - discount[start])).sum(dim=1)
    return torch.where(idcg > 0, dcg / idcg, torch.nan)


def asi(r: RankedLevels) -> torch.Tensor:
    """Average set intersection (Sec. C-A1) per query, ranks pessimistic; depths ``n <= P``."""
    width = r.width
    head = r.values[:, : width + 1]
    num = head.shape[0]
    n = torch.arange(1, width + 1, device=head.device).expand(num, width)
    # the items with rank <= n are the list prefix up to the last tie group ending at or before n
    ends_before = torch.where(is_tie_end(head)[:, :width], n - 1, tie_starts(head)[:, :width] - 1)
    has_prefix = ends_before >= 0
    ends_before = ends_before.clamp(min=0)
    num_pos = r.counts[:, 1:].sum(dim=1)
    above = torch.zeros(num, 1, dtype=torch.float64, device=head.device)
    inter = torch.zeros(num, width, dtype=torch.float64, device=head.device)
    for lv in range(r.num_levels, 0, -1):
        in_top = torch.where(has_prefix, r.cums[lv].gather(1, ends_before), 0)
        ideal = (n - above).clamp(min=0).minimum(r.counts[:, lv : lv + 1])
        inter += torch.minimum(in_top, ideal)
        above += r.counts[:, lv : lv + 1]
    value = torch.where(n <= num_pos.unsqueeze(1), inter / n, 0.0).sum(dim=1) / num_pos
    return torch.where(num_pos > 0, value, torch.nan)


def hierarchical_metrics(
    values: torch.Tensor,
    levels: torch.Tensor,
    ranks: torch.Tensor,
    num_levels: int,
    requests: list[tuple[str, str, int]],
    *,
    alpha: float = 1.0,
    weights: Sequence[float] | None = None,
    gains: str | Sequence[float] = "exp",
) -> dict[str, torch.Tensor]:
    """Per-query hierarchical metrics from complete ranked lists; ``requests``: ``(name, family, k)``."""
    r = RankedLevels(values, levels, ranks, num_levels)
    out = {}
    for name, family, k in requests:
        if family == "h-ap":
            out[name] = h_ap(r, kind="hap", alpha=alpha)
        elif family == "sum_wap":
            out[name] = h_ap(r, kind="sum_wap", weights=weights)
        elif family == "ap@level":
            out[name] = ap_at_level(r, num_levels - k)
        elif family == "ndcg":
            out[name] = ndcg(r, gains)
        elif family == "asi":
            out[name] = asi(r)
    return out
