"""Compiled kernels of the fused per-image transform (numba; imported on first use).

A resize (Gaussian blur then bilinear, :func:`rankopt.data.fast_transform.antialiased_resize`), a window
of the result (center crop, or a random crop resized bilinearly) and a flip are linear maps acting on
rows and columns separately, so the model input is ``out_c = s_c (R X_c C^T) + b_c`` with ``X_c`` the
uint8 channel, ``R`` (h x H) and ``C`` (w x W) each row's composed weights over a contiguous run of
source rows / columns (:func:`axis_taps`), and ``s_c = 1 / (255 std_c)``, ``b_c = -mean_c / std_c``
(:func:`render`). Only the output window is computed, straight from the decoded image: no float copy
of it, no intermediate image. Weights are composed in float64, the image is filtered in float32.
Every kernel allocates its own buffers and releases the GIL: callable from several threads at once.
"""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(nogil=True, cache=True)
def _gaussian(size: int, sigma: float) -> np.ndarray:  # pragma: no cover - compiled
    """``g_k = exp(-(k - size // 2)^2 / (2 sigma^2)) / sum`` (size 1: ``[1]``), the blur of ``_gaussian_kernel``."""
    g = np.ones(size)
    if size == 1:
        return g
    sigma32 = np.float64(np.float32(sigma))  # torch's kernel takes sigma as float32
    for k in range(size):
        x = k - size // 2
        g[k] = np.exp(-(x * x) / (2.0 * sigma32 * sigma32))
    return g / g.sum()


@nb.njit(nogil=True, cache=True)
def _source(t: int, length: int, target: int, align_corners: bool) -> tuple[int, int, float, float]:  # pragma: no cover
    """Bilinear source of output ``t`` of ``length -> target`` as torch's ``upsample_bilinear2d`` computes it
    (float32 positions): ``x = t (L - 1) / (T - 1)`` aligned, else ``max((t + 1/2) L / T - 1/2, 0)``;
    returns ``(i0, i1, 1 - lambda, lambda)`` with ``i0 = floor(x)``, ``i1 = min(i0 + 1, L - 1)``."""
    if align_corners:
        scale = np.float32(length - 1) / np.float32(target - 1) if target > 1 else np.float32(0.0)
        x = scale * np.float32(t)
    else:
        scale = np.float32(length) / np.float32(target)
        x = scale * (np.float32(t) + np.float32(0.5)) - np.float32(0.5)
        x = max(x, np.float32(0.0))
    i0 = min(int(x), length - 1)
    lam = min(max(np.float64(x) - i0, 0.0), 1.0)
    return i0, min(i0 + 1, length - 1), 1.0 - lam, lam


@nb.njit(nogil=True, cache=True)
def _reflect(i: int, length: int) -> int:  # pragma: no cover - compiled
    """Reflected border (index ``-s`` is ``s``, ``L - 1 + s`` is ``L - 1 - s``), clamped into the axis."""
    if i < 0:
        i = -i
    if i > length - 1:
        i = 2 * (length - 1) - i
    return min(max(i, 0), length - 1)


@nb.njit(nogil=True, cache=True)
def axis_taps(length: int, resized: int, blur: int, sigma: float, align_resize: bool, offset: int, window: int,
              target: int, align_window: bool, flip: bool) -> tuple[np.ndarray, np.ndarray]:  # pragma: no cover
    """One axis's composed map: ``length`` -> blur (``blur`` taps, reflected border; 1: none) -> bilinear to
    ``resized`` -> positions ``offset .. offset + window - 1`` -> bilinear to ``target`` (the identity when
    ``window == target``) -> reversed if ``flip``. Output ``u`` is ``sum_b weights[u, b] x[starts[u] + b]``:
    ``(target,)`` int64 starts and ``(target, taps)`` float32 weights, ends zero in float32 trimmed,
    ``starts[u] + taps <= length``.
    """
    g = _gaussian(blur, sigma)
    half = blur // 2
    lo = np.empty(target, np.int64)
    hi = np.empty(target, np.int64)
    for u in range(target):
        c0, c1, a0, a1 = _source(u, window, target, align_window) if window != target else (u, u, 1.0, 0.0)
        lo[u] = max(_source(offset + c0, length, resized, align_resize)[0] - half, 0)
        hi[u] = min(_source(offset + c1, length, resized, align_resize)[1] + half, length - 1)
    dense = np.zeros((target, int((hi - lo).max()) + 1))
    for u in range(target):
        c0, c1, a0, a1 = _source(u, window, target, align_window) if window != target else (u, u, 1.0, 0.0)
        for c, a in ((c0, a0), (c1, a1)):
            if a == 0.0:
                continue
            y0, y1, m0, m1 = _source(offset + c, length, resized, align_resize)
            for y, m in ((y0, m0), (y1, m1)):
                if m == 0.0:
                    continue
                for k in range(blur):
                    dense[u, _reflect(y + k - half, length) - lo[u]] += a * m * g[k]
    first = np.empty(target, np.int64)
    taps = 1
    for u in range(target):
        nonzero = np.flatnonzero(dense[u].astype(np.float32))  # weights that stay nonzero in float32
        first[u] = nonzero[0]
        taps = max(taps, nonzero[-1] - nonzero[0] + 1)
    starts = np.empty(target, np.int64)
    weights = np.zeros((target, taps), np.float32)
    for u in range(target):
        start = min(lo[u] + first[u], length - taps)
        starts[u] = start
        for b in range(taps):
            src = start + b - lo[u]
            if 0 <= src < dense.shape[1]:
                weights[u, b] = dense[u, src]
    if flip:
        return starts[::-1].copy(), weights[::-1].copy()
    return starts, weights


@nb.njit(nogil=True, cache=True)
def render(pixels: np.ndarray, row_starts: np.ndarray, row_weights: np.ndarray, col_starts: np.ndarray,
           col_weights: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:  # pragma: no cover
    """``(H, 3 W)`` uint8 RGB rows -> ``(3, h, w)`` float32: ``out[c, i, j] = scale_c sum_{a, b} R[i, a] C[j, b]
    x[r_i + a, c_j + b, c] + bias_c``: each output row from its source rows (over the columns in use), then
    each output pixel from that row."""
    h, row_taps = row_weights.shape
    w, col_taps = col_weights.shape
    first = col_starts.min()
    span = (col_starts.max() + col_taps - first) * 3
    line = np.empty(span, np.float32)  # one output row before the column pass: (columns in use, 3)
    out = np.empty((3, h, w), np.float32)
    for i in range(h):
        line[:] = 0.0
        for a in range(row_taps):
            weight = row_weights[i, a]
            if weight != 0.0:
                src = pixels[row_starts[i] + a, first * 3 : first * 3 + span]  # slices: the loops vectorize
                for k in range(span):
                    line[k] += weight * np.float32(src[k])
        red, green, blue = out[0, i], out[1, i], out[2, i]
        for j in range(w):
            start = (col_starts[j] - first) * 3
            window = line[start : start + 3 * col_taps]
            weights = col_weights[j]
            r = weights[0] * window[0]
            g = weights[0] * window[1]
            b = weights[0] * window[2]
            for t in range(1, col_taps):
                r += weights[t] * window[3 * t]
                g += weights[t] * window[3 * t + 1]
                b += weights[t] * window[3 * t + 2]
            red[j] = r * scale[0] + bias[0]
            green[j] = g * scale[1] + bias[1]
            blue[j] = b * scale[2] + bias[2]
    return out
