"""Revisited Oxford / Paris evaluation (Radenović et al. 2018; the revisitop protocol).

``gnd[i]`` holds the database indices ``easy``, ``hard`` and ``junk`` of query ``i``.
Per protocol the positives (``ok``) and ignored items (``junk``) are

* Easy:   ok = easy,        junk = junk + hard
* Medium: ok = easy + hard, junk = junk
* Hard:   ok = hard,        junk = junk + easy

Junk items are removed from the ranking (each positive moves up by the number of junk
items ranked before it), then AP is the trapezoid rule of revisitop::

    AP = sum_j (P0_j + P1_j) / (2 n_ok),  P0_j = j / r_j (1 if r_j = 0),  P1_j = (j + 1) / (r_j + 1)

with ``j`` the 0-based index of the positive among positives and ``r_j`` its 0-based
position after junk removal. ``mP@k`` is revisitop's: ``#{positives at 1-based position
<= k'} / k'`` with ``k' = min(k, position of the last positive)``. Queries without positive are
skipped (counted). Scores are ranked in decreasing order with pessimistic ties (a positive
is placed after every item of equal score).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

PROTOCOLS = {
    "easy": (("easy",), ("junk", "hard")),
    "medium": (("easy", "hard"), ("junk",)),
    "hard": (("hard",), ("junk", "easy")),
}


def _masks(gnd: Sequence[Mapping[str, Sequence[int]]], keys: Sequence[str], num_db: int) -> torch.Tensor:
    mask = torch.zeros((len(gnd), num_db), dtype=torch.bool)
    for i, entry in enumerate(gnd):
        for key in keys:
            mask[i, torch.as_tensor(list(entry.get(key, ())), dtype=torch.long)] = True
    return mask


def _query_values(order: torch.Tensor, ok: torch.Tensor, junk: torch.Tensor,
                  kappas: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-query trapezoid AP ``(Q,)`` and mP@k ``(Q, len(kappas))`` for rankings ``order`` (NaN without positive)."""
    ok = ok.gather(1, order)
    junk = junk.gather(1, order) & ~ok
    position = (~junk).cumsum(dim=1) - 1  # 0-based position after junk removal
    r, j = position.to(torch.float64), (ok.cumsum(dim=1) - 1).to(torch.float64)  # j: index among positives
    p0 = torch.where(r == 0, 1.0, j / r.clamp(min=1))
    p1 = (j + 1) / (r + 1)
    num_ok = ok.sum(dim=1)
    ap = torch.where(ok, (p0 + p1) / 2, 0.0).sum(dim=1) / num_ok
    last = torch.where(ok, position + 1, 0).max(dim=1).values.unsqueeze(1)
    cut = last.clamp(max=torch.as_tensor(list(kappas)).unsqueeze(0))  # (Q, K)
    hits = ((position + 1).unsqueeze(1) <= cut.unsqueeze(2)) & ok.unsqueeze(1)
    prec = hits.sum(dim=2).to(torch.float64) / cut
    return ap, prec


def revisited_map(
    scores: torch.Tensor | None,
    gnd: Sequence[Mapping[str, Sequence[int]]],
    *,
    ranks: torch.Tensor | None = None,
    protocols: Sequence[str] = ("easy", "medium", "hard"),
    kappas: Sequence[int] = (1, 5, 10),
    chunk_size: int = 16,
) -> dict[str, float]:
    """mAP and mP@k per protocol: keys ``"{protocol}/map"``, ``"{protocol}/mp@{k}"`` and
    ``"{protocol}/num_queries_without_positive"``.

    Give ``scores`` ``(Q, N)`` (higher = more similar) or ``ranks`` ``(Q, N)`` (database indices
    per query, best first; note revisitop stores the transpose). Queries are processed
    ``chunk_size`` at a time, so large distractor sets (+1M) stay within memory.
    """
    if (scores is None) == (ranks is None):
        raise ValueError("give exactly one of scores (Q, N) or ranks (Q, N)")
    table = scores if scores is not None else ranks
    assert table is not None
    if table.ndim != 2 or table.shape[0] != len(gnd):
        raise ValueError(f"scores/ranks must have shape (len(gnd)={len(gnd)}, N), got {tuple(table.shape)}")
    if scores is not None and not bool(torch.isfinite(scores).all()):
        raise ValueError("scores contain NaN or Inf values")
    unknown = [p for p in protocols if p not in PROTOCOLS]
    if unknown:
        raise ValueError(f"unknown protocol(s) {unknown}; use {', '.join(PROTOCOLS)}")
    table = table.cpu()
    out: dict[str, float] = {}
    for protocol in protocols:
        ok_keys, junk_keys = PROTOCOLS[protocol]
        aps, precs = [], []
        for start in range(0, len(gnd), chunk_size):
            part, rows = gnd[start : start + chunk_size], table[start : start + chunk_size]
            ok, junk = _masks(part, ok_keys, table.shape[1]), _masks(part, junk_keys, table.shape[1])
            if scores is not None:
                by_ok = ok.to(torch.int8).argsort(dim=1, stable=True)  # positives last among ties
                order = by_ok.gather(1, rows.gather(1, by_ok).argsort(dim=1, descending=True, stable=True))
            else:
                order = rows.long()
            ap, prec = _query_values(order, ok, junk, kappas)
            aps.append(ap)
            precs.append(prec)
        ap, prec = torch.cat(aps), torch.cat(precs)
        has_ok = ~ap.isnan()
        out[f"{protocol}/map"] = float(ap[has_ok].mean()) if has_ok.any() else float("nan")
        for col, k in enumerate(kappas):
            out[f"{protocol}/mp@{k}"] = float(prec[has_ok, col].mean()) if has_ok.any() else float("nan")
        out[f"{protocol}/num_queries_without_positive"] = int((~has_ok).sum())
    return out
