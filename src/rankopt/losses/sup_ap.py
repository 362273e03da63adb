"""SupRank losses: the shared rank machinery and Sup-AP (ROADMAP Eq. 5 = TPAMI Eq. 11)."""

from __future__ import annotations

import torch

from rankopt.losses.base import RankLoss, RetrievalSet
from rankopt.losses.registry import LOSSES
from rankopt.rank.surrogates import (
    SUM_METHODS,
    Pivots,
    compiled_sums,
    default_delta,
    has_lower_item,
    level_step_sums,
    lowest_levels,
    positive_rank_weights,
    row_counts,
    sup_negative_rank,
)

STEP_COUNTS = ("sorted", "pairwise")
"""How the exact step parts are counted: ``"sorted"`` (each row's pivots sorted once, per-level
suffix sums; only pivots with a less relevant item enter the ``H^-`` kernel) or ``"pairwise"``
(``P^2`` comparisons per query, every pivot through the kernel: the previous path, kept as the reference)."""


class SupRankLoss(RankLoss):
    """Base of the SupRank losses: ``rank(k) = rank^+(k) + rank_s^-(k)`` with the exact step in
    ``rank^+`` (no gradient) and ``H^-`` (TPAMI Eq. 4, :func:`~rankopt.rank.surrogates.sup_step`)
    in ``rank_s^-`` (TPAMI Eq. 5). Defaults: ``tau = 0.01``, ``rho = 100``,
    ``delta = tau ln((1 - eps) / eps)`` with ``eps = 1e-2`` (~0.0459), ``start = 0.5``.
    ``step_counts``: one of :data:`STEP_COUNTS` (same values and gradients; ``"sorted"`` costs
    ``O(P log P + P L + A M)`` per query for ``A`` pivots with a less relevant item, ``"pairwise"`` ``O(P^2 + P M)``).
    ``method``: how the ``H^-`` sums are evaluated (:data:`~rankopt.rank.surrogates.SUM_METHODS`:
    ``"compiled"`` one numba pass each way on CPU, ``"torch"`` dense, the reference; same values and gradients).
    """

    def __init__(
        self, *, tau: float = 0.01, rho: float = 100.0, delta: float | None = None, start: float = 0.5, step_counts: str = "sorted",
        method: str = "auto", **kwargs
    ) -> None:
        super().__init__(**kwargs)
        if tau <= 0 or rho < 0:
            raise ValueError(f"need tau > 0 and rho >= 0, got tau={tau}, rho={rho}")
        if step_counts not in STEP_COUNTS:
            raise ValueError(f"unknown step_counts {step_counts!r}; use one of {', '.join(STEP_COUNTS)}")
        if method not in SUM_METHODS:
            raise ValueError(f"unknown method {method!r}; use one of {', '.join(SUM_METHODS)}")
        self.tau, self.rho, self.start, self.step_counts, self.method = float(tau), float(rho), float(start), step_counts, method
        self.delta = default_delta(tau) if delta is None else float(delta)
        if self.delta < 0:
            raise ValueError(f"delta must be >= 0, got {delta}")

    def elements_per_row(self, batch: RetrievalSet) -> int:
        """``"sorted"``: ``max(A_i, L) * M`` with ``A_i`` the query's pivots entering the ``H^-`` kernel, for the
        ``(C, A, M)`` blocks of the torch sums; the compiled sums build none, and a row's largest intermediates are
        its ``G <= L`` lower-level masks and its 8-byte ``(M,)`` factors and ``(P,)`` pivot indices: ``max(L, 2) * M``."""
        if self.step_counts == "pairwise":
            return super().elements_per_row(batch)
        if compiled_sums(self.method, batch.scores):
            return max(2, batch.num_levels) * batch.scores.shape[1]
        active = int(row_counts(has_lower_item(batch.levels, batch.valid)).max())
        return max(1, active, batch.num_levels) * batch.scores.shape[1]

    def ranks(
        self, scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor, num_levels: int, weights: torch.Tensor | None = None
    ) -> tuple[Pivots, torch.Tensor, torch.Tensor]:
        """The positives of each row with their exact ``rank^+`` and smooth ``rank_s^-``, ``(C, P)``. ``weights``
        (``"sorted"`` only, ``(C, L + 1, L, Q)``): ``rank^+`` comes as ``(C, P, 1 + Q)``, followed by the
        :func:`~rankopt.rank.surrogates.level_step_sums` of these weights, all from one walk of the sorted pivots."""
        pivots = Pivots(scores, levels, valid)
        kernel = dict(tau=self.tau, rho=self.rho, delta=self.delta, start=self.start, method=self.method)
        if self.step_counts == "pairwise":
            if weights is not None:
                raise ValueError("step sums with weights need step_counts='sorted'")
            masks, group = pivots.lower_masks(levels, valid, num_levels)
            return pivots, pivots.pairwise_positive_rank(), sup_negative_rank(scores, pivots, masks, group, **kernel)
        lowest = lowest_levels(levels, valid)
        # no active pivot is at a level <= the chunk's lowest level: the masks below it are left out
        masks, group = pivots.lower_masks(levels, valid, num_levels, first=min(int(lowest.min()), num_levels - 1))
        active = (pivots.levels > lowest) & pivots.present  # has_lower_item of the pivots (valid items, level > 0)
        if weights is None:
            rank_plus = pivots.positive_rank(num_levels)
        else:
            plus = positive_rank_weights(num_levels).to(weights).expand(weights.shape[0], -1, -1, 1)
            rank_plus = level_step_sums(pivots.scores, pivots.levels, torch.cat([plus, weights], dim=3))
        return pivots, rank_plus, sup_negative_rank(scores, pivots, masks, group, active=active, **kernel)

    def extra_repr(self) -> str:
        steps = "" if self.step_counts == "sorted" else f", step_counts={self.step_counts!r}"
        steps += "" if self.method == "auto" else f", method={self.method!r}"
        return f"tau={self.tau}, rho={self.rho}, delta={self.delta:.4g}, start={self.start}{steps}, " + super().extra_repr()


@LOSSES.register("sup_ap")
class SupAPLoss(SupRankLoss):
    """Sup-AP (ROADMAP Eq. 5, TPAMI Eq. 11)::

        L = 1 - 1/M sum_i 1/|P_i| sum_{k in P_i} rank^+(k) / (rank^+(k) + rank_s^-(k))

    an upper bound of ``1 - AP`` (``H^- >= H``). Uses label column 0.
    """

    def query_terms(self, scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor, num_levels: int) -> torch.Tensor:
        pivots, rank_plus, rank_minus = self.ranks(scores, levels, valid, num_levels)
        # padding divides by 1: a 0 / 0 there, even unselected by a where, would give a NaN gradient
        ratio = rank_plus * pivots.present / torch.where(pivots.present, rank_plus + rank_minus, torch.ones_like(rank_minus))
        return 1.0 - ratio.sum(1) / pivots.present.sum(1).clamp(min=1)
