"""Compiled kernels of the SupRank ``H^-`` and sigmoid sums on CPU and their gradient (numba; imported on first use).

In units of ``tau`` (``u = a_k - b_p``, ``a`` the scaled scores, ``b`` the scaled pivots), ``H^-`` is
``h(u) = start * H(u) + sigma(u)`` for ``fl(u) <= cap`` and ``start * H(u) + sigma(cap) + rho_tau (u - cap)`` beyond
(ROADMAP Eq. 4 = TPAMI Eq. 4; Smooth-AP's sigmoid: ``cap = inf``, ``start = rho_tau = 0``). Per row, with a centre
``m`` (the midpoint of the row's scores and pivots), ``sigma(a_k - b_p) = 1 / (1 + e_k f_p)``, ``e_k = exp(m - a_k)``,
``f_p = exp(b_p - m)``: ``M + P`` exponentials per row (:func:`exponentials`, torch's vectorised ``exp``), a multiply,
an add and a division per pair, in one vectorised loop with the branches.
The branch tests are the dense path's float tests in the arrays' dtype, ``a_k >= b_p`` and ``fl(a_k - b_p) > cap``.
Each row's values are computed in its :func:`exponentials` mode: ``FLOAT32`` (float32 scores spread over at most
:data:`SPREAD_FLOAT32`: the torch path's own precision, twice the vector width), ``FLOAT64`` (float64 scores, or
float32 ones spread wider), ``DIRECT`` (spread over :data:`SPREAD`, where ``e_k`` or ``f_p`` would overflow:
``exp(b_p - a_k)`` per pair, float64). Every sum over items is float64. The kernels release the GIL: rows are split
over threads (:class:`rankopt.threads.ThreadPool`).
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np
import torch

SPREAD = 1400.0
"""Largest spread ``max - min`` of a row's scaled scores and pivots for the factorised sigmoid: ``|a - m| <= 700``,
so ``exp`` of it stays a normal float64 (``exp(709)`` overflows)."""
SPREAD_FLOAT32 = 170.0
"""The same for float32 factors: ``|a - m| <= 85``, ``exp(85) < 2^123``. A product ``e_k f_p`` past float32's range
is ``inf``, giving ``sigma = 0`` and ``sigma' = 0``, the float32 values of ``sigma(u)`` there (``u < -88``)."""
FLOAT32, FLOAT64, DIRECT = 0, 1, 2
"""Row modes of :func:`exponentials`."""
_JIT = dict(nogil=True, cache=True, fastmath={"reassoc", "contract"}, error_model="numpy")
"""``reassoc``: the sums over items vectorise; ``error_model="numpy"``: no zero-division check, the division
vectorises."""


TILE = 512
"""Items per tile: a tile's scores, masks, factors and per-item buffers stay in L1 while every pivot passes over it."""


@nb.njit(inline="always", **_JIT)
def _value(s, beyond, excess, at_cap, rho_tau, step):  # pragma: no cover - compiled
    """``h`` from ``s = sigma(u)``: the linear branch ``at_cap + rho_tau (u - cap)`` where ``beyond``, plus the step."""
    return (at_cap + rho_tau * excess if beyond else s) + step


@nb.njit(inline="always", **_JIT)
def _values(a, b, e, f, direct, cap, start, rho_tau, out):  # pragma: no cover - compiled
    """``out[k] = h(a_k - b)`` in ``out``'s dtype, ``sigma = 1 / (1 + e_k f)`` (``direct``: ``1 / (1 + exp(b - a_k))``;
    a loop of its own, so that the common one vectorises)."""
    kind = out.dtype.type
    one, zero = kind(1.0), kind(0.0)
    at_cap, start, rho_tau = kind(1.0 / (1.0 + math.exp(-np.float64(cap)))), kind(start), kind(rho_tau)
    if direct:
        for k in range(a.shape[0]):
            s = kind(1.0 / (1.0 + math.exp(np.float64(b) - np.float64(a[k]))))
            out[k] = _value(s, a[k] - b > cap, kind(a[k]) - kind(b) - kind(cap), at_cap, rho_tau,
                            start if a[k] >= b else zero)
        return
    for k in range(a.shape[0]):
        s = one / (one + e[k] * f)
        out[k] = _value(s, a[k] - b > cap, kind(a[k]) - kind(b) - kind(cap), at_cap, rho_tau,
                        start if a[k] >= b else zero)


@nb.njit(inline="always", **_JIT)
def _add_masked(weights, lo, values, sums):  # pragma: no cover - compiled
    """``sums[g] += sum_k weights[g, lo + k] values[k]`` in float64 (``weights`` one row's ``(G, M)``: contiguous
    slices)."""
    for g in range(weights.shape[0]):
        w = weights[g, lo : lo + values.shape[0]]
        total = 0.0
        for k in range(values.shape[0]):
            total += np.float64(w[k] * values[k])
        sums[g] += total


@nb.njit(**_JIT)
def surrogate_sums(scaled, pivots, weights, e, f, e32, f32, mode, cap, start, rho_tau,  # pragma: no cover - compiled
                   out, first, last):
    """``out[c, g, p] = sum_k w[c, g, k] h(a_k - b_p)`` for rows ``first <= c < last`` (``h``: module docstring), over
    tiles of :data:`TILE` items; ``scaled`` ``(C, M)``, ``pivots`` ``(C, P)``, ``weights`` ``(C, G, M)``, ``cap`` of
    their dtype, ``out`` ``(C, G, P)``; ``e``, ``f``, ``e32``, ``f32``, ``mode`` from :func:`exponentials`."""
    width, num_pivots, num_masks = scaled.shape[1], pivots.shape[1], weights.shape[1]
    wide, narrow, sums = np.empty(TILE), np.empty(TILE, np.float32), np.empty((num_masks, num_pivots))
    for c in range(first, last):
        sums[:] = 0.0
        for lo in range(0, width, TILE):
            hi = min(width, lo + TILE)
            a, w = scaled[c, lo:hi], weights[c]
            for p in range(num_pivots):
                if mode[c] == FLOAT32:
                    values32 = narrow[: hi - lo]
                    _values(a, pivots[c, p], e32[c, lo:hi], f32[c, p], False, cap, start, rho_tau, values32)
                    _add_masked(w, lo, values32, sums[:, p])
                else:
                    values = wide[: hi - lo]
                    _values(a, pivots[c, p], e[c, lo:hi], f[c, p], mode[c] == DIRECT, cap, start, rho_tau, values)
                    _add_masked(w, lo, values, sums[:, p])
        out[c] = sums


@nb.njit(inline="always", **_JIT)
def _slope_terms(a, b, e, f, direct, cap, rho_tau, mixed, terms):  # pragma: no cover - compiled
    """``terms[k] += h'(a_k - b) mixed[k]`` (``h' = sigma (1 - sigma)``, ``rho_tau`` beyond ``cap``) in ``mixed``'s
    dtype, summed in float64; returns their sum."""
    kind = mixed.dtype.type
    one, slope = kind(1.0), kind(rho_tau)
    part = 0.0
    if direct:
        for k in range(a.shape[0]):
            s = kind(1.0 / (1.0 + math.exp(np.float64(b) - np.float64(a[k]))))
            term = np.float64((slope if a[k] - b > cap else s - s * s) * mixed[k])
            terms[k] += term
            part += term
        return part
    for k in range(a.shape[0]):
        s = one / (one + e[k] * f)
        term = np.float64((slope if a[k] - b > cap else s - s * s) * mixed[k])
        terms[k] += term
        part += term
    return part


@nb.njit(inline="always", **_JIT)
def _mix(weights, lo, grad, out):  # pragma: no cover - compiled
    """``out[k] = sum_g grad[g] weights[g, lo + k]`` in ``out``'s dtype (``weights`` one row's ``(G, M)``)."""
    kind = out.dtype.type
    out[:] = 0.0
    for g in range(weights.shape[0]):
        w, factor = weights[g, lo : lo + out.shape[0]], kind(grad[g])
        for k in range(out.shape[0]):
            out[k] += factor * w[k]


@nb.njit(**_JIT)
def surrogate_gradient(scaled, pivots, weights, e, f, e32, f32, mode, cap, grad, rho_tau,  # pragma: no cover - compiled
                       d_scores, d_pivots, first, last):
    """The gradient of ``sum_{g, p} grad[c, g, p] out[c, g, p]`` (:func:`surrogate_sums`) w.r.t. ``a`` and ``b`` for
    rows ``first <= c < last``: with ``h'(u) = sigma (1 - sigma)`` (``rho_tau`` beyond ``cap``) and
    ``t_pk = h'(a_k - b_p) sum_g grad[c, g, p] w[c, g, k]``, ``d_scores[c, k] = sum_p t_pk``,
    ``d_pivots[c, p] = -sum_k t_pk``."""
    width, num_pivots = scaled.shape[1], pivots.shape[1]
    wide, narrow, total, pivot = np.empty(TILE), np.empty(TILE, np.float32), np.empty(TILE), np.empty(num_pivots)
    for c in range(first, last):
        pivot[:] = 0.0
        for lo in range(0, width, TILE):
            hi = min(width, lo + TILE)
            a, w, t = scaled[c, lo:hi], weights[c], total[: hi - lo]
            t[:] = 0.0
            for p in range(num_pivots):
                if mode[c] == FLOAT32:
                    mixed32 = narrow[: hi - lo]
                    _mix(w, lo, grad[c, :, p], mixed32)
                    pivot[p] -= _slope_terms(a, pivots[c, p], e32[c, lo:hi], f32[c, p], False, cap, rho_tau, mixed32, t)
                else:
                    mixed = wide[: hi - lo]
                    _mix(w, lo, grad[c, :, p], mixed)
                    pivot[p] -= _slope_terms(a, pivots[c, p], e[c, lo:hi], f[c, p], mode[c] == DIRECT, cap, rho_tau,
                                             mixed, t)
            d_scores[c, lo:hi] = t
        d_pivots[c] = pivot


def exponentials(scaled: torch.Tensor, pivots: torch.Tensor) -> tuple[np.ndarray, ...]:
    """The factors of the sigmoid per row: ``e = exp(m - a)`` ``(C, M)``, ``f = exp(b - m)`` ``(C, P)`` (float64), ``m``
    the midpoint of the row's lowest and highest scaled score or pivot; their float32 copies (empty unless a row is in
    ``FLOAT32`` mode); and each row's mode ``(C,)`` (module docstring: by dtype and spread)."""
    low = torch.minimum(scaled.amin(1), pivots.amin(1)).double() if pivots.shape[1] else scaled.amin(1).double()
    high = torch.maximum(scaled.amax(1), pivots.amax(1)).double() if pivots.shape[1] else scaled.amax(1).double()
    centre = ((low + high) / 2).unsqueeze(1)
    e = torch.sub(centre, scaled).exp_()
    f = torch.sub(pivots, centre).exp_()
    spread = high - low
    narrow = spread <= SPREAD_FLOAT32 if scaled.dtype == torch.float32 else torch.zeros_like(spread, dtype=torch.bool)
    mode = torch.where(spread > SPREAD, DIRECT, torch.where(narrow, FLOAT32, FLOAT64)).to(torch.int8)
    e32, f32 = (e.float(), f.float()) if bool(narrow.any()) else (torch.empty(0, 0), torch.empty(0, 0))
    return e.numpy(), f.numpy(), e32.numpy(), f32.numpy(), mode.numpy()
