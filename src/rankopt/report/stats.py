"""Statistics over seeds: summaries of one group of runs and paired differences between two groups.

Pure numpy/scipy. Runs of two methods that share a seed (same data order, same initialisation)
are paired: the difference ``d_i = a_i - b_i`` removes the variance the seed causes in both,
so the paired test is far more sensitive than comparing two independent means.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["PairedDifference", "Summary", "paired_difference", "summarize"]


@dataclass(frozen=True)
class Summary:
    """Mean, sample standard deviation (``ddof=1``; NaN for one value), count and range."""

    mean: float
    std: float
    n: int
    min: float
    max: float


@dataclass(frozen=True)
class PairedDifference:
    """``d = a - b`` over matched pairs: mean, sd, n, the ``confidence`` interval of the mean,
    the paired t statistic and its two-sided p-value, and the Wilcoxon signed-rank p-value."""

    mean: float
    std: float
    n: int
    ci_low: float
    ci_high: float
    t: float
    p_value: float
    wilcoxon_p: float

    def significant(self, alpha: float = 0.05) -> bool:
        """Whether the paired t-test rejects ``mean(d) = 0`` at level ``alpha`` (False when undefined)."""
        return not math.isnan(self.p_value) and self.p_value < alpha


def _vector(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    """1-D float64 copy of ``values``; ValueError naming the first non-finite position, or when empty."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"{name} is empty")
    bad = np.flatnonzero(~np.isfinite(x))
    if bad.size:
        raise ValueError(f"{name}[{int(bad[0])}] is {x[bad[0]]}: values must be finite")
    return x


def _std(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1)) if x.size > 1 else math.nan


def summarize(values: Sequence[float] | np.ndarray) -> Summary:
    """``mean = Σx/n``, ``std = sqrt(Σ(x - mean)² / (n - 1))`` (NaN for ``n = 1``), ``min``, ``max``."""
    x = _vector(values, "values")
    return Summary(float(x.mean()), _std(x), int(x.size), float(x.min()), float(x.max()))


def paired_difference(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, *,
                      confidence: float = 0.95) -> PairedDifference:
    """Paired difference ``d_i = a_i - b_i`` of matched values (e.g. the same seed).

    ``CI = mean(d) ± t_{(1+c)/2, n-1} · sd(d)/√n``; ``t`` and ``p_value`` from the two-sided
    paired t-test (``scipy.stats.ttest_rel``); ``wilcoxon_p`` from the signed-rank test
    (``scipy.stats.wilcoxon``, zeros dropped), NaN when every difference is zero. With
    ``n < 2`` the sd, interval and p-values are NaN. Identical inputs give ``t = p = NaN``.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    x, y = _vector(a, "a"), _vector(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"a and b must be paired: {x.size} vs {y.size} values")
    d = x - y
    n, mean, sd = int(d.size), float(d.mean()), _std(d)
    if n < 2:
        return PairedDifference(mean, sd, n, math.nan, math.nan, math.nan, math.nan, math.nan)
    from scipy import stats  # half a second to import: loaded when a comparison needs it

    half = float(stats.t.ppf((1.0 + confidence) / 2.0, n - 1)) * sd / math.sqrt(n)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # scipy warns on near-constant data and on zeros in small samples
        test = stats.ttest_rel(x, y)
        wilcoxon_p = float(stats.wilcoxon(d).pvalue) if np.any(d != 0) else math.nan
    return PairedDifference(mean, sd, n, mean - half, mean + half, float(test.statistic), float(test.pvalue),
                            wilcoxon_p)
