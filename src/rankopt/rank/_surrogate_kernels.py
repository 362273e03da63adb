"""Compiled kernels of the step and linear parts of the SupRank sums on CPU (numba; imported on first use).

In units of ``tau`` (``u = a_k - b_p``, ``a`` the scaled scores, ``b`` the scaled pivots), ``H^-`` is
``sigma(min(u, cap)) + start * H(u) + rho_tau * [u > cap] (u - cap)`` (ROADMAP Eq. 4). The last two terms are
counts and sums over the items above a threshold. Both tests, ``a_k >= b_p`` and ``fl(a_k - b_p) > cap`` (the very
float tests of the dense path), are monotone in ``b_p``: with each row's pivots sorted, item ``k`` passes a prefix
of them, whose length is counted without branches (vectorised over the items); every item is added to the bin of
that length and suffix sums of the bins give every pivot's counts and sums (float64), the gradient prefix sums
over the sorted pivots. No ``(A, M)`` temporary. Both run in the calling thread.
"""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(inline="always")
def _count_above(scores, ascending, passed) -> None:  # pragma: no cover - compiled
    """``passed[k] = #{i : a_k >= b_i}``: item ``k`` passes the ascending pivots ``i < passed[k]``."""
    passed[:] = 0
    for i in range(ascending.shape[0]):
        b = ascending[i]
        for k in range(scores.shape[0]):
            passed[k] += scores[k] >= b


@nb.njit(inline="always")
def _count_beyond(scores, ascending, cap, passed) -> None:  # pragma: no cover - compiled
    """``passed[k] = #{i : fl(a_k - b_i) > cap}`` (the difference rounded in the arrays' dtype, non-increasing
    in ``b_i``): item ``k`` is on the linear branch of the ascending pivots ``i < passed[k]``."""
    passed[:] = 0
    for i in range(ascending.shape[0]):
        b = ascending[i]
        for k in range(scores.shape[0]):
            passed[k] += scores[k] - b > cap


@nb.njit(nogil=True, cache=True)
def step_linear_sums(scaled, pivots, weights, cap, start, rho_tau, out, beyond):  # pragma: no cover - compiled
    """``out[c, g, p] = start * sum_k w_gk [a_k >= b_p] + rho_tau * sum_k w_gk [a_k - b_p > cap] (a_k - b_p - cap)``
    and ``beyond[c, g, p] = sum_k w_gk [a_k - b_p > cap]``; ``scaled`` ``(C, M)``, ``pivots`` ``(C, A)``,
    ``weights`` ``(C, G, M)``, ``cap`` of the scores' dtype. The linear sum is ``sum a_k - n (b_p + cap)`` in float64."""
    rows, width = scaled.shape
    num_pivots, num_masks = pivots.shape[1], weights.shape[1]
    bins = np.zeros((3, num_masks, num_pivots + 1))  # by bin: weight of the items >= b, beyond-cap weight, beyond-cap w a
    above, far = np.empty(width, np.int32), np.empty(width, np.int32)
    for c in range(rows):
        order = np.argsort(pivots[c])
        ascending = pivots[c][order]
        _count_above(scaled[c], ascending, above)
        _count_beyond(scaled[c], ascending, cap, far)
        bins[:] = 0.0
        for k in range(width):
            if above[k] == 0:
                continue
            a = scaled[c, k]
            for g in range(num_masks):
                w = weights[c, g, k]
                bins[0, g, above[k]] += w
                bins[1, g, far[k]] += w
                bins[2, g, far[k]] += w * a
        for g in range(num_masks):  # pivot i (ascending) is passed by the items of the bins > i
            count = far_count = far_sum = 0.0
            for i in range(num_pivots - 1, -1, -1):
                count += bins[0, g, i + 1]
                far_count += bins[1, g, i + 1]
                far_sum += bins[2, g, i + 1]
                p = order[i]
                out[c, g, p] = start * count + rho_tau * (far_sum - far_count * (np.float64(ascending[i]) + np.float64(cap)))
                beyond[c, g, p] = far_count


@nb.njit(nogil=True, cache=True)
def add_linear_gradient(scaled, pivots, weights, grad, cap, slope, out):  # pragma: no cover - compiled
    """``out[c, k] += slope * sum_g w_gk sum_{p : a_k - b_p > cap} grad[c, g, p]``: the score side of the linear
    branch's gradient (``grad`` ``(C, G, A)``), from prefix sums of ``grad`` over each row's pivots sorted."""
    rows, width = scaled.shape
    num_pivots, num_masks = pivots.shape[1], weights.shape[1]
    prefix = np.zeros((num_masks, num_pivots + 1))
    far = np.empty(width, np.int32)
    for c in range(rows):
        order = np.argsort(pivots[c])
        for g in range(num_masks):
            for i in range(num_pivots):
                prefix[g, i + 1] = prefix[g, i] + grad[c, g, order[i]]
        _count_beyond(scaled[c], pivots[c][order], cap, far)
        for k in range(width):
            if far[k] == 0:
                continue
            total = 0.0
            for g in range(num_masks):
                total += weights[c, g, k] * prefix[g, far[k]]
            out[c, k] += slope * total
