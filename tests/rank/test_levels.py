"""Relevance of retrieved items from their shared hierarchy levels (:mod:`rankopt.rank.levels`) against
brute-force loops written from the definitions (TPAMI Eq. 20, Property 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.labels import random_hierarchy

from rankopt.labels import relevance_levels, self_mask
from rankopt.rank.levels import level_counts, ndcg_gains, relevance


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_hap_relevance_matches_eq20(alpha):
    rng = np.random.default_rng(1)
    labels = random_hierarchy(20, rng)
    lv = relevance_levels(labels, labels)
    valid = ~self_mask(20, 20)
    rel = relevance(lv, 3, valid, kind="hap", alpha=alpha)
    for i in range(20):
        members = [j for j in range(20) if j != i]
        for j in range(20):
            level = int(lv[i, j])
            if j == i or level == 0:
                assert rel[i, j] == 0
                continue
            count = sum(1 for k in members if int(lv[i, k]) == level)
            assert rel[i, j] == pytest.approx((level / 3) ** alpha / count, rel=1e-12)


def test_sum_wap_relevance_matches_property1():
    rng = np.random.default_rng(2)
    labels = random_hierarchy(15, rng)
    lv = relevance_levels(labels, labels)
    valid = ~self_mask(15, 15)
    w = [0.5, 0.3, 0.2]
    rel = relevance(lv, 3, valid, kind="sum_wap", weights=w)
    counts = level_counts(lv, 3, valid)
    for i in range(15):
        for j in range(15):
            level = int(lv[i, j])
            if j == i or level == 0:
                assert rel[i, j] == 0
                continue
            expected = sum(w[p - 1] / float(counts[i, p:].sum()) for p in range(1, level + 1))
            assert rel[i, j] == pytest.approx(expected, rel=1e-12)


def test_relevance_errors_and_gains():
    lv = torch.tensor([[0, 1, 2]])
    with pytest.raises(ValueError, match="unknown relevance kind"):
        relevance(lv, 2, kind="nope")
    with pytest.raises(ValueError, match="sum_wap needs 2"):
        relevance(lv, 2, kind="sum_wap", weights=[1.0])
    assert ndcg_gains(lv).tolist() == [[0.0, 1.0, 3.0]]
    assert ndcg_gains(lv, "linear").tolist() == [[0.0, 1.0, 2.0]]
    assert ndcg_gains(lv, [0.0, 0.5, 4.0]).tolist() == [[0.0, 0.5, 4.0]]
