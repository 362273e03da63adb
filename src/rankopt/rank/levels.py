"""Relevance of retrieved items from their hierarchy level (TPAMI §5, Eq. 20, Property 1, Eq. 23).

``levels`` is a ``(Q, R)`` integer tensor of shared hierarchy levels ``l in [0, L]``
(see :func:`rankopt.labels.relevance_levels`); ``valid`` marks the members of each
query's retrieval set (False for the query itself and for padding). Level-0
items (negatives) always get relevance 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def level_counts(levels: torch.Tensor, num_levels: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """``(Q, L + 1)`` float64: ``|Omega^(l)|``, the number of retrieval-set items at each level
    (the valid items' ones added into their level's column: one pass over the ``(Q, R)`` levels)."""
    ones = torch.ones_like(levels, dtype=torch.int32) if valid is None else valid.to(torch.int32)
    counts = torch.zeros(levels.shape[0], num_levels + 1, dtype=torch.int32, device=levels.device)
    return counts.scatter_add_(1, levels.long(), ones).to(torch.float64)


def relevance(
    levels: torch.Tensor,
    num_levels: int,
    valid: torch.Tensor | None = None,
    *,
    kind: str = "hap",
    alpha: float = 1.0,
    weights: Sequence[float] | None = None,
    counts: torch.Tensor | None = None,
) -> torch.Tensor:
    """Relevance ``rel(k)`` of every retrieved item, ``(Q, R)`` float64.

    * ``kind="hap"`` — TPAMI Eq. 20: ``rel(k) = (l/L)^alpha / |Omega^(l)|`` for ``k in Omega^(l)``.
      The per-level normalisation gives each level a total mass ``(l/L)^alpha``.
    * ``kind="sum_wap"`` — TPAMI Property 1: ``rel(k) = sum_{p<=l} w_p / |Omega^{+,p}|`` with
      ``Omega^{+,p}`` the items sharing at least ``p`` levels and ``sum_p w_p = 1``
      (uniform by default). H-AP with this relevance equals ``sum_l w_l AP^(l)``.

    ``counts`` (``(Q, L + 1)``, from :func:`level_counts`) may be given when the
    retrieval set is larger than the ``levels`` chunk passed here.
    """
    lv = levels.long()
    if counts is None:
        counts = level_counts(lv, num_levels, valid)
    counts = counts.to(torch.float64)
    level_idx = torch.arange(num_levels + 1, dtype=torch.float64, device=lv.device)
    if kind == "hap":
        mass = (level_idx / num_levels) ** alpha
        per_level = torch.where(counts > 0, mass / counts.clamp(min=1), torch.zeros_like(counts))
    elif kind == "sum_wap":
        w = (torch.full((num_levels,), 1.0 / num_levels, dtype=torch.float64) if weights is None
             else torch.as_tensor(weights, dtype=torch.float64))
        if w.numel() != num_levels or bool((w < 0).any()):
            raise ValueError(f"sum_wap needs {num_levels} non-negative weights, got {w.tolist()}")
        w = (w / w.sum()).to(lv.device)
        # |Omega^{+,p}| = number of items sharing at least p levels, p = 1..L
        at_least = counts.flip(-1).cumsum(-1).flip(-1)[:, 1:]
        term = torch.where(at_least > 0, w / at_least.clamp(min=1), torch.zeros_like(at_least))
        per_level = torch.cat([torch.zeros_like(counts[:, :1]), term.cumsum(-1)], dim=1)
    else:
        raise ValueError(f"unknown relevance kind {kind!r}; use 'hap' or 'sum_wap'")
    per_level[:, 0] = 0.0
    rel = torch.gather(per_level, 1, lv)
    if valid is not None:
        rel = rel * valid
    return rel


def ndcg_gains(levels: torch.Tensor, gains: str | Sequence[float] = "exp") -> torch.Tensor:
    """NDCG gain of each retrieved item (TPAMI §5.3): ``2^l - 1`` (``"exp"``), ``l`` (``"linear"``),
    or an explicit list ``[g_0, ..., g_L]`` indexed by level."""
    lv = levels.long()
    if isinstance(gains, str):
        if gains == "exp":
            return torch.pow(2.0, lv.to(torch.float64)) - 1.0
        if gains == "linear":
            return lv.to(torch.float64)
        raise ValueError(f"unknown gains {gains!r}; use 'exp', 'linear' or a list of per-level gains")
    table = torch.as_tensor(list(gains), dtype=torch.float64, device=lv.device)
    if int(lv.max()) >= table.numel():
        raise ValueError(f"gains list has {table.numel()} entries but levels go up to {int(lv.max())}")
    return table[lv]
