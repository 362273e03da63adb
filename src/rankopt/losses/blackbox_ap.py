"""BlackBox AP (Rolínek et al., CVPR'20, "Optimizing rank-based metrics with blackbox differentiation").

The exact AP is computed from exact ranks; the rank function (piecewise constant)
is differentiated with the blackbox rule of Vlastelica/Pogančić et al. (ICLR'20)::

    forward:   r = rank(s)                       (ranking is argmin_pi <s, pi>, a linear "solver")
    backward:  ds = -(r - rank(s + lambda * dL/dr)) / lambda

with ranks normalised by the size of the retrieval set, as the reference code
(anchors §1.11), for which lambda = 4 was tuned. Ranks among positives carry no
gradient (reference code). A margin (0.02) lowers positive and raises negative
scores by ``margin / 2`` before ranking (the paper's margin; the reference code
draws it as ``margin * |N(0, 1)|``).

Because the backward perturbs the scores by ``lambda * dL/dr``, the gradient is
not linear in the incoming gradient: scaling the loss changes the step, as in the
reference. Memory is the (B, M) score matrix (this loss is not chunked).
"""

from __future__ import annotations

import torch

from rankopt.losses.rank_loss import DEFAULT_MAX_ELEMENTS, RankLoss, RetrievalSet
from rankopt.losses.registry import LOSSES


def pessimistic_ranks(scores: torch.Tensor) -> torch.Tensor:
    """``rank_ij = #{k : s_ik >= s_ij}`` per row (ties pessimistic; ``-inf`` items are
    never counted for finite scores). Float tensor of the scores' shape."""
    ascending = scores.sort(dim=1).values
    below = torch.searchsorted(ascending, scores.contiguous(), side="left")
    return (scores.shape[1] - below).to(scores.dtype)


class BlackBoxRanks(torch.autograd.Function):
    """Normalised ranks ``rank(s) / n`` with the blackbox backward
    ``-(rank(s) - rank(s + lambda g)) / (lambda n)``. ``scores`` use ``-inf`` for items
    outside the retrieval set; ``sizes`` (``(Q, 1)``) is the retrieval-set size ``n``."""

    @staticmethod
    def forward(ctx, scores: torch.Tensor, sizes: torch.Tensor, lam: float) -> torch.Tensor:  # type: ignore[override]
        ranks = pessimistic_ranks(scores) / sizes
        ctx.save_for_backward(scores, ranks, sizes)
        ctx.lam = lam
        return ranks

    @staticmethod
    def backward(ctx, grad_ranks: torch.Tensor):  # type: ignore[override]
        scores, ranks, sizes = ctx.saved_tensors
        perturbed = pessimistic_ranks(scores + ctx.lam * grad_ranks) / sizes
        return -(ranks - perturbed) / ctx.lam, None, None


@LOSSES.register("blackbox_ap")
class BlackBoxAPLoss(RankLoss):
    """``1 - mAP`` with exact ranks and blackbox gradients (Rolínek et al. 2020).

    ``AP_i = (1/|P_i|) sum_{j in P_i} rank+(j) / rank(j)`` on the margin-shifted scores
    ``s - margin (y - 1/2)``; ``lam`` (lambda = 4) is the blackbox interpolation strength.
    Flat labels (column 0); the query is excluded from its own retrieval set by index.
    """

    def __init__(
        self,
        lam: float = 4.0,
        margin: float = 0.02,
        *,
        similarity: str = "cosine",
        include_self: bool = False,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
    ) -> None:
        super().__init__(similarity=similarity, include_self=include_self, max_elements=max_elements)
        if not lam > 0:
            raise ValueError(f"lam must be > 0, got {lam}")
        if margin < 0:
            raise ValueError(f"margin must be >= 0, got {margin}")
        self.lam = float(lam)
        self.margin = float(margin)

    def compute(self, batch: RetrievalSet) -> torch.Tensor:
        positives = batch.positives
        num_positives = positives.sum(dim=1)
        shifted = batch.scores - self.margin * (positives.to(batch.scores.dtype) - 0.5)
        outside = torch.tensor(float("-inf"), dtype=shifted.dtype, device=shifted.device)
        sizes = batch.valid.sum(dim=1, keepdim=True).to(shifted.dtype)
        ranks = BlackBoxRanks.apply(torch.where(batch.valid, shifted, outside), sizes, self.lam)
        with torch.no_grad():
            positive_ranks = pessimistic_ranks(torch.where(positives, shifted, outside))
        ratios = torch.where(positives, positive_ranks / (ranks * sizes), torch.zeros_like(ranks))
        ap = ratios.sum(dim=1) / num_positives.clamp(min=1)
        return self.average_over_queries(1.0 - ap, num_positives > 0)

    def extra_repr(self) -> str:
        return f"lam={self.lam}, margin={self.margin}, {super().extra_repr()}"
