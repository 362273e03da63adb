"""Compiled kernel of the exact per-level step counts on CPU (numba; imported on first use).

Each row's float32 scores are packed with their column into int64 keys
``(order-preserving score bits << 32) | column`` and sorted by numpy (one value sort, no
argsort); :func:`walk_counts` then walks each sorted row once from the top, tie group by tie group.
Both run in the calling thread: on a thread pool they would compete with torch's spinning OpenMP threads.
"""

from __future__ import annotations

import numba as nb
import numpy as np

COLUMN_BITS = 32
COLUMN_MASK = (1 << COLUMN_BITS) - 1


def sorted_keys(scores: np.ndarray) -> np.ndarray:
    """``(C, K)`` int64 keys ``(f(s) << 32) | k`` sorted along each row, ``f`` the order-preserving map of float32
    bits to int32 (negative floats' magnitude bits flipped). ``scores`` must be float32 without ``-0.0``
    (equal scores must have equal bits) and without NaN."""
    bits = scores.view(np.int32)
    keys = (bits ^ ((bits >> 31) & 0x7FFFFFFF)).astype(np.int64) << COLUMN_BITS
    keys |= np.arange(scores.shape[1], dtype=np.int64)
    keys.sort(axis=1)
    return keys


@nb.njit(nogil=True, cache=True)
def walk_counts(keys: np.ndarray, levels: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover - compiled
    """``out[c, k, m - 1] = #{j : levels[c, j] = m, s_j >= s_k}`` for ``m = 1..L`` (``L = out.shape[2]``;
    level 0 counted nowhere) from the sorted ``keys`` of :func:`sorted_keys`: one pass per row from the
    highest score down, each tie group counted before its members are written (``H(0) = 1``)."""
    rows, width = keys.shape
    num_levels = out.shape[2]
    counts = np.zeros(num_levels + 1, np.int64)
    for c in range(rows):
        counts[:] = 0
        end = width
        while end > 0:
            score = keys[c, end - 1] >> COLUMN_BITS
            start = end - 1
            while start > 0 and keys[c, start - 1] >> COLUMN_BITS == score:
                start -= 1
            for i in range(start, end):
                counts[levels[c, keys[c, i] & COLUMN_MASK]] += 1
            for i in range(start, end):
                k = keys[c, i] & COLUMN_MASK
                for m in range(num_levels):
                    out[c, k, m] = counts[m + 1]
            end = start

