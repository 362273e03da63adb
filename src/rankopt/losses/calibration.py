"""The calibration (pair-based decomposability) loss of ROADMAP (NeurIPS 2021 Eq. 7 = TPAMI Eq. 7)."""

from __future__ import annotations

import torch

from rankopt.losses.base import RankLoss, RetrievalSet, rowwise_with_gradient
from rankopt.losses.registry import LOSSES

REDUCTIONS = ("per_query", "violating_pairs")
CHUNK_ELEMENTS = 1 << 18
"""Scores per chunk of the per-query hinges (rows of ``M``): their temporaries stay in cache."""


@LOSSES.register("calibration")
class CalibrationLoss(RankLoss):
    """``L_calibr`` (ROADMAP Eq. 7)::

        L = 1/M sum_i [ 1/|P_i| sum_{j in P_i} [alpha - s_ij]_+ + 1/|N_i| sum_{j in N_i} [s_ij - beta]_+ ]

    ``alpha = 0.9``, ``beta = 0.6``. ``reduction="per_query"`` is the paper's averaging
    (queries without a positive are excluded and counted; an empty ``N_i`` contributes 0);
    ``reduction="violating_pairs"`` reproduces the reference code (PML ContrastiveLoss with
    AvgNonZeroReducer): the mean of ``[alpha - s]_+`` over the violating positive pairs plus
    the mean of ``[s - beta]_+`` over the violating negative pairs (self pairs excluded).
    Label column 0. ``per_query`` is evaluated in chunks of rows and its gradient (``-1/|P_i|`` or ``1/|N_i|``
    where a hinge is active) written chunk by chunk in the backward
    (:func:`~rankopt.losses.base.rowwise_with_gradient`): no ``(B, M)`` temporary besides the gradient itself.
    """

    def __init__(self, *, alpha: float = 0.9, beta: float = 0.6, reduction: str = "per_query", **kwargs) -> None:
        super().__init__(**kwargs)
        if reduction not in REDUCTIONS:
            raise ValueError(f"unknown reduction {reduction!r}; use one of {', '.join(REDUCTIONS)}")
        self.alpha, self.beta, self.reduction = float(alpha), float(beta), reduction

    def compute(self, batch: RetrievalSet) -> torch.Tensor:
        if self.reduction == "violating_pairs":
            pos = batch.positives
            pos_loss = torch.relu(self.alpha - batch.scores) * pos
            neg_loss = torch.relu(batch.scores - self.beta) * ((batch.levels == 0) & batch.valid)
            self.last_num_queries_without_positive = int((pos.sum(1) == 0).sum())
            return _mean_nonzero(pos_loss) + _mean_nonzero(neg_loss)
        rows = max(1, min(self.max_elements, CHUNK_ELEMENTS) // max(1, batch.scores.shape[1]))
        num_pos = batch.num_positives
        counts = torch.stack([num_pos, batch.num_members - num_pos], dim=1).clamp(min=1).to(batch.scores.dtype)
        per_query = rowwise_with_gradient(self._hinges, batch.scores, batch.levels, batch.valid, counts, rows=rows)
        return self.average_over_queries(per_query, num_pos > 0)

    def _hinges(self, scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor, counts: torch.Tensor, gradient: bool) -> torch.Tensor:
        """Per-query ``L_calibr`` of a chunk of rows (``counts``: ``(C, 2)``, ``max(1, |P_i|)`` and ``max(1, |N_i|)``),
        or with ``gradient`` its derivative w.r.t. the scores: ``-1/|P_i|`` on the positives with ``s < alpha``,
        ``1/|N_i|`` on the negatives with ``s > beta``, 0 elsewhere."""
        pos = (levels > 0) & valid
        neg = (levels == 0) & valid
        num_pos, num_neg = counts[:, :1], counts[:, 1:]
        if gradient:
            below = torch.where(pos & (scores < self.alpha), -1.0 / num_pos, 0.0)
            return torch.where(neg & (scores > self.beta), 1.0 / num_neg, below)
        below = torch.sub(self.alpha, scores).clamp_(min=0).mul_(pos)  # [alpha - s]_+ on the positives
        above = torch.sub(scores, self.beta).clamp_(min=0).mul_(neg)  # [s - beta]_+ on the negatives
        return (below.sum(1, keepdim=True) / num_pos + above.sum(1, keepdim=True) / num_neg).squeeze(1)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}, beta={self.beta}, reduction={self.reduction!r}, " + super().extra_repr()


def _mean_nonzero(values: torch.Tensor) -> torch.Tensor:
    """Mean over the strictly positive entries (0 if none), PML's AvgNonZeroReducer."""
    count = (values > 0).sum()
    return values.sum() / count.clamp(min=1)
