"""Step functions, their smooth surrogates, and the per-pivot rank terms built on them.

Notation (TPAMI §3): for a query, ``s_j`` is the score of retrieved item ``j``; the
rank of a positive *pivot* ``k`` decomposes as (TPAMI Eq. 3, pessimistic ties)::

    rank(k) = 1 + sum_{j != k, l_j >= l_k} H(s_j - s_k) + sum_{j: l_j < l_k} H(s_j - s_k)
            = rank^+(k)                                 + rank^-(k)

with ``H(t) = 1 if t >= 0 else 0`` and ``l`` the relevance level. Rank losses
replace ``H`` in ``rank^-`` (SupRank) or in both terms (Smooth-AP) by a smooth
surrogate. The per-pivot terms are evaluated for ``C`` queries, ``P`` pivots per
query (padded) and ``M`` retrieved items — never ``M^3``:

:func:`sigmoid_sums` and :func:`sup_rank_sums` are fused autograd functions whose only
``(C, P, M)`` tensor is one float buffer: the values and the derivative are computed in
place, the sums over items and the gradients are batched mat-vec products (``bmm``).

Items are split into ``G`` masks (``(C, G, M)``, bool or 0/1 floats, e.g. the negatives, or for
hierarchical labels the items of level ``< l`` for each ``l``); each pivot uses the mask
``group[c, p]``.
"""

from __future__ import annotations

import math

import torch


def heaviside(t: torch.Tensor) -> torch.Tensor:
    """The pessimistic step ``H(t) = 1 if t >= 0 else 0`` (TPAMI Eq. 3): ties count."""
    return (t >= 0).to(t.dtype)


def default_delta(tau: float = 0.01, eps: float = 1e-2) -> float:
    """``delta = tau * ln((1 - eps) / eps)`` (ROADMAP supp. A.3): where ``sigma'`` drops below ``eps``."""
    if not 0.0 < eps < 0.5:
        raise ValueError(f"eps must be in (0, 0.5), got {eps}")
    return tau * math.log((1.0 - eps) / eps)


def sup_step(t: torch.Tensor, tau: float = 0.01, rho: float = 100.0, delta: float | None = None, start: float = 0.5) -> torch.Tensor:
    """SupRank ``H^-`` (ROADMAP Eq. 4 = TPAMI Eq. 4)::

        H^-(t) = sigma(t / tau)                                  t < 0
               = sigma(t / tau) + start                          0 <= t <= delta
               = rho * (t - delta) + sigma(delta / tau) + start  t > delta

    The linear offset is *computed*, so ``H^-`` is continuous at ``delta`` for any
    parameters (the reference code's hard-coded 1.44 and missing ``-delta`` are not
    reproduced, cf. ROADMAP #12). With the paper's ``start = 0.5``, ``H^- >= H``
    everywhere (ties ``t = 0`` take the upper branch, matching the pessimistic step), and
    ``H^- - start * H`` is continuous at 0: ``H^-`` jumps at 0 by ``start``, exactly
    ``start`` times the jump of the step it bounds. ``start = 0`` gives a surrogate
    continuous everywhere but no longer an upper bound on ``(0, delta)``.
    """
    delta = default_delta(tau) if delta is None else delta
    offset = 1.0 / (1.0 + math.exp(-delta / tau)) + start
    smooth = torch.sigmoid(t / tau) + start * (t >= 0).to(t.dtype)
    return torch.where(t > delta, rho * (t - delta) + offset, smooth)


class _SurrogateSums(torch.autograd.Function):
    """``S[c, p, g] = sum_k masks[c, g, k] * f((s[c, k] - t[c, p]) / tau)`` with ``f = sigma`` (no ``cap``)
    or ``f(u) = sigma(min(u, cap)) + start * H(u) + rho_tau * [u - cap]_+`` (``H^-`` in units of ``tau``)."""

    @staticmethod
    def forward(ctx, scores, pivot_scores, masks, tau: float, cap: float | None, rho_tau: float, start: float):  # type: ignore[override]
        scaled = scores / tau
        u = scaled.unsqueeze(1) - (pivot_scores / tau).unsqueeze(2)
        weights = masks.to(u.dtype)
        sums = None
        if cap is not None:
            indicator = torch.ge(u, 0.0, out=torch.empty_like(u))  # the pessimistic step H(u), as floats
            sums = start * torch.bmm(indicator, weights.transpose(1, 2))
            torch.gt(u, cap, out=indicator)  # the linear branch
            # sum_k w_k [u_k > cap] (u_k - cap) = sum_k w_k [.] s_k / tau - (t_p / tau + cap) #{.}
            above_sum = torch.bmm(indicator, (weights * scaled.unsqueeze(1)).transpose(1, 2))
            above_count = torch.bmm(indicator, weights.transpose(1, 2))
            sums = sums + rho_tau * (above_sum - (pivot_scores / tau + cap).unsqueeze(2) * above_count)
            u.clamp_(max=cap)
        u.sigmoid_()
        smooth = torch.bmm(u, weights.transpose(1, 2))
        sums = smooth if sums is None else sums + smooth
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            u.addcmul_(u, u, value=-1.0)  # sigma' = sigma (1 - sigma), in place
            if cap is not None:  # slope rho_tau on the linear branch, where u was capped: sigma' = sigma'(cap) there
                at_cap = 1.0 / (1.0 + math.exp(-cap))
                u.add_(indicator, alpha=rho_tau - at_cap * (1.0 - at_cap))
            ctx.save_for_backward(u, weights)
            ctx.tau = tau
        return sums

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        slope, weights = ctx.saved_tensors
        grad = grad.to(slope.dtype) / ctx.tau
        # dL/du[c,p,k] = slope[c,p,k] * sum_g grad[c,p,g] weights[c,g,k]; u = (s_k - t_p) / tau
        d_scores = (torch.bmm(grad.transpose(1, 2), slope) * weights).sum(1)
        d_pivots = -(torch.bmm(slope, weights.transpose(1, 2)) * grad).sum(2)
        return d_scores, d_pivots, None, None, None, None, None


def sigmoid_sums(scores: torch.Tensor, pivot_scores: torch.Tensor, masks: torch.Tensor, tau: float) -> torch.Tensor:
    """``(C, P, G)``: ``sum_{k in mask g} sigma((s_k - s_p) / tau)`` for every pivot ``p`` and mask ``g``
    (``scores`` ``(C, M)``, ``pivot_scores`` ``(C, P)``, ``masks`` ``(C, G, M)`` bool or 0/1 floats).
    Memory: one ``(C, P, M)`` float buffer, kept for the backward as ``sigma'``."""
    return _SurrogateSums.apply(scores, pivot_scores, masks, float(tau), None, 0.0, 0.0)


def sup_rank_sums(
    scores: torch.Tensor, pivot_scores: torch.Tensor, masks: torch.Tensor, *, tau: float, rho: float, delta: float, start: float
) -> torch.Tensor:
    """``(C, P, G)``: ``sum_{k in mask g} H^-(s_k - s_p)`` (TPAMI Eq. 5) for every pivot and mask, using
    ``H^-(t) = sigma(min(t, delta) / tau) + start * H(t) + rho * [t - delta]_+`` (= Eq. 4).

    The linear branch is summed as ``rho * (sum s_k - n (s_p + delta))`` over the items beyond
    ``delta`` only, so its float error is relative to those items' own contribution.
    Memory: one ``(C, P, M)`` float buffer and one bool buffer.
    """
    return _SurrogateSums.apply(scores, pivot_scores, masks, float(tau), float(delta) / float(tau), float(rho) * float(tau), float(start))


class Pivots:
    """The positives of each query row, padded to ``P = max_i |P_i|``: ``index``, ``present``,
    ``scores`` (differentiable) and ``levels`` (int64, 0 for padding), all ``(C, P)``."""

    def __init__(self, scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor) -> None:
        self.index, self.present = padded_columns((levels > 0) & valid)
        self.scores = torch.gather(scores, 1, self.index)
        self.levels = torch.gather(levels, 1, self.index).long() * self.present
        self._step_counts: torch.Tensor | None = None

    def pair_mask(self) -> torch.Tensor:
        """``(C, P, P)`` bool: both pivots present and distinct (``j != k`` by index)."""
        both = self.present.unsqueeze(2) & self.present.unsqueeze(1)
        return both & ~torch.eye(self.index.shape[1], dtype=torch.bool, device=self.index.device)

    def step_counts(self, num_levels: int) -> torch.Tensor:
        """:func:`level_step_counts` of the pivots, ``(C, P, L)``: ``N[c, k, m - 1] = #{j : l_j = m, s_j >= s_k}``
        (``k`` itself included), computed once per :class:`Pivots`; no gradient."""
        if self._step_counts is None or self._step_counts.shape[2] != num_levels:
            self._step_counts = level_step_counts(self.scores, self.levels, num_levels)
        return self._step_counts

    def positive_rank(self, num_levels: int) -> torch.Tensor:
        """Exact ``rank^+(k) = 1 + sum_{j != k, l_j >= l_k} H(s_j - s_k) = sum_{m >= l_k} N[k, m - 1]``
        (TPAMI Eq. 3, pessimistic ties, :meth:`step_counts`), ``(C, P)``, no gradient."""
        at_least = self.step_counts(num_levels).flip(2).cumsum(2).flip(2)
        return torch.gather(at_least, 2, (self.levels - 1).clamp(min=0).unsqueeze(2)).squeeze(2)

    def pairwise_positive_rank(self) -> torch.Tensor:
        """:meth:`positive_rank` by ``P^2`` comparisons per query (:func:`pairwise_step_counts`): the reference path."""
        weights = self.pair_mask() & (self.levels.unsqueeze(1) >= self.levels.unsqueeze(2))
        return 1.0 + pairwise_step_counts(self.scores, self.scores, weights.to(self.scores.dtype))

    def lower_masks(self, levels: torch.Tensor, valid: torch.Tensor, num_levels: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``Omega_k^<`` as ``G = L`` float masks ``(C, L, M)`` (mask ``g``: valid items of level ``<= g``)
        and each pivot's mask index ``level - 1``, ``(C, P)``."""
        bounds = torch.arange(num_levels, device=levels.device, dtype=levels.dtype).view(1, -1, 1)
        masks = torch.le(levels.unsqueeze(1), bounds, out=self.scores.new_empty(levels.shape[0], num_levels, levels.shape[1]))
        return masks.mul_(valid.unsqueeze(1)), (self.levels - 1).clamp(min=0)


def padded_columns(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``True`` columns of each row of a ``(C, M)`` bool mask, left-aligned and padded to
    ``K = max(1, max_c |row c|)``: ``index`` ``(C, K)`` int64 (0 for padding) and ``present`` ``(C, K)`` bool."""
    counts = mask.sum(1)
    num = max(1, int(counts.max())) if counts.numel() else 1
    rows, cols = mask.nonzero(as_tuple=True)
    slot = torch.arange(rows.numel(), device=rows.device) - (counts.cumsum(0) - counts)[rows]
    index = torch.zeros(mask.shape[0], num, dtype=torch.long, device=mask.device)
    index[rows, slot] = cols
    return index, torch.arange(num, device=mask.device) < counts.unsqueeze(1)


def has_lower_item(levels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``(C, M)`` bool, from integer ``levels``: valid items ``k`` whose set ``Omega_k^< = {valid j : l_j < l_k}`` is not empty,
    i.e. ``l_k > min_{valid j} l_j``. ``rank_s^-(k)`` is exactly 0 for the other pivots."""
    lowest = levels.masked_fill(~valid, torch.iinfo(levels.dtype).max).amin(1, keepdim=True)
    return valid & (levels > lowest)


def level_step_counts(pivot_scores: torch.Tensor, pivot_levels: torch.Tensor, num_levels: int) -> torch.Tensor:
    """``N[c, k, m - 1] = sum_j [l_j = m] H(s_j - s_k)`` for ``m = 1..L`` over the pivots ``j`` of row ``c``
    (``k`` itself included: ``H(0) = 1``, pessimistic ties), ``(C, P, L)`` in the scores' dtype, no gradient.

    ``pivot_scores`` ``(C, P)``; ``pivot_levels`` ``(C, P)`` in ``[0, L]``, 0 (padding) counted nowhere.
    Each row is sorted once; ``N[c, k]`` is the per-level suffix sum from the first sorted position whose
    score is ``>= s_k`` (``searchsorted``, left): ``O(P log P + P L)`` per row instead of the ``P^2``
    comparisons of :func:`pairwise_step_counts`. Exact for counts below ``2^24`` (float32).
    """
    with torch.no_grad():
        sorted_scores, order = pivot_scores.sort(dim=1)
        one_hot = torch.nn.functional.one_hot(torch.gather(pivot_levels, 1, order), num_levels + 1)
        suffix = torch.zeros(one_hot.shape[0], one_hot.shape[1] + 1, num_levels, dtype=pivot_scores.dtype, device=pivot_scores.device)
        suffix[:, :-1] = one_hot[..., 1:].flip(1).cumsum(1).flip(1)
        first = torch.searchsorted(sorted_scores, pivot_scores, side="left")
        return torch.gather(suffix, 1, first.unsqueeze(2).expand(-1, -1, num_levels))


def pairwise_step_counts(pivot_scores: torch.Tensor, item_scores: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum_j weights[c, p, j] * H(s_j - s_p)`` over a small item set, ``(C, P)``, no gradient.

    ``pivot_scores`` ``(C, P)``, ``item_scores`` ``(C, J)``, ``weights`` ``(C, P, J)``.
    """
    with torch.no_grad():
        above = item_scores.unsqueeze(1) >= pivot_scores.unsqueeze(2)
        return (weights * above).sum(dim=2)


def sup_negative_rank(
    scores: torch.Tensor,
    pivots: Pivots,
    masks: torch.Tensor,
    group: torch.Tensor,
    *,
    tau: float,
    rho: float,
    delta: float,
    start: float,
    active: torch.Tensor | None = None,
) -> torch.Tensor:
    """``rank_s^-(k) = sum_{j in Omega_k^<} H^-(s_j - s_k)`` (TPAMI Eq. 5), ``(C, P)``; pivot ``k`` uses mask ``group[c, k]``.

    ``active`` ``(C, P)`` bool (optional): the pivots whose mask may be non-empty (:func:`has_lower_item`);
    only they enter the ``(C, A, M)`` kernel, the others get exactly 0. Pays when few pivots have a
    less relevant item, e.g. a coarsest level shared by the whole batch.
    """
    kernel = dict(tau=tau, rho=rho, delta=delta, start=start)
    if active is None or int(active.sum(1).max()) >= active.shape[1]:
        sums = sup_rank_sums(scores, pivots.scores, masks, **kernel)
        return torch.gather(sums, 2, group.unsqueeze(2)).squeeze(2)
    index, kept = padded_columns(active)
    sums = sup_rank_sums(scores, torch.gather(pivots.scores, 1, index), masks, **kernel)
    values = torch.gather(sums, 2, torch.gather(group, 1, index).unsqueeze(2)).squeeze(2) * kept
    return values.new_zeros(active.shape).scatter_add(1, index, values)
