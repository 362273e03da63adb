"""The SupRank ranks of a chunk of queries, ``rank(k) = rank^+(k) + rank_s^-(k)`` (TPAMI Eq. 3-5), and their memory.

``rank^+`` keeps the exact step (no gradient), ``rank_s^-`` the surrogate ``H^-`` (TPAMI Eq. 4,
:func:`~rankopt.rank.surrogates.sup_step`). :class:`SupRanks` holds the parameters and the choice of paths; the
losses built on it (:mod:`rankopt.losses.sup_ap` and its kin) only combine the ranks into their formula.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rankopt import kernels
from rankopt.rank.surrogates import (
    Pivots,
    compiled_sums,
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


@dataclass(frozen=True)
class SupRanks:
    """``rank^+`` and ``rank_s^-`` of each positive (:meth:`__call__`) with ``H^-(tau, rho, delta, start)``.
    ``step_counts``: :data:`STEP_COUNTS` (same values and gradients; ``"sorted"`` costs ``O(P log P + P L + A M)``
    per query for ``A`` pivots with a less relevant item, ``"pairwise"`` ``O(P^2 + P M)``). ``method``:
    :data:`rankopt.kernels.METHODS`, the path of the ``H^-`` sums."""

    tau: float
    rho: float
    delta: float
    start: float
    step_counts: str = "sorted"
    method: str = "auto"

    def __post_init__(self) -> None:
        if self.tau <= 0 or self.rho < 0:
            raise ValueError(f"need tau > 0 and rho >= 0, got tau={self.tau}, rho={self.rho}")
        if self.step_counts not in STEP_COUNTS:
            raise ValueError(f"unknown step_counts {self.step_counts!r}; use one of {', '.join(STEP_COUNTS)}")
        kernels.check(self.method)
        if self.delta < 0:
            raise ValueError(f"delta must be >= 0, got {self.delta}")

    def elements_per_row(self, scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor, num_levels: int) -> int:
        """Elements of a row's largest intermediate (``"sorted"``): ``max(A_i, L) * M`` with ``A_i`` the query's
        pivots entering the ``H^-`` kernel, for the ``(C, A, M)`` blocks of the reference sums; the compiled sums build
        none, and a row's largest intermediates are its ``G <= L`` lower-level masks and its 8-byte ``(M,)`` factors
        and ``(P,)`` pivot indices: ``max(L, 2) * M``."""
        if compiled_sums(self.method, scores):
            return max(2, num_levels) * scores.shape[1]
        active = int(row_counts(has_lower_item(levels, valid)).max())
        return max(1, active, num_levels) * scores.shape[1]

    def __call__(
        self, scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor, num_levels: int,
        weights: torch.Tensor | None = None,
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
