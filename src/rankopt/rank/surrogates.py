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
        positive = (levels > 0) & valid
        counts = positive.sum(1)
        num = max(1, int(counts.max())) if counts.numel() else 1
        rows, cols = positive.nonzero(as_tuple=True)
        slot = torch.arange(rows.numel(), device=rows.device) - (counts.cumsum(0) - counts)[rows]
        self.index = torch.zeros(positive.shape[0], num, dtype=torch.long, device=scores.device)
        self.index[rows, slot] = cols
        self.present = torch.arange(num, device=scores.device) < counts.unsqueeze(1)
        self.scores = torch.gather(scores, 1, self.index)
        self.levels = torch.gather(levels, 1, self.index).long() * self.present

    def pair_mask(self) -> torch.Tensor:
        """``(C, P, P)`` bool: both pivots present and distinct (``j != k`` by index)."""
        both = self.present.unsqueeze(2) & self.present.unsqueeze(1)
        return both & ~torch.eye(self.index.shape[1], dtype=torch.bool, device=self.index.device)

    def positive_rank(self) -> torch.Tensor:
        """Exact ``rank^+(k) = 1 + sum_{j != k, l_j >= l_k} H(s_j - s_k)`` (TPAMI Eq. 3), ``(C, P)``, no gradient."""
        weights = self.pair_mask() & (self.levels.unsqueeze(1) >= self.levels.unsqueeze(2))
        return 1.0 + pairwise_step_counts(self.scores, self.scores, weights.to(self.scores.dtype))

    def lower_masks(self, levels: torch.Tensor, valid: torch.Tensor, num_levels: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``Omega_k^<`` as ``G = L`` float masks ``(C, L, M)`` (mask ``g``: valid items of level ``<= g``)
        and each pivot's mask index ``level - 1``, ``(C, P)``."""
        bounds = torch.arange(num_levels, device=levels.device, dtype=levels.dtype).view(1, -1, 1)
        masks = torch.le(levels.unsqueeze(1), bounds, out=self.scores.new_empty(levels.shape[0], num_levels, levels.shape[1]))
        return masks.mul_(valid.unsqueeze(1)), (self.levels - 1).clamp(min=0)


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
) -> torch.Tensor:
    """``rank_s^-(k) = sum_{j in Omega_k^<} H^-(s_j - s_k)`` (TPAMI Eq. 5), ``(C, P)``; pivot ``k`` uses mask ``group[c, k]``."""
    sums = sup_rank_sums(scores, pivots.scores, masks, tau=tau, rho=rho, delta=delta, start=start)
    return torch.gather(sums, 2, group.unsqueeze(2)).squeeze(2)
