"""Histogram-binning AP losses: SoftBin AP / mAP_Q (Revaud et al., ICCV'19) and FastAP (Cakir et al., CVPR'19).

Both relax AP by soft-assigning each retrieved item's score to ``M`` bins with a
triangular kernel, then computing precision and incremental recall per bin
(ICCV'19 Eq. 5-11)::

    delta(x, m) = max(0, 1 - |x - b_m| / Delta)          (Eq. 7), b_m = hi - (m - 1) Delta
    c_m = sum_k delta(s_k, m),  c+_m = sum_{k in P} delta(s_k, m),  C_m / C+_m their cumsums
    AP_Q = sum_m (C+_m / C_m) * c+_m / |P|                (Eq. 9-11)

Consecutive triangles of half-width ``Delta`` are a partition of unity, so each
score falls into exactly two adjacent bins with weights ``1 - f`` and ``f``: the
per-query histograms are two ``scatter_add`` calls with a hand-written backward,
O(B·M) memory per query chunk (never the (bins × B × M) pulse tensor of the
reference code). Scores outside the binning range go to the end bin (open-ended
first and last bins, as the naver quantiser), where their gradient is zero.
Scores and soft counts are float32 (the compute dtype); the small (B, bins)
histogram -> AP step runs in float64, where cumulative sums and the tie-aware
digamma differences would otherwise cancel.

Known bias (pinned by the tests): the plain mAP_Q does not converge to AP as
M -> infinity on tie-free data. Each item's mass is split between two bins whatever
M, so its own bin counts only part of itself (a positive ranked 2nd behind one
negative, split half/half, gets precision 0.42 instead of 0.5). Eq. 13 (precision at
the bin middle, ``tie_aware="simplified"``) cancels this to first order and converges.
"""

from __future__ import annotations

import torch

from rankopt.losses.rank_loss import DEFAULT_MAX_ELEMENTS, RankLoss, RetrievalSet
from rankopt.losses.registry import LOSSES

TIE_MODES = (False, True, "exact", "simplified")


class _SoftCounts(torch.autograd.Function):
    """``(Q, M)`` scores -> ``(Q, 2 bins)`` soft counts (negatives | positives) of the two
    triangles each score falls into, with a hand-written backward (no autograd graph):
    ``d c[low] / d s = member / Delta = -d c[low + 1] / d s`` inside ``[lo, hi]``, 0 outside."""

    @staticmethod
    def forward(ctx, scores: torch.Tensor, valid: torch.Tensor, positives: torch.Tensor,  # type: ignore[override]
                lo: float, hi: float, num_bins: int) -> torch.Tensor:
        delta = (hi - lo) / (num_bins - 1)
        position = (hi - scores).clamp_(0.0, hi - lo).div_(delta)  # in [0, num_bins - 1]
        low = position.floor().clamp_(max=num_bins - 2)
        member = valid.to(scores.dtype)
        upper = position.sub_(low).mul_(member)
        # negatives fill columns [0, num_bins), positives [num_bins, 2 num_bins)
        index = low.add_(positives.to(scores.dtype), alpha=num_bins).long()
        counts = scores.new_zeros(scores.shape[0], 2 * num_bins)
        counts.scatter_add_(1, index, member.sub_(upper))
        counts[:, 1:].scatter_add_(1, index, upper)
        ctx.save_for_backward(scores, valid, index)
        ctx.lo, ctx.hi, ctx.delta = lo, hi, delta
        return counts

    @staticmethod
    def backward(ctx, grad_counts: torch.Tensor):  # type: ignore[override]
        scores, valid, index = ctx.saved_tensors
        step = grad_counts.gather(1, index).sub_(grad_counts[:, 1:].gather(1, index))
        inside = valid & (scores >= ctx.lo) & (scores <= ctx.hi)
        return step.mul_(inside).div_(ctx.delta), None, None, None, None, None


def soft_histograms(scores: torch.Tensor, valid: torch.Tensor, positives: torch.Tensor, lo: float, hi: float,
                    num_bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-query soft histograms ``(c, c+)``, each ``(Q, num_bins)`` in the scores' dtype, bin 0 the highest scores.

    ``c_m = sum_{k valid} delta(s_k, m)`` and ``c+_m`` the same over ``positives``
    (ICCV'19 Eq. 7, 9, 10), with bin centres ``b_m = hi - m (hi - lo) / (num_bins - 1)``.
    """
    counts = _SoftCounts.apply(scores, valid, positives, lo, hi, num_bins)
    neg, pos = counts[:, :num_bins], counts[:, num_bins:]
    return neg + pos, pos


def _safe_ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """``num / den`` where ``den > 0``, else 0 (empty bins contribute nothing; FastAP's NaN -> 0)."""
    positive = den > 0
    return torch.where(positive, num / torch.where(positive, den, torch.ones_like(den)), torch.zeros_like(num))


def ap_from_histograms(hist: torch.Tensor, pos_hist: torch.Tensor, num_positives: torch.Tensor,
                       tie_aware: bool | str = False) -> torch.Tensor:
    """AP of each query from its bin counts, ``(Q,)`` in the histograms' dtype.

    * ``tie_aware=False`` — quantised AP, ICCV'19 Eq. 11 (= FastAP): ``sum_m c+_m C+_m / C_m / |P|``.
    * ``"simplified"`` — ICCV'19 Eq. 13 (mAP_T): precision at the middle of each bin,
      ``(1 + c+_m + 2 C+_{m-1}) / (1 + c_m + 2 C_{m-1})``. An approximation of the next one.
    * ``True`` / ``"exact"`` — the expected AP when the items of a bin are tied and
      ordered uniformly at random (He et al. 2018; naver's TAPLoss, with its ``ln``
      replaced by exact harmonic sums)::

          sum_m c+_m / c_m [(C+_{m-1} + 1) H_m + r_m (c_m - (C_{m-1} + 1) H_m)] / |P|
          H_m = psi(C_m + 1) - psi(C_{m-1} + 1) = sum_{t = C_{m-1}+1}^{C_m} 1/t,
          r_m = (c+_m - 1)_+ / (c_m - 1)_+

      exact for integer counts (tested against enumeration) and smooth in the soft
      counts; on tie-free data a split item is partly counted twice, so this AP reads
      about 1e-2 high there (the plain mAP_Q reads low by about as much).
    """
    cum = hist.cumsum(dim=1)
    cum_pos = pos_hist.cumsum(dim=1)
    if tie_aware is False:
        precision = _safe_ratio(cum_pos, cum)
    elif tie_aware == "simplified":
        precision = (1 + 2 * cum_pos - pos_hist) / (1 + 2 * cum - hist)
    elif tie_aware is True or tie_aware == "exact":
        before, before_pos = cum - hist, cum_pos - pos_hist
        harmonic = torch.digamma(cum + 1) - torch.digamma(before + 1)
        rate = ((pos_hist - 1).clamp(min=0) / (hist - 1).clamp(min=1e-12)).clamp(max=1)
        expected_precision_sum = (before_pos + 1) * harmonic + rate * (hist - (before + 1) * harmonic)
        precision = _safe_ratio(expected_precision_sum, hist)
    else:
        raise ValueError(f"tie_aware must be one of {TIE_MODES}, got {tie_aware!r}")
    return (precision * pos_hist).sum(dim=1) / num_positives.clamp(min=1)


def class_balance_weights(labels: torch.Tensor) -> torch.Tensor:
    """ICCV'19 §4.2 weights for Eq. 12: ``w_i = 1 / (K n_{y_i})`` with ``K`` classes and
    ``n_c`` queries of class ``c``, so that every class weighs the same; ``sum_i w_i = 1``."""
    _, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    return 1.0 / (counts[inverse] * counts.numel()).double()


@LOSSES.register("softbin_ap")
class SoftBinAPLoss(RankLoss):
    """SoftBin AP (Revaud et al. ICCV'19, Eq. 5-12): ``1 - mAP_Q`` over the batch queries.

    ``num_bins`` (M, default 20) triangular bins over ``score_range`` (``(-1, 1)``
    as ROADMAP, ``(0, 1)`` as naver's code). ``tie_aware`` selects the AP of
    :func:`ap_from_histograms` (``"simplified"`` is the paper's mAP_T, Eq. 13;
    ``True``/``"exact"`` the expected AP under within-bin ties it approximates).
    ``class_balanced`` weights queries so that every class counts equally (§4.2).
    Cosine similarity; flat labels (column 0).
    """

    def __init__(
        self,
        num_bins: int = 20,
        score_range: tuple[float, float] = (-1.0, 1.0),
        *,
        tie_aware: bool | str = False,
        class_balanced: bool = False,
        include_self: bool = False,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
    ) -> None:
        super().__init__(similarity="cosine", include_self=include_self, max_elements=max_elements)
        if int(num_bins) < 2:
            raise ValueError(f"num_bins must be >= 2, got {num_bins}")
        lo, hi = (float(v) for v in score_range)
        if not lo < hi:
            raise ValueError(f"score_range must be (lo, hi) with lo < hi, got {score_range}")
        if tie_aware not in TIE_MODES:
            raise ValueError(f"tie_aware must be one of {TIE_MODES}, got {tie_aware!r}")
        self.num_bins = int(num_bins)
        self.score_range = (lo, hi)
        self.tie_aware: bool | str = "exact" if tie_aware is True else tie_aware
        self.class_balanced = class_balanced

    def _query_ap(self, scores: torch.Tensor, valid: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
        hist, pos_hist = soft_histograms(scores, valid, positives, *self.score_range, self.num_bins)
        ap = ap_from_histograms(hist.double(), pos_hist.double(), positives.sum(dim=1), self.tie_aware)
        return ap.to(scores.dtype)

    def compute(self, batch: RetrievalSet) -> torch.Tensor:
        positives = batch.positives
        has_positive = positives.any(dim=1)
        ap = self.rowwise(self._query_ap, batch.scores, batch.valid, positives, elements_per_row=batch.scores.shape[1])
        if not self.class_balanced:
            return self.average_over_queries(1.0 - ap, has_positive)
        self.last_num_queries_without_positive = int((~has_positive).sum())
        weights = class_balance_weights(batch.labels[has_positive, 0]).to(ap.dtype)
        return ((1.0 - ap[has_positive]) * weights).sum()

    def extra_repr(self) -> str:
        return (f"num_bins={self.num_bins}, score_range={self.score_range}, tie_aware={self.tie_aware!r}, "
                f"class_balanced={self.class_balanced}, {super().extra_repr()}")


@LOSSES.register("fastap")
class FastAPLoss(SoftBinAPLoss):
    """FastAP (Cakir et al. CVPR'19; anchors §1.9): ``1 - mean_i FastAP_i``.

    Squared distances of unit vectors ``d2 = 2 - 2 s`` in ``[0, 4]``, ``num_bins + 1``
    centres ``z_l = 4 l / num_bins``, triangular pulse of half-width ``4 / num_bins``,
    ``FastAP_i = sum_l h+_l H+_l / H_l / |P_i|`` with ``H`` the cumulative histograms;
    ``0/0`` (empty leading bins) counts 0, the reference's NaN -> 0.

    Since ``d2`` is affine in ``s``, binning ``d2`` on ``[0, 4]`` is binning ``s`` on
    ``[-1, 1]`` with the same centres, so this is exactly :class:`SoftBinAPLoss` with
    ``num_bins + 1`` bins over ``(-1, 1)`` (``self.num_bins`` holds those ``num_bins + 1``
    centres). Default ``num_bins = 10`` (reference code).
    Differences from pytorch-metric-learning's ``FastAPLoss``: the query is excluded
    by index here as there; a reference set is supported; ``d2`` outside ``[0, 4]``
    (rounding) is clamped into the end bins.
    """

    def __init__(
        self,
        num_bins: int = 10,
        *,
        tie_aware: bool | str = False,
        class_balanced: bool = False,
        include_self: bool = False,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
    ) -> None:
        if int(num_bins) < 1:
            raise ValueError(f"num_bins must be >= 1, got {num_bins}")
        super().__init__(int(num_bins) + 1, (-1.0, 1.0), tie_aware=tie_aware, class_balanced=class_balanced,
                         include_self=include_self, max_elements=max_elements)
