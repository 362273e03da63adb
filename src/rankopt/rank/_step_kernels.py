"""Compiled kernel of the exact per-level step sums on CPU (numba; imported on first use).

Each row's float32 scores are packed with their column and level into int64 keys
``(order-preserving score bits << 32) | (column << 8) | level`` (:func:`pack_keys`) and sorted by numpy (one value
sort, no argsort); :func:`walk_sums` then walks each sorted row once from the top, tie group by tie group.
:func:`step_sums` does the three over blocks of rows; all release the GIL, so the caller splits the rows over threads.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from rankopt.kernels import LEVEL_BITS

BLOCK_KEYS = 1 << 16
"""Keys packed, sorted and walked at once (512 KiB of int64: they stay in L2 from the packing to the walk)."""


@nb.njit(nogil=True, cache=True)
def pack_keys(bits: np.ndarray, levels: np.ndarray, keys: np.ndarray) -> None:  # pragma: no cover - compiled
    """``keys[c, k] = (f(bits[c, k]) << 32) | (k << 8) | levels[c, k]``: ``bits`` the int32 view of float32 scores
    (no NaN), ``f`` the order-preserving map of float32 bits to int32 (negative floats' magnitude bits flipped;
    ``-0.0`` taken as ``+0.0``: equal scores, equal keys up to the column), levels in ``[0, 256)``."""
    for c in range(bits.shape[0]):
        for k in range(bits.shape[1]):
            b = bits[c, k]
            b = 0 if b == -(1 << 31) else b ^ ((b >> 31) & 0x7FFFFFFF)
            keys[c, k] = (np.int64(b) << 32) | (k << LEVEL_BITS) | levels[c, k]


@nb.njit(nogil=True, cache=True)
def walk_sums(keys: np.ndarray, weights: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """``out[c, k, q] = sum_{j : s_j >= s_k} weights[c, l_j, l_k * Q + q]`` from the sorted keys of :func:`pack_keys`
    (``weights`` ``(C, L + 1, (L + 1) Q)`` float64, row ``l_j = 0`` zero): one pass per row from the highest score down,
    each tie group added to the running sums ``((L + 1) Q,)`` before its members read them (``H(0) = 1``);
    float64 sums written in ``out``'s dtype."""
    rows, width = keys.shape
    num_out, size = out.shape[2], weights.shape[2]
    running = np.zeros(size)
    for c in range(rows):
        running[:] = 0.0
        row_keys, row_weights, row_out = keys[c], weights[c], out[c]
        end = width
        while end > 0:
            score = row_keys[end - 1] >> 32
            start = end
            while start > 0 and row_keys[start - 1] >> 32 == score:
                start -= 1
                item = row_weights[row_keys[start] & 0xFF]
                for j in range(size):
                    running[j] += item[j]
            for i in range(start, end):
                key = row_keys[i]
                column, first = (key & 0xFFFFFFFF) >> LEVEL_BITS, (key & 0xFF) * num_out
                for q in range(num_out):
                    row_out[column, q] = running[first + q]
            end = start


def step_sums(bits: np.ndarray, levels: np.ndarray, weights: np.ndarray, out: np.ndarray) -> None:
    """:func:`walk_sums` of the rows of ``bits`` (:func:`pack_keys`) into ``out``, over blocks of :data:`BLOCK_KEYS`
    keys (at least one row)."""
    step = max(1, BLOCK_KEYS // max(1, bits.shape[1]))
    keys = np.empty((min(step, bits.shape[0]), bits.shape[1]), np.int64)
    for first in range(0, bits.shape[0], step):
        rows = slice(first, first + step)
        block = keys[: min(step, bits.shape[0] - first)]
        pack_keys(bits[rows], levels[rows], block)
        block.sort(axis=1)
        walk_sums(block, weights[rows], out[rows])
