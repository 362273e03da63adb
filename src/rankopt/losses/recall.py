"""Recall@k surrogates (TPAMI Eq. 15-17; Patel et al. CVPR 2022 for the sigmoid rank)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rankopt.losses.rank_loss import RankLoss
from rankopt.losses.registry import LOSSES
from rankopt.losses.smooth_ap import smooth_ranks
from rankopt.losses.sup_ap import SupRankLoss

DEFAULT_KS = (1, 2, 4, 8, 16)


def recall_terms(rank: torch.Tensor, present: torch.Tensor, ks: torch.Tensor, tau_star: float) -> torch.Tensor:
    """Per-query ``1 - mean_k 1/min(|P|, k) sum_{p in P} sigma((k - rank(p)) / tau*)`` (TPAMI Eq. 16), ``(C,)``."""
    num_pos = present.sum(1, keepdim=True).to(rank.dtype)
    hits = torch.sigmoid((ks.view(1, -1, 1) - rank.unsqueeze(1)) / tau_star) * present.unsqueeze(1)
    recall = hits.sum(2) / torch.minimum(num_pos, ks.view(1, -1)).clamp(min=1)
    return 1.0 - recall.mean(1)


class _RecallMixin:
    """Shared ``ks`` / ``tau_star`` handling of the recall surrogates."""

    def _init_recall(self, ks: Sequence[int], tau_star: float) -> None:
        ks = tuple(int(k) for k in ks)
        if not ks or min(ks) < 1:
            raise ValueError(f"ks must be a non-empty list of positive integers, got {ks}")
        if tau_star <= 0:
            raise ValueError(f"tau_star must be > 0, got {tau_star}")
        self.ks, self.tau_star = ks, float(tau_star)

    def _ks(self, like: torch.Tensor) -> torch.Tensor:
        return torch.tensor(self.ks, dtype=like.dtype, device=like.device)


@LOSSES.register("sup_recall")
class SupRecallLoss(_RecallMixin, SupRankLoss):
    """Sup-R@k (TPAMI Eq. 16) averaged over ``ks``::

        L = 1 - mean_k 1/min(|P|, k) sum_{p in P} sigma((k - rank^+(p) - rank_s^-(p)) / tau*)

    ``ks = (1, 2, 4, 8, 16)``, ``tau* = 1``; SupRank rank as in :class:`SupRankLoss`. Label column 0.
    """

    def __init__(self, *, ks: Sequence[int] = DEFAULT_KS, tau_star: float = 1.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self._init_recall(ks, tau_star)

    def query_terms(self, scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor,
                    num_levels: int) -> torch.Tensor:
        pivots, rank_plus, rank_minus = self.ranks(scores, levels, valid, num_levels)
        return recall_terms(rank_plus + rank_minus, pivots.present, self._ks(scores), self.tau_star)

    def extra_repr(self) -> str:
        return f"ks={self.ks}, tau_star={self.tau_star}, " + super().extra_repr()


@LOSSES.register("smooth_recall")
class SmoothRecallLoss(_RecallMixin, RankLoss):
    """Smooth-R@k: TPAMI Eq. 16 with Smooth-AP's sigmoid rank ``rank(p) = 1 + sum_{j != p} sigma((s_j - s_p) / tau)``
    (Patel et al.; ``tau = 0.01``, ``tau* = 1``, ``ks = (1, 2, 4, 8, 16)``). Unlike Patel's code the
    numerator is not clipped at ``k`` and the query is not counted in its ranking. Label column 0.
    """

    def __init__(self, *, tau: float = 0.01, ks: Sequence[int] = DEFAULT_KS, tau_star: float = 1.0, **kwargs) -> None:
        super().__init__(**kwargs)
        if tau <= 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        self.tau = float(tau)
        self._init_recall(ks, tau_star)

    def query_terms(self, scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor,
                    num_levels: int) -> torch.Tensor:
        pivots, rank, _ = smooth_ranks(scores, levels, valid, self.tau)
        return recall_terms(rank, pivots.present, self._ks(scores), self.tau_star)

    def extra_repr(self) -> str:
        return f"tau={self.tau}, ks={self.ks}, tau_star={self.tau_star}, " + super().extra_repr()
