"""Open-set decisions: the similarity threshold of a target false-match rate, calibrated on a labelled split.

Every pair ``i < j`` of the split's embeddings is scored (:func:`rankopt.metrics.verification.all_pairs_scores`),
genuine when the two share their finest label, else an impostor. At threshold ``t`` (a match: ``s >= t``)

    FMR(t) = #{impostor pairs: s >= t} / #impostor pairs        (= FAR)
    FNMR(t) = #{genuine pairs: s < t} / #genuine pairs           (= 1 - TAR)

and the threshold of a target FMR is ``t* = min {t : FMR(t) <= target}`` over ``+inf`` and every distinct
score (:func:`rankopt.metrics.verification.operating_points`, the TAR@FAR machinery): the FMR never exceeds
the target and no lower threshold keeps it. When even the highest score group holds too many impostors,
``t*`` is the float32 just above the highest score (nothing matches). A target needs at least ``1 / FMR``
impostor pairs to be measurable; fewer is an error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch

from rankopt.metrics.verification import DEFAULT_FARS, all_pairs_scores, operating_points

CURVE_POINTS = 200
"""FMR targets (log-spaced) at which the figure's FNMR-vs-FMR curve is drawn."""


@dataclass
class Calibration:
    """``threshold``: what :meth:`Index.set_threshold` stores (``value``, ``fmr``, ``achieved_fmr``, ``fnmr``,
    pair counts, ``similarity``, ``created_utc`` and the caller's ``source``); ``table``: FNMR@FMR rows
    (``fmr``, ``threshold``, ``achieved_fmr``, ``fnmr``; ``None`` where not measurable); ``curve``:
    ``(fmr, fnmr)`` arrays of the operating points at :data:`CURVE_POINTS` log-spaced targets."""

    threshold: dict[str, Any]
    table: list[dict[str, Any]]
    curve: tuple[np.ndarray, np.ndarray]


def calibrate(embeddings: torch.Tensor, labels: torch.Tensor | np.ndarray, fmr: float, *, similarity: str = "cosine",
              fmrs: Sequence[float] = DEFAULT_FARS, source: dict[str, Any] | None = None) -> Calibration:
    """The threshold of target ``fmr`` on all pairs of ``embeddings`` (finest ``labels``, column 0; ``-1``:
    unknown, left out), and the FNMR@FMR table at ``fmrs`` and ``fmr`` (see the module docstring)."""
    if not 0.0 < fmr < 1.0:
        raise ValueError(f"fmr must be a false match rate in (0, 1), got {fmr!r}")
    y = torch.as_tensor(np.asarray(labels))
    y = y[:, 0] if y.ndim == 2 else y
    known = y >= 0
    scores, genuine = all_pairs_scores(embeddings[known], y[known].numpy(), similarity)
    impostors, matching = int((genuine == 0).sum()), int(genuine.sum())
    if impostors * fmr < 1.0 - 1e-9 or matching == 0:
        raise ValueError(f"{int(known.sum())} labelled items give {matching} genuine and {impostors} impostor pairs: "
                         f"an FMR of {fmr:g} needs at least {math.ceil(1 / fmr - 1e-9)} impostor pairs (1/FMR) and a "
                         "genuine pair; use a larger split or a larger FMR")
    targets = sorted({*fmrs, fmr})
    points = {p.target: p for p in operating_points(scores, genuine, targets)}
    top = float(scores.max())
    chosen = points[fmr]
    value = (chosen.threshold if math.isfinite(chosen.threshold)
             else float(np.nextafter(np.float32(top), np.float32(np.inf))))
    threshold = {"value": value, "fmr": fmr, "achieved_fmr": chosen.far, "fnmr": 1.0 - chosen.tar,
                 "genuine_pairs": matching, "impostor_pairs": impostors, "similarity": similarity,
                 "created_utc": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S UTC}", **(source or {})}
    table = [{"fmr": t, "threshold": _finite(p.threshold, value if t == fmr else None) if p.measurable else None,
              "achieved_fmr": p.far if p.measurable else None, "fnmr": 1.0 - p.tar if p.measurable else None}
             for t, p in points.items()]
    grid = np.geomspace(1.0 / impostors, 1.0, CURVE_POINTS)
    curve_points = operating_points(scores, genuine, grid.tolist())
    curve = (np.array([p.far for p in curve_points]), np.array([1.0 - p.tar for p in curve_points]))
    return Calibration(threshold, table, curve)


def _finite(threshold: float, instead: float | None) -> float | None:
    return threshold if math.isfinite(threshold) else instead


def format_table(calibration: Calibration) -> str:
    """The FNMR@FMR table as aligned text, the target's row marked."""
    lines = [f"{'FMR':>8}  {'threshold':>10}  {'achieved FMR':>12}  {'FNMR':>8}"]
    for row in calibration.table:
        mark = "  <- target" if row["fmr"] == calibration.threshold["fmr"] else ""
        if row["fnmr"] is None:
            lines.append(f"{row['fmr']:>8.0e}  {'n/a (too few impostor pairs)':>34}{mark}")
            continue
        limit = "> all" if row["threshold"] is None else f"{row['threshold']:.6f}"
        lines.append(f"{row['fmr']:>8.0e}  {limit:>10}  {row['achieved_fmr']:>12.3e}  {row['fnmr']:>8.4f}{mark}")
    return "\n".join(lines)
