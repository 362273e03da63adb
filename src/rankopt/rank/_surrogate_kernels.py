"""Compiled kernels of the SupRank ``H^-`` and sigmoid sums on CPU and their gradient (numba; imported on first use).

In units of ``tau`` (``u = a_k - b_p``, ``a`` the scaled scores, ``b`` the scaled pivots), ``H^-`` is
``h(u) = start * H(u) + sigma(u)`` for ``fl(u) <= cap`` and ``start * H(u) + sigma(cap) + rho_tau (u - cap)`` beyond
(ROADMAP Eq. 4 = TPAMI Eq. 4; Smooth-AP's sigmoid: ``cap = inf``, ``start = rho_tau = 0``). Per row, with a centre
``m`` (the midpoint of the row's scores and pivots), ``sigma(a_k - b_p) = 1 / (1 + e_k f_p)``, ``e_k = exp(m - a_k)``,
``f_p = exp(b_p - m)``: ``M + P`` exponentials per row (:func:`exponentials`, torch's vectorised ``exp``), a multiply, an add and a division
per pair (vectorised).
The branch tests are the dense path's float tests in the arrays' dtype, ``a_k >= b_p`` and ``fl(a_k - b_p) > cap``;
the values and sums are float64. A row whose scores and pivots spread over more than :data:`SPREAD` (``e_k`` or
``f_p`` would overflow) takes ``exp(b_p - a_k)`` per pair. The kernels release the GIL: rows are split over threads
(:class:`rankopt.threads.ThreadPool`).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
import torch

SPREAD = 1400.0
"""Largest spread ``max - min`` of a row's scaled scores and pivots for the factorised sigmoid: ``|a - m| <= 700``,
so ``exp`` of it stays a normal float64 (``exp(709)`` overflows)."""
_JIT = dict(nogil=True, cache=True, fastmath={"reassoc", "contract"}, error_model="numpy")
"""``reassoc``: the sums over items vectorise; ``error_model="numpy"``: no zero-division check, the division vectorises."""


TILE = 512
"""Items per tile: a tile's scores, masks, factors and per-item buffers stay in L1 while every pivot passes over it."""


@nb.njit(inline="always", **_JIT)
def _logistic(a, b, e, f, direct, out):  # pragma: no cover - compiled
    """``out[k] = sigma(a_k - b) = 1 / (1 + e_k f)`` (``direct``: ``1 / (1 + exp(b - a_k))``)."""
    if direct:
        for k in range(a.shape[0]):
            out[k] = 1.0 / (1.0 + math.exp(np.float64(b) - np.float64(a[k])))
        return
    for k in range(a.shape[0]):
        out[k] = 1.0 / (1.0 + e[k] * f)


@nb.njit(**_JIT)
def surrogate_sums(scaled, pivots, weights, e, f, direct, cap, start, rho_tau, out, first, last):  # pragma: no cover - compiled
    """``out[c, g, p] = sum_k w[c, g, k] h(a_k - b_p)`` for rows ``first <= c < last`` (``h``: module docstring), over
    tiles of :data:`TILE` items; ``scaled`` ``(C, M)``, ``pivots`` ``(C, P)``, ``weights`` ``(C, G, M)``, ``cap`` of
    their dtype, ``out`` ``(C, G, P)``; ``e`` ``(C, M)``, ``f`` ``(C, P)`` float64, ``direct`` ``(C,)`` from :func:`exponentials`."""
    width, num_pivots, num_masks = scaled.shape[1], pivots.shape[1], weights.shape[1]
    at_cap = 1.0 / (1.0 + math.exp(-np.float64(cap)))
    value, sums = np.empty(TILE), np.empty((num_masks, num_pivots))
    for c in range(first, last):
        sums[:] = 0.0
        for lo in range(0, width, TILE):
            hi = min(width, lo + TILE)
            a, v = scaled[c, lo:hi], value[: hi - lo]
            for p in range(num_pivots):
                b = pivots[c, p]
                _logistic(a, b, e[c, lo:hi], f[c, p], direct[c], v)
                for k in range(hi - lo):
                    beyond = at_cap + rho_tau * (np.float64(a[k]) - np.float64(b) - np.float64(cap))
                    v[k] = start * (a[k] >= b) + (beyond if a[k] - b > cap else v[k])
                for g in range(num_masks):
                    w = weights[c, g, lo:hi]
                    total = 0.0
                    for k in range(hi - lo):
                        total += w[k] * v[k]
                    sums[g, p] += total
        out[c] = sums


@nb.njit(**_JIT)
def surrogate_gradient(scaled, pivots, weights, e, f, direct, cap, grad, rho_tau, d_scores, d_pivots, first, last):  # pragma: no cover - compiled
    """The gradient of ``sum_{g, p} grad[c, g, p] out[c, g, p]`` (:func:`surrogate_sums`) w.r.t. ``a`` and ``b`` for
    rows ``first <= c < last``: with ``h'(u) = sigma (1 - sigma)`` (``rho_tau`` beyond ``cap``) and
    ``t_pk = h'(a_k - b_p) sum_g grad[c, g, p] w[c, g, k]``, ``d_scores[c, k] = sum_p t_pk``, ``d_pivots[c, p] = -sum_k t_pk``."""
    width, num_pivots, num_masks = scaled.shape[1], pivots.shape[1], weights.shape[1]
    slope, mixed, total, pivot = np.empty(TILE), np.empty(TILE), np.empty(TILE), np.empty(num_pivots)
    for c in range(first, last):
        pivot[:] = 0.0
        for lo in range(0, width, TILE):
            hi = min(width, lo + TILE)
            a, s, m, t = scaled[c, lo:hi], slope[: hi - lo], mixed[: hi - lo], total[: hi - lo]
            t[:] = 0.0
            for p in range(num_pivots):
                b = pivots[c, p]
                _logistic(a, b, e[c, lo:hi], f[c, p], direct[c], s)
                for k in range(hi - lo):
                    s[k] = rho_tau if a[k] - b > cap else s[k] - s[k] * s[k]
                m[:] = 0.0
                for g in range(num_masks):
                    w, factor = weights[c, g, lo:hi], np.float64(grad[c, g, p])
                    for k in range(hi - lo):
                        m[k] += factor * w[k]
                part = 0.0
                for k in range(hi - lo):
                    term = s[k] * m[k]
                    t[k] += term
                    part += term
                pivot[p] -= part
            d_scores[c, lo:hi] = t
        d_pivots[c] = pivot


def exponentials(scaled: torch.Tensor, pivots: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The factors of the sigmoid per row: ``e = exp(m - a)`` ``(C, M)``, ``f = exp(b - m)`` ``(C, P)`` (float64), ``m``
    the midpoint of the row's lowest and highest scaled score or pivot, and ``direct`` ``(C,)``: rows spread over
    :data:`SPREAD` (their ``e`` and ``f`` are not used)."""
    low = torch.minimum(scaled.amin(1), pivots.amin(1)).double() if pivots.shape[1] else scaled.amin(1).double()
    high = torch.maximum(scaled.amax(1), pivots.amax(1)).double() if pivots.shape[1] else scaled.amax(1).double()
    centre = ((low + high) / 2).unsqueeze(1)
    e = torch.sub(centre, scaled).exp_()
    f = torch.sub(pivots, centre).exp_()
    return e.numpy(), f.numpy(), (high - low > SPREAD).numpy()
