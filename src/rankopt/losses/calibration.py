"""The calibration (pair-based decomposability) loss of ROADMAP (NeurIPS 2021 Eq. 7 = TPAMI Eq. 7)."""

from __future__ import annotations

import torch

from rankopt.losses.base import RankLoss, RetrievalSet
from rankopt.losses.registry import LOSSES

REDUCTIONS = ("per_query", "violating_pairs")


@LOSSES.register("calibration")
class CalibrationLoss(RankLoss):
    """``L_calibr`` (ROADMAP Eq. 7)::

        L = 1/M sum_i [ 1/|P_i| sum_{j in P_i} [alpha - s_ij]_+ + 1/|N_i| sum_{j in N_i} [s_ij - beta]_+ ]

    ``alpha = 0.9``, ``beta = 0.6``. ``reduction="per_query"`` is the paper's averaging
    (queries without a positive are excluded and counted; an empty ``N_i`` contributes 0);
    ``reduction="violating_pairs"`` reproduces the reference code (PML ContrastiveLoss with
    AvgNonZeroReducer): the mean of ``[alpha - s]_+`` over the violating positive pairs plus
    the mean of ``[s - beta]_+`` over the violating negative pairs (self pairs excluded).
    Label column 0.
    """

    def __init__(self, *, alpha: float = 0.9, beta: float = 0.6, reduction: str = "per_query", **kwargs) -> None:
        super().__init__(**kwargs)
        if reduction not in REDUCTIONS:
            raise ValueError(f"unknown reduction {reduction!r}; use one of {', '.join(REDUCTIONS)}")
        self.alpha, self.beta, self.reduction = float(alpha), float(beta), reduction

    def compute(self, batch: RetrievalSet) -> torch.Tensor:
        pos = batch.positives
        neg = (batch.levels == 0) & batch.valid
        pos_loss = torch.relu(self.alpha - batch.scores) * pos
        neg_loss = torch.relu(batch.scores - self.beta) * neg
        if self.reduction == "violating_pairs":
            self.last_num_queries_without_positive = int((pos.sum(1) == 0).sum())
            return _mean_nonzero(pos_loss) + _mean_nonzero(neg_loss)
        num_pos, num_neg = pos.sum(1), neg.sum(1)
        per_query = pos_loss.sum(1) / num_pos.clamp(min=1) + neg_loss.sum(1) / num_neg.clamp(min=1)
        return self.average_over_queries(per_query, num_pos > 0)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, beta={self.beta}, reduction={self.reduction!r}, " + super().extra_repr()


def _mean_nonzero(values: torch.Tensor) -> torch.Tensor:
    """Mean over the strictly positive entries (0 if none), PML's AvgNonZeroReducer."""
    count = (values > 0).sum()
    return values.sum() / count.clamp(min=1)
