"""Summaries and paired differences against scipy computed independently, and by hand."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats as sps

from rankopt.report.stats import paired_difference, summarize

A = np.array([0.612, 0.598, 0.631, 0.604, 0.620, 0.609])
B = np.array([0.601, 0.590, 0.615, 0.606, 0.603, 0.600])


def test_summarize_matches_numpy():
    s = summarize(A)
    assert s.n == 6
    assert s.mean == pytest.approx(A.mean())
    assert s.std == pytest.approx(np.std(A, ddof=1))
    assert (s.min, s.max) == (A.min(), A.max())


def test_summarize_single_value_has_nan_std():
    s = summarize([0.5])
    assert (s.mean, s.n, s.min, s.max) == (0.5, 1, 0.5, 0.5)
    assert math.isnan(s.std)


@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_paired_difference_matches_scipy(confidence):
    d = A - B
    r = paired_difference(A, B, confidence=confidence)
    expected_t = sps.ttest_rel(A, B)
    low, high = sps.t.interval(confidence, len(d) - 1, loc=d.mean(), scale=sps.sem(d))
    assert r.n == 6
    assert r.mean == pytest.approx(d.mean())
    assert r.std == pytest.approx(np.std(d, ddof=1))
    assert (r.ci_low, r.ci_high) == (pytest.approx(low), pytest.approx(high))
    assert r.t == pytest.approx(expected_t.statistic)
    assert r.p_value == pytest.approx(expected_t.pvalue)
    assert r.wilcoxon_p == pytest.approx(sps.wilcoxon(d).pvalue)


def test_paired_difference_by_hand():
    # d = [1, 2, 3]: mean 2, sd 1, t_{0.975, 2} = 4.302653, t = 2 / (1/√3) = 2√3.
    r = paired_difference([1.0, 2.0, 3.0], [0.0, 0.0, 0.0])
    assert (r.mean, r.std, r.n) == (2.0, 1.0, 3)
    assert r.ci_low == pytest.approx(2 - 4.302653 / math.sqrt(3), abs=1e-6)
    assert r.ci_high == pytest.approx(2 + 4.302653 / math.sqrt(3), abs=1e-6)
    assert r.t == pytest.approx(2 * math.sqrt(3))
    assert r.wilcoxon_p == pytest.approx(0.25)  # exact: 2 of the 2^3 sign patterns are as extreme
    assert not r.significant()


def test_paired_difference_is_antisymmetric():
    ab, ba = paired_difference(A, B), paired_difference(B, A)
    assert ab.mean == pytest.approx(-ba.mean)
    assert (ab.ci_low, ab.ci_high) == (pytest.approx(-ba.ci_high), pytest.approx(-ba.ci_low))
    assert ab.p_value == pytest.approx(ba.p_value)


def test_identical_inputs_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = paired_difference(A, A)
    assert (r.mean, r.std, r.ci_low, r.ci_high, r.n) == (0.0, 0.0, 0.0, 0.0, 6)
    assert math.isnan(r.t) and math.isnan(r.p_value) and math.isnan(r.wilcoxon_p)
    assert not r.significant()


def test_single_pair_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = paired_difference([0.7], [0.6])
    assert r.n == 1 and r.mean == pytest.approx(0.1)
    assert all(math.isnan(v) for v in (r.std, r.ci_low, r.ci_high, r.t, r.p_value, r.wilcoxon_p))


def test_two_pairs():
    a, b = np.array([0.7, 0.9]), np.array([0.6, 0.6])
    r = paired_difference(a, b)
    d = a - b
    assert r.n == 2 and r.mean == pytest.approx(0.2)
    half = sps.t.ppf(0.975, 1) * np.std(d, ddof=1) / math.sqrt(2)
    assert (r.ci_low, r.ci_high) == (pytest.approx(0.2 - half), pytest.approx(0.2 + half))
    assert r.p_value == pytest.approx(sps.ttest_rel(a, b).pvalue)
    assert r.wilcoxon_p == pytest.approx(0.5)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match=r"b\[2\] is nan"):
        paired_difference([1.0, 2.0, 3.0], [1.0, 2.0, float("nan")])
    with pytest.raises(ValueError, match=r"values\[1\]"):
        summarize([1.0, float("nan")])
    with pytest.raises(ValueError, match="paired"):
        paired_difference([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="empty"):
        summarize([])
    with pytest.raises(ValueError, match="confidence"):
        paired_difference([1.0, 2.0], [0.0, 1.0], confidence=1.0)
