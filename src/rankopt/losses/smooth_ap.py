"""Smooth-AP (Brown et al., ECCV 2020, Eq. 6-7)."""

from __future__ import annotations

import torch

from rankopt.losses.rank_loss import RankLoss
from rankopt.losses.registry import LOSSES
from rankopt.rank.surrogates import Pivots, sigmoid_sums


@LOSSES.register("smooth_ap")
class SmoothAPLoss(RankLoss):
    """Smooth-AP (Smooth-AP Eq. 6-7), the sigmoid ``G(t; tau)`` in both rank terms::

        rank(j)   = 1 + sum_{k in Omega, k != j} G(s_k - s_j)
        rank^+(j) = 1 + sum_{k in P,     k != j} G(s_k - s_j)
        L = 1 - 1/M sum_i 1/|P_i| sum_{j in P_i} rank^+(j) / rank(j)

    ``tau = 0.01``. Uses label column 0. Queries are excluded from their own
    retrieval set (the reference code counts them, ``include_self=True``).
    """

    accepts_relevance = True

    def __init__(self, *, tau: float = 0.01, **kwargs) -> None:
        super().__init__(**kwargs)
        if tau <= 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        self.tau = float(tau)

    def query_terms(self, scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor,
                    num_levels: int) -> torch.Tensor:
        pivots, rank, rank_plus = smooth_ranks(scores, levels, valid, self.tau)
        ratio = torch.where(pivots.present, rank_plus / rank, torch.zeros_like(rank))
        return 1.0 - ratio.sum(1) / pivots.present.sum(1).clamp(min=1)

    def extra_repr(self) -> str:
        return f"tau={self.tau}, " + super().extra_repr()


def smooth_ranks(scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor,
                 tau: float) -> tuple[Pivots, torch.Tensor, torch.Tensor]:
    """Smooth-AP's ``rank(j)`` and ``rank^+(j)`` (Smooth-AP Eq. 6) of each positive pivot, ``(C, P)``."""
    pivots = Pivots(scores, levels, valid)
    members = torch.eq(valid, True, out=scores.new_empty(valid.shape))  # 0/1 floats
    positives = torch.gt(levels, 0, out=scores.new_empty(valid.shape)).mul_(members)
    masks = torch.stack([members, positives], dim=1)
    sums = sigmoid_sums(scores, pivots.scores, masks, tau)
    # the pivot itself is in both masks with G(0) = 1/2: "1 + sum_{k != j}" = 1/2 + sum_k
    return pivots, 0.5 + sums[..., 0], 0.5 + sums[..., 1]
