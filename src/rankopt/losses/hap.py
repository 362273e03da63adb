"""Sup-H-AP (TPAMI Eq. 21 / HAPPIER): hierarchical AP with the SupRank rank."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rankopt.losses.registry import LOSSES
from rankopt.losses.sup_ap import SupRankLoss
from rankopt.rank.levels import level_counts, relevance
from rankopt.rank.surrogates import pairwise_step_counts


@LOSSES.register("hap")
class HAPLoss(SupRankLoss):
    """Sup-H-AP (TPAMI Eq. 21)::

        H-rank^+(k) = rel(k) + sum_{j in Omega^+, j != k} min(rel(k), rel(j)) H(s_j - s_k)   (Eq. 18)
        L = 1 - 1/M sum_i 1/sum_{k in Omega_i^+} rel(k) sum_{k in Omega_i^+} H-rank^+(k) / (rank^+(k) + rank_s^-(k))

    ``rel`` is TPAMI Eq. 20, ``(l/L)^alpha / |Omega^(l)|`` (``relevance="hap"``, ``alpha = 1``),
    or the ΣwAP relevance of Property 1 (``relevance="sum_wap"``, optional level ``weights``).
    ``rel`` depends only on the level, so the sum in Eq. 18 is ``sum_m min(rel(k), rel_m) N_m(k)`` with
    ``N_m(k)`` the level-``m`` items scored ``>= s_k``, summed with ``rank^+`` in one walk of the sorted pivots
    (:func:`~rankopt.rank.surrogates.level_step_sums`).
    Labels ``(N, L)``, column 0 finest; 1-D labels give exactly Sup-AP.
    """

    hierarchical = True
    accepts_relevance = True

    def __init__(self, *, alpha: float = 1.0, relevance: str = "hap", weights: Sequence[float] | None = None,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        if relevance not in ("hap", "sum_wap"):
            raise ValueError(f"unknown relevance {relevance!r}; use 'hap' or 'sum_wap'")
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        self.alpha, self.relevance, self.weights = float(alpha), relevance, None if weights is None else tuple(weights)

    def query_terms(self, scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor,
                    num_levels: int) -> torch.Tensor:
        # rel(k) depends on the query and the level only: rel_of_level[c, m] for m = 0..L (0 for level 0)
        of_level = torch.arange(num_levels + 1, device=levels.device).expand(levels.shape[0], num_levels + 1)
        counts = level_counts(levels, num_levels, valid)
        rel_of_level = relevance(of_level, num_levels, kind=self.relevance, alpha=self.alpha, weights=self.weights,
                                 counts=counts)
        if self.step_counts == "pairwise":
            pivots, rank_plus, rank_minus = self.ranks(scores, levels, valid, num_levels)
        else:  # sum_m min(rel(k), rel_m) #{j : l_j = m, s_j >= s_k}, k itself giving rel(k): in the walk of rank^+
            # (C, L + 1, L, 1)
            shared = torch.minimum(rel_of_level.unsqueeze(2), rel_of_level[:, 1:].unsqueeze(1)).unsqueeze(3)
            pivots, sums, rank_minus = self.ranks(scores, levels, valid, num_levels, weights=shared)
            rank_plus, h_rank_plus = sums.unbind(2)
        rel = torch.gather(rel_of_level.to(scores.dtype), 1, pivots.levels)  # 0 for padding (level 0)
        if self.step_counts == "pairwise":
            shared = torch.minimum(rel.unsqueeze(1), rel.unsqueeze(2)) * pivots.pair_mask()
            h_rank_plus = rel + pairwise_step_counts(pivots.scores, pivots.scores, shared)
        # padding divides by 1: a 0 / 0 there, even unselected by a where, would give a NaN gradient
        ratio = h_rank_plus * pivots.present / torch.where(pivots.present, rank_plus + rank_minus,
                                                           torch.ones_like(rank_minus))
        return 1.0 - ratio.sum(1) / rel.sum(1).clamp(min=torch.finfo(rel.dtype).tiny)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, relevance={self.relevance!r}, " + super().extra_repr()
