"""Binary (finest-level) retrieval metrics, per query, with pessimistic ranks.

Positives ``P`` of a query are the retrieval-set items with the same finest label
(column 0), the query itself excluded; ``R = |P|``. With ``rank`` the pessimistic
rank (see :mod:`rankopt.metrics.ranking`) and ``rank+(j) = #{k in P : s_k >= s_j}``:

* ``recall@k``      hit rate, ``1[min_{j in P} rank(j) <= k]`` (the field's "Recall@k").
* ``precision@k``   ``#{j in P : rank(j) <= k} / k``.
* ``true_recall@k`` ``#{j in P : rank(j) <= k} / min(k, R)`` (TPAMI Eq. 14).
* ``map@r``         ``(1/R) sum_{j in P, rank(j) <= R} rank+(j)/rank(j)`` (divided by R, as PML).
* ``map@k``         ``(1/min(R, k)) sum_{j in P, rank(j) <= k} rank+(j)/rank(j)`` (GLDv2 mAP@100).
* ``map``           ``(1/R) sum_{j in P} rank+(j)/rank(j)`` over the whole ranking (TPAMI Eq. 33).
* ``mrr``           ``1 / min_{j in P} rank(j)``.

Every function returns per-query float64 values, NaN where the query has no positive.
"""

from __future__ import annotations

import torch

from rankopt.metrics.ranking import tie_ends

AP_AT_CUT = ("map@r", "map@k")  # the families that sum rank+/rank over the positives within the cut-off


def topk_metrics(
    ranks: torch.Tensor, positive: torch.Tensor, num_pos: torch.Tensor, requests: list[tuple[str, str, int]]
) -> dict[str, torch.Tensor]:
    """Top-k metrics from ranked lists.

    ``ranks``: ``(Q, K)`` pessimistic ranks of the list items (see ``list_ranks``: non-decreasing
    along a list, so the items with ``rank <= k`` are a prefix of it, found by a binary search);
    ``positive``: ``(Q, K)`` bool; ``num_pos``: ``(Q,)`` ``R``; ``requests``: ``(name, family, k)``
    with ``k`` ignored for ``map@r``. The lists must reach one item beyond the deepest cut-off.
    Each metric is a prefix sum read at the prefix's end: positives for hits, ``rank+/rank`` over the
    positives for the mAPs.
    """
    has_pos = num_pos > 0
    num_pos = num_pos.to(torch.float64)
    hits_up_to = positive.to(torch.int64).cumsum(dim=1)
    if any(family in AP_AT_CUT for _, family, _ in requests):
        precision = (hits_up_to.gather(1, (ranks - 1).clamp(max=ranks.shape[1] - 1)).to(torch.float64)
                     / ranks.to(torch.float64))
        precision_up_to = torch.where(positive, precision, 0.0).cumsum(dim=1)
    out = {}
    for name, family, k in requests:
        cut = num_pos.to(torch.int64).unsqueeze(1) if family == "map@r" else torch.full_like(ranks[:, :1], k)
        length = torch.searchsorted(ranks.contiguous(), cut, right=True)  # (Q, 1) items with rank <= cut
        end = (length - 1).clamp(min=0)

        def at_end(prefix: torch.Tensor) -> torch.Tensor:
            return torch.where(length > 0, prefix.gather(1, end), 0).squeeze(1).to(torch.float64)

        value = _at_cut(family, k, at_end(hits_up_to), at_end(precision_up_to) if family in AP_AT_CUT else None,
                        num_pos)
        out[name] = torch.where(has_pos, value, torch.nan)
    return out


def _at_cut(family: str, k: int, hits: torch.Tensor, precision_sum: torch.Tensor | None,
            num_pos: torch.Tensor) -> torch.Tensor:
    """A cut-off family from the positives ranked within the cut-off: their number ``hits`` and, for
    :data:`AP_AT_CUT`, their ``sum rank+/rank`` (float64 ``(Q,)`` each; ``num_pos``: ``R``)."""
    if family == "recall":
        return (hits > 0).to(torch.float64)
    if family == "precision":
        return hits / k
    if family == "true_recall":
        return hits / num_pos.clamp(max=k)
    return precision_sum / (num_pos if family == "map@r" else num_pos.clamp(max=k))


def sorted_positive_scores(pos_scores: torch.Tensor, valid: torch.Tensor,
                           dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``(t, ok)``: each row's positives' scores in decreasing order, padding (``ok`` False) last, trimmed to the widest
    row."""
    t = pos_scores.masked_fill(~valid, float("-inf")).to(dtype)
    t, order = t.sort(dim=1, descending=True)
    ok = valid.gather(1, order)
    width = max(int(ok.sum(dim=1).max()), 1)
    return t[:, :width], ok[:, :width]


def from_positive_ranks(
    t: torch.Tensor, ok: torch.Tensor, ranks: torch.Tensor, requests: list[tuple[str, str, int]]
) -> dict[str, torch.Tensor]:
    """Every binary metric from the positives' ranks alone, no ranked list.

    ``t``/``ok``: ``(Q, P)`` the positives' scores, decreasing, padding (``ok`` False) last, as
    :func:`sorted_positive_scores`; ``ranks``: ``(Q, P)`` ``rank(j) = #{k in Omega : s_k >= t_j}``
    over the retrieval set; ``requests``: ``(name, family, k)``, any family of this module. Each
    metric above is a sum over the positives of a function of ``rank(j)`` and ``rank+(j)``, the
    cut-offs selecting the positives with ``rank(j) <= k``: ``O(Q P log P)``, whatever ``k``.
    """
    num_pos = ok.sum(dim=1).to(torch.float64)
    has_pos = num_pos > 0
    rank = ranks.to(torch.float64)
    rank_plus = (tie_ends(t) + 1).to(torch.float64)  # #{p : t_p >= t_j}: t decreases, padding (-inf) last
    precision = torch.where(ok, rank_plus / rank, 0.0)  # rank+(j) / rank(j) at each positive
    out = {}
    for name, family, k in requests:
        if family == "map":
            value = precision.sum(dim=1) / num_pos
        elif family == "mrr":
            value = 1.0 / rank[:, 0]
        else:
            within = ok & (rank <= (num_pos.unsqueeze(1) if family == "map@r" else float(k)))
            value = _at_cut(family, k, within.sum(dim=1).to(torch.float64),
                            torch.where(within, precision, 0.0).sum(dim=1), num_pos)
        out[name] = torch.where(has_pos, value, torch.nan)
    return out
