"""Compiled kernels of the per-query calibration hinges on CPU (numba; imported on first use).

One pass over a block of rows reads each score, level and membership once: the forward sums
``[alpha - s]_+`` over the positives and ``[s - beta]_+`` over the negatives of each row; the backward
writes ``grad_out_i * d L_i / d s_ij`` straight into the gradient. Same values as the torch
expressions of :class:`rankopt.losses.calibration.CalibrationLoss` (its ``method="reference"``), which
make several ``(C, M)`` temporaries; the sums accumulate in float64. Both run in the calling thread.
"""

from __future__ import annotations

import numba as nb
import numpy as np


@nb.njit(nogil=True, cache=True)
def hinge_sums(scores: np.ndarray, levels: np.ndarray, valid: np.ndarray, alpha: float, beta: float,
               out: np.ndarray) -> None:  # pragma: no cover - compiled
    """``out[i, 0] = sum_{j in P_i} [alpha - s_ij]_+``, ``out[i, 1] = sum_{j in N_i} [s_ij - beta]_+``
    (``P_i``: valid with level > 0; ``N_i``: valid with level 0)."""
    rows, width = scores.shape
    for i in range(rows):
        below = 0.0
        above = 0.0
        for j in range(width):
            if valid[i, j]:
                s = scores[i, j]
                if levels[i, j] > 0:
                    if s < alpha:
                        below += alpha - s
                elif s > beta:
                    above += s - beta
        out[i, 0] = below
        out[i, 1] = above


@nb.njit(nogil=True, cache=True)
def hinge_gradient(scores: np.ndarray, levels: np.ndarray, valid: np.ndarray, alpha: float, beta: float,
                   positive_weight: np.ndarray, negative_weight: np.ndarray,  # pragma: no cover - compiled
                   out: np.ndarray) -> None:
    """``out[i, j] = -positive_weight[i]`` on the positives with ``s < alpha``, ``negative_weight[i]`` on the
    negatives with ``s > beta``, 0 elsewhere (weights: ``grad_out_i / |P_i|`` and ``grad_out_i / |N_i|``)."""
    rows, width = scores.shape
    for i in range(rows):
        below = -positive_weight[i]
        above = negative_weight[i]
        for j in range(width):
            s = scores[i, j]
            g = 0.0
            if valid[i, j]:
                if levels[i, j] > 0:
                    if s < alpha:
                        g = below
                elif s > beta:
                    g = above
            out[i, j] = g
