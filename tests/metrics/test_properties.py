"""Properties of the metrics (synthetic data): H-AP = AP on 1-level labels, the ΣwAP identity
(TPAMI Property 1), perfect rankings give 1, invariance to gallery order and chunk size,
self-retrieval = explicit gallery without the query, the pessimistic tie convention,
and the decomposability gap."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rankopt.metrics import decomposability_gap, evaluate

from . import reference
from .test_exactness import BINARY, HIER, _case

EVERYTHING = BINARY + HIER


def _t(*arrays):
    return [torch.as_tensor(a) for a in arrays]


@pytest.mark.parametrize("seed", range(4))
def test_hap_equals_ap_on_one_level(seed):
    x, y = _t(*_case(seed, n=60, num_classes=8, ties=seed % 2 == 0))
    m = evaluate(x, y, metrics=["h-ap", "sum_wap", "map", "ap@level0"], similarity="dot").metrics
    assert m["h-ap"] == pytest.approx(m["map"], abs=1e-12)
    assert m["sum_wap"] == pytest.approx(m["map"], abs=1e-12)
    assert m["ap@level0"] == pytest.approx(m["map"], abs=1e-12)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("weights", [None, (0.5, 0.3, 0.2)])
def test_sum_wap_identity(seed, weights):
    """Per query, H-AP with the Property 1 relevance = sum_l w_l AP^(l) (brute force), and
    rankopt's mean ΣwAP = the mean of those sums."""
    x, y = _case(seed, n=50, num_classes=6, ties=True, levels=3)
    w = list(weights or (1 / 3, 1 / 3, 1 / 3))
    S, sums = x @ x.T, []
    for i in range(len(x)):
        omega = [j for j in range(len(x)) if j != i]
        s, lv = [float(S[i, j]) for j in omega], [int((y[i] == y[j]).sum()) for j in omega]
        aps = [reference.query_metrics(s, lv, 3, [f"ap@level{c}"])[f"ap@level{c}"] for c in (2, 1, 0)]  # AP^(1..3)
        assert not any(map(math.isnan, aps))  # 6 classes over 50 items: positives at every level
        sums.append(sum(wl * a for wl, a in zip(w, aps)))
        assert reference.h_ap(s, lv, 3, kind="sum_wap", weights=w) == pytest.approx(sums[-1], abs=1e-12)
    got = evaluate(*_t(x, y), metrics=["sum_wap"], similarity="dot", **({"weights": weights} if weights else {}))
    assert got.metrics["sum_wap"] == pytest.approx(np.mean(sums), abs=1e-12)


def test_sum_wap_identity_single_query():
    """A hand-built query with positives at every level: ΣwAP = sum_l w_l AP^(l) exactly."""
    rng = np.random.default_rng(0)
    levels = [3, 3, 2, 2, 2, 1, 1, 0, 0, 0, 3, 1]
    s = rng.integers(0, 4, size=len(levels)).astype(float).tolist()  # many ties
    w = [0.2, 0.3, 0.5]
    lhs = reference.h_ap(s, levels, 3, kind="sum_wap", weights=w)
    aps = [reference.query_metrics(s, levels, 3, [f"ap@level{3 - lv}"])[f"ap@level{3 - lv}"] for lv in (1, 2, 3)]
    assert lhs == pytest.approx(sum(wl * a for wl, a in zip(w, aps)), abs=1e-12)
    # and rankopt: embed the scores as 1-D dot products with one query
    q = torch.tensor([[1.0]])
    ref = torch.tensor(s, dtype=torch.float64).unsqueeze(1)
    lab = {3: (0, 0, 0), 2: (1, 0, 0), 1: (2, 1, 0), 0: (3, 2, 1)}
    ref_labels = torch.tensor([lab[lv] for lv in levels])
    got = evaluate(q.double(), torch.tensor([[0, 0, 0]]), ref, ref_labels, metrics=["sum_wap"], similarity="dot", weights=w)
    assert got.metrics["sum_wap"] == pytest.approx(lhs, abs=1e-12)


def test_perfect_ranking_gives_one():
    y = torch.arange(6).repeat_interleave(5)
    yh = torch.stack([y, y // 2, y // 4], dim=1)  # consistent hierarchy
    one_hot = torch.nn.functional.one_hot
    # score = 100 [same class] + 9 [same level 1] + 1 [same level 2] + a small distinct offset: no ties
    x = torch.cat([10 * one_hot(y, 6), 3 * one_hot(y // 2, 3), one_hot(y // 4, 2)], dim=1).double()
    x = torch.cat([x, torch.linspace(0.01, 0.02, 30, dtype=torch.float64).unsqueeze(1)], dim=1)
    m = evaluate(x, yh, metrics=["recall@1", "precision@4", "true_recall@4", "map@r", "map", "mrr", "map@2", "h-ap", "ndcg", "asi", "ap@level0", "ap@level1"], similarity="dot").metrics
    for name, value in m.items():
        assert value == pytest.approx(1.0), name


@pytest.mark.parametrize("seed", range(3))
def test_invariant_to_gallery_order_and_chunks(seed):
    x, y = _case(seed, n=40, num_classes=6, ties=True, levels=2)
    xr, yr = _case(seed + 7, n=50, num_classes=6, ties=True, levels=2)
    perm = np.random.default_rng(seed).permutation(len(xr))
    a = evaluate(*_t(x, y, xr, yr), metrics=EVERYTHING, similarity="dot").metrics
    b = evaluate(*_t(x, y, xr[perm], yr[perm]), metrics=EVERYTHING, similarity="dot", chunk_size=3).metrics
    for name in a:
        assert a[name] == pytest.approx(b[name], abs=1e-12, nan_ok=True), name


@pytest.mark.parametrize("seed", range(3))
def test_self_retrieval_equals_explicit_gallery(seed):
    x, y = _case(seed, n=30, num_classes=5, ties=True, levels=2)
    whole = evaluate(*_t(x, y), metrics=EVERYTHING, similarity="dot")
    sums = {name: [] for name in EVERYTHING}
    for i in range(len(x)):
        keep = np.arange(len(x)) != i
        one = evaluate(*_t(x[i : i + 1], y[i : i + 1], x[keep], y[keep]), metrics=EVERYTHING, similarity="dot")
        for name, value in one.metrics.items():
            if not math.isnan(value):
                sums[name].append(value)
    for name in EVERYTHING:
        assert whole.metrics[name] == pytest.approx(np.mean(sums[name]), abs=1e-12), name


def test_pessimistic_ties_hand_case():
    """Query 0: positive and negative tied at the top -> both have rank 2."""
    q = torch.tensor([[1.0]])
    ref = torch.tensor([[1.0], [1.0], [0.5], [0.2]])
    q_lab, ref_lab = torch.tensor([0]), torch.tensor([0, 1, 0, 1])
    m = evaluate(q, q_lab, ref, ref_lab, similarity="dot",
                 metrics=["recall@1", "recall@2", "precision@2", "true_recall@1", "map", "mrr", "map@r", "map@2"]).metrics
    assert m["recall@1"] == 0.0 and m["recall@2"] == 1.0
    assert m["precision@2"] == 0.5 and m["true_recall@1"] == 0.0
    assert m["mrr"] == 0.5
    assert m["map"] == pytest.approx((1 / 2 + 2 / 3) / 2)
    assert m["map@r"] == pytest.approx((1 / 2) / 2)
    assert m["map@2"] == pytest.approx((1 / 2) / 2)
    # duplicates of the query: self is excluded by index, its duplicate still counts as a tie
    x = torch.tensor([[1.0], [1.0], [1.0]])
    m = evaluate(x, torch.tensor([0, 1, 0]), metrics=["recall@1", "map"], similarity="dot").metrics
    assert m["recall@1"] == 0.0 and m["map"] == pytest.approx(0.5)


def test_queries_without_positive_are_excluded_and_counted():
    x = torch.randn(10, 3)
    y = torch.tensor([0, 0, 1, 1, 2, 3, 4, 4, 4, 5])
    r = evaluate(x, y, metrics=["map", "recall@1"])
    assert r.num_queries == 10 and r.num_queries_without_positive == 3
    assert r.num_excluded == {"map": 3, "recall@1": 3}
    assert math.isnan(evaluate(x, torch.arange(10), metrics=["map"]).metrics["map"])


def test_decomposability_gap_matches_manual_batches():
    x, y = _t(*_case(0, n=64, num_classes=8, ties=False, dim=8))
    dg = decomposability_gap(x, y, batch_size=16, metric="ap", seed=3)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(3))
    batch = [evaluate(x[b], y[b], metrics=["map"]).metrics["map"] for b in perm.view(4, 16)]
    whole = evaluate(x, y, metrics=["map"]).metrics["map"]
    assert dg.whole == pytest.approx(whole)
    assert dg.batch_mean == pytest.approx(np.nanmean(batch))
    assert float(dg) == pytest.approx(np.nanmean(batch) - whole)
    assert decomposability_gap(x, y, batch_size=64).gap == pytest.approx(0.0, abs=1e-12)


def test_decomposability_gap_can_be_negative():
    """ROADMAP #7: DG is not bounded below by 0 (synthetic 12-point case found by search)."""
    x = torch.randn(12, 2, generator=torch.Generator().manual_seed(0))
    dg = decomposability_gap(x, torch.arange(12) % 3, 6, seed=0)
    assert dg.gap < 0 and dg.num_batches == 2


def test_decomposability_gap_bad_input():
    x, y = torch.randn(10, 3), torch.arange(10) % 2
    with pytest.raises(ValueError, match="batch_size"):
        decomposability_gap(x, y, 1)
    with pytest.raises(ValueError, match="batch_size"):
        decomposability_gap(x, y, 11)
    with pytest.raises(ValueError, match="no batch"):
        decomposability_gap(x, torch.arange(10), 5)
