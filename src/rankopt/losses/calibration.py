"""The calibration (pair-based decomposability) loss of ROADMAP (NeurIPS 2021 Eq. 7 = TPAMI Eq. 7)."""

from __future__ import annotations

import numpy as np
import torch

from rankopt import kernels
from rankopt.losses.rank_loss import RankLoss, RetrievalSet, chunk_rows, rowwise_with_gradient
from rankopt.losses.registry import LOSSES
from rankopt.threads import ThreadPool

REDUCTIONS = ("per_query", "violating_pairs")
CHUNK_ELEMENTS = 1 << 18
"""Scores per chunk of the reference path's hinges on CPU (rows of ``M``): their temporaries stay in cache. On a
GPU a chunk is ``max_elements`` scores: small chunks would cost a kernel launch each."""


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
    (:func:`~rankopt.losses.rank_loss.rowwise_with_gradient`): no ``(B, M)`` temporary besides the gradient itself.
    On CPU (``method``, :data:`rankopt.kernels.METHODS`) compiled kernels do each direction in one pass instead
    (:mod:`rankopt.losses._calibration_kernels`), the hinge a small fraction of the score matrix's cost.
    """

    def __init__(self, *, alpha: float = 0.9, beta: float = 0.6, reduction: str = "per_query", method: str = "auto",
                 **kwargs) -> None:
        super().__init__(**kwargs)
        if reduction not in REDUCTIONS:
            raise ValueError(f"unknown reduction {reduction!r}; use one of {', '.join(REDUCTIONS)}")
        kernels.check(method)
        self.alpha, self.beta, self.reduction, self.method = float(alpha), float(beta), reduction, method

    def compute(self, batch: RetrievalSet) -> torch.Tensor:
        if self.reduction == "violating_pairs":
            pos = batch.positives
            pos_loss = torch.relu(self.alpha - batch.scores) * pos
            neg_loss = torch.relu(batch.scores - self.beta) * ((batch.levels == 0) & batch.valid)
            self.last_num_queries_without_positive = int((pos.sum(1) == 0).sum())
            return _mean_nonzero(pos_loss) + _mean_nonzero(neg_loss)
        num_pos = batch.num_positives
        counts = torch.stack([num_pos, batch.num_members - num_pos], dim=1).clamp(min=1).to(batch.scores.dtype)
        on_cpu = batch.scores.device.type == "cpu"
        if kernels.use_compiled(self.method, lambda: [] if on_cpu else [f"CPU scores, got {batch.scores.device}"]):
            per_query = _CompiledHinges.apply(batch.scores, batch.levels, batch.valid, counts, self.alpha, self.beta)
        else:
            limit = min(self.max_elements, CHUNK_ELEMENTS) if on_cpu else self.max_elements
            rows = chunk_rows(limit, batch.scores.shape[1])
            per_query = rowwise_with_gradient(self._hinges, batch.scores, batch.levels, batch.valid, counts, rows=rows)
        return self.average_over_queries(per_query, num_pos > 0)

    def _hinges(self, scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor, counts: torch.Tensor,
                gradient: bool) -> torch.Tensor:
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
        return (f"alpha={self.alpha}, beta={self.beta}, reduction={self.reduction!r}, method={self.method!r}, "
                + super().extra_repr())


class _CompiledHinges(torch.autograd.Function):
    """Per-query ``L_calibr`` of CPU scores by the compiled kernels: the sums forward; backward
    ``grad_out_i * (-1/|P_i| [s_ij < alpha] on P_i, 1/|N_i| [s_ij > beta] on N_i)`` written in one pass; rows split
    over ``torch.get_num_threads()`` threads (:class:`~rankopt.threads.ThreadPool`)."""

    @staticmethod
    def forward(ctx, scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor,  # type: ignore[override]
                counts: torch.Tensor,
                alpha: float, beta: float) -> torch.Tensor:
        from rankopt.losses import _calibration_kernels as compiled  # noqa: PLC0415 - numba: slow import

        data = [t.detach().contiguous() for t in (scores, levels, valid)]
        ctx.save_for_backward(*data, counts)
        ctx.bounds = _bounds(scores.dtype, alpha, beta)
        sums = torch.empty(scores.shape[0], 2, dtype=torch.float64)
        arrays = [t.numpy() for t in (*data, sums)]
        with ThreadPool(torch.get_num_threads()) as pool:
            pool.run(lambda _, lo, hi: compiled.hinge_sums(*(a[lo:hi] for a in arrays[:3]), *ctx.bounds,
                                                           arrays[3][lo:hi]), len(sums))
        return (sums.to(counts.dtype) / counts).sum(1)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        from rankopt.losses import _calibration_kernels as compiled  # noqa: PLC0415 - numba: slow import

        scores, levels, valid, counts = ctx.saved_tensors
        weights = (grad_out.unsqueeze(1) / counts).contiguous()
        grad = torch.empty_like(scores)
        arrays = [t.numpy() for t in (scores, levels, valid)]
        per_row = [weights[:, k].contiguous().numpy() for k in (0, 1)]
        with ThreadPool(torch.get_num_threads()) as pool:
            pool.run(lambda _, lo, hi: compiled.hinge_gradient(*(a[lo:hi] for a in arrays), *ctx.bounds,
                                                              *(w[lo:hi]
                                                                for w in per_row), grad.numpy()[lo:hi]), len(grad))
        return grad, None, None, None, None, None


def _bounds(dtype: torch.dtype, alpha: float, beta: float) -> tuple[np.floating, np.floating]:
    """``alpha`` and ``beta`` in the scores' precision, so comparisons at the bounds are the torch path's."""
    kind = np.float32 if dtype == torch.float32 else np.float64
    return kind(alpha), kind(beta)


def _mean_nonzero(values: torch.Tensor) -> torch.Tensor:
    """Mean over the strictly positive entries (0 if none), PML's AvgNonZeroReducer."""
    count = (values > 0).sum()
    return values.sum() / count.clamp(min=1)
