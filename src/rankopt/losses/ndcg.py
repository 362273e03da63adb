"""Sup-NDCG (TPAMI Eq. 24)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rankopt.losses.registry import LOSSES
from rankopt.losses.sup_ap import SupRankLoss
from rankopt.rank.levels import ndcg_gains


@LOSSES.register("sup_ndcg")
class SupNDCGLoss(SupRankLoss):
    """Sup-NDCG (TPAMI Eq. 24)::

        DCG_s = sum_{k in Omega^+} g(k) / log2(1 + rank^+(k) + rank_s^-(k)),   L = 1 - 1/M sum_i DCG_s / iDCG

    with gains ``g = 2^l - 1`` (``gains="exp"``; ``"linear"`` or a per-level list also accepted),
    ``rank^+`` over ``Omega_k^>=`` (exact) and iDCG the exact ideal DCG. An upper bound of
    ``1 - NDCG``. Labels ``(N, L)``, column 0 finest.
    """

    hierarchical = True
    accepts_relevance = True

    def __init__(self, *, gains: str | Sequence[float] = "exp", **kwargs) -> None:
        super().__init__(**kwargs)
        self.gains = gains if isinstance(gains, str) else tuple(float(g) for g in gains)

    def query_terms(self, scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor,
                    num_levels: int) -> torch.Tensor:
        pivots, rank_plus, rank_minus = self.ranks(scores, levels, valid, num_levels)
        gain = ndcg_gains(pivots.levels, self.gains).to(scores.dtype) * pivots.present
        # padding divides by log2(2) = 1: its ranks may be ~0, and 0 / log2(1) is a NaN (float32)
        dcg = (gain / torch.log2(torch.where(pivots.present, 1.0 + rank_plus + rank_minus, 2.0))).sum(1)
        ideal_rank = torch.arange(2, gain.shape[1] + 2, dtype=scores.dtype, device=scores.device)
        idcg = (gain.sort(dim=1, descending=True).values / torch.log2(ideal_rank)).sum(1)
        return 1.0 - dcg / idcg.clamp(min=torch.finfo(idcg.dtype).tiny)

    def extra_repr(self) -> str:
        return f"gains={self.gains!r}, " + super().extra_repr()
