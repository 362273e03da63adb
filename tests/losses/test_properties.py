"""Proven properties of the rank losses (ROADMAP / TPAMI), against exact metrics.

The exact metrics (1 - AP, 1 - H-AP, 1 - NDCG, query excluded from its own retrieval set,
pessimistic ties) come from ``rankopt.metrics.evaluate``, cross-checked against the brute-force
loops of ``reference.py``. Synthetic data: random low-dimensional embeddings (many near-ties)
with duplicated rows (exact ties)."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from pytorch_metric_learning.losses import SmoothAPLoss as PMLSmoothAP

import rankopt.losses as L
from rankopt.losses.rank_loss import RetrievalSet
from rankopt.metrics import evaluate
from rankopt.rank.surrogates import default_delta, heaviside, sigmoid_sums, sup_rank_sums, sup_step

from . import reference as R
from .test_exactness import batch

ROW_LOSSES = ["sup_ap", "smooth_ap", "sup_recall", "smooth_recall", "calibration", "hap", "sup_ndcg"]


# --- H^- (ROADMAP Eq. 4) -------------------------------------------------------------------


def test_default_delta_is_papers_value():
    assert default_delta() == pytest.approx(0.01 * torch.log(torch.tensor(99.0)).item())
    assert default_delta() == pytest.approx(0.0459, abs=1e-4)


@pytest.mark.parametrize("tau, rho, start", [(0.01, 100.0, 0.5), (0.05, 10.0, 0.5), (0.01, 100.0, 0.0)])
def test_sup_step_continuous_at_delta_and_upper_bound(tau, rho, start):
    delta = default_delta(tau)
    eps = torch.tensor([1e-9], dtype=torch.float64)
    at = torch.tensor([delta], dtype=torch.float64)
    # continuous at delta (the reference code's offset 1.44 / missing -delta broke this, ROADMAP #12)
    torch.testing.assert_close(sup_step(at + eps, tau, rho, start=start), sup_step(at, tau, rho, start=start), atol=1e-6, rtol=0)
    torch.testing.assert_close(sup_step(at - eps, tau, rho, start=start), sup_step(at, tau, rho, start=start), atol=1e-6, rtol=0)
    t = torch.linspace(-1, 1, 20001, dtype=torch.float64)
    h = sup_step(t, tau, rho, start=start)
    assert bool((h[1:] >= h[:-1]).all())  # non-decreasing
    zero = torch.tensor([0.0, -1e-12, 1e-12], dtype=torch.float64)
    if start == 0.0:  # continuous at 0 too
        torch.testing.assert_close(sup_step(zero, tau, rho, start=0.0), torch.full((3,), 0.5, dtype=torch.float64), atol=1e-9, rtol=0)
    else:  # an upper bound of the pessimistic step everywhere, ties included
        grid = torch.cat([t, zero])
        assert bool((sup_step(grid, tau, rho, start=start) >= heaviside(grid)).all())
        # H^- - start * H is continuous at 0: the jump is exactly start times the step's
        torch.testing.assert_close(sup_step(zero, tau, rho, start=start) - start * heaviside(zero), torch.full((3,), 0.5, dtype=torch.float64), atol=1e-9, rtol=0)
    # slope rho past delta
    torch.testing.assert_close(sup_step(at + 0.1, tau, rho, start=start) - sup_step(at, tau, rho, start=start), torch.tensor([rho * 0.1], dtype=torch.float64))


# --- upper bounds against the exact metrics --------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_surrogates_upper_bound_exact_metrics(seed):
    """Sup-AP >= 1 - AP, Sup-H-AP >= 1 - H-AP, Sup-NDCG >= 1 - NDCG with rankopt's exact metrics
    (query excluded by index, pessimistic ties), cross-checked against the brute-force loops."""
    x, flat = batch(seed, n=24, dim=3)
    _, hier = batch(seed, n=24, dim=3, hierarchical=True)
    x = x.float()
    one_minus = {k: 1 - v for k, v in evaluate(x, hier, metrics=["h-ap", "ndcg"]).metrics.items()}
    one_minus["map"] = 1 - evaluate(x, flat, metrics=["map"]).metrics["map"]
    brute = {
        "map": R.per_query(x.double(), flat, R.ap_query),
        "h-ap": R.per_query(x.double(), hier, partial(R.hap_query, num_levels=3, smooth=False)),
        "ndcg": R.per_query(x.double(), hier, partial(R.ndcg_query, smooth=False)),
    }
    for key, value in brute.items():
        assert float(value) == pytest.approx(one_minus[key], abs=1e-9)
    assert float(L.build("sup_ap")(x, flat)) >= one_minus["map"] - 1e-6
    assert float(L.build("hap")(x, hier)) >= one_minus["h-ap"] - 1e-6
    assert float(L.build("sup_ndcg")(x, hier)) >= one_minus["ndcg"] - 1e-6
    # with the exact step everywhere (rho = 0, tau -> 0) Sup-AP is 1 - AP itself
    exact_step = L.build("sup_ap", tau=1e-6, rho=0.0, delta=0.0)
    assert float(exact_step(x.double(), flat)) == pytest.approx(one_minus["map"], abs=1e-6)


def test_hap_equals_sup_ap_on_one_level_labels():
    x, lab = batch(11, n=20)
    x = x.float()
    for labels in (lab, lab[:, None]):
        torch.testing.assert_close(L.build("hap")(x, labels), L.build("sup_ap")(x, lab), rtol=1e-6, atol=0)
    torch.testing.assert_close(L.build("hap", relevance="sum_wap")(x, lab), L.build("sup_ap")(x, lab), rtol=1e-6, atol=0)


def test_calibration_zero_when_constraints_hold():
    # two tight classes far apart: positives >= 0.9 and negatives <= 0.6
    g = torch.Generator().manual_seed(0)
    centres = torch.eye(4)[:2] * 10
    x = torch.cat([centres[0] + 0.1 * torch.randn(3, 4, generator=g), centres[1] + 0.1 * torch.randn(3, 4, generator=g)])
    lab = torch.tensor([0, 0, 0, 1, 1, 1])
    for reduction in ("per_query", "violating_pairs"):
        xg = x.clone().requires_grad_(True)
        value = L.build("calibration", reduction=reduction)(xg, lab)
        value.backward()
        assert value.item() == 0.0 and float(xg.grad.abs().max()) == 0.0
    assert float(L.build("calibration", alpha=0.9999)(x, lab)) > 0


# --- gradients (ROADMAP supp. A.1) -----------------------------------------------------------


def score_level(loss, scores, levels):
    """The loss on a hand-made retrieval set (one row per query); returns (value, d loss / d scores)."""
    s = torch.tensor(scores, dtype=torch.float64).reshape(1, -1).requires_grad_(True)
    lv = torch.tensor(levels, dtype=torch.int8).reshape(1, -1)
    rs = RetrievalSet(s, lv, torch.ones_like(lv, dtype=torch.bool), 1, torch.zeros(1, 1, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.long))
    value = loss.compute(rs)
    value.backward()
    return value.item(), s.grad[0]


def test_smooth_ap_appendix_example():
    """ROADMAP supp. A.1, Fig. 8: positives x1, x2, a negative x3 with s3 - s2 = 0.13, s3 - s1 = 0.14.
    Smooth-AP: dL/ds1 = -dL/ds2 (contradictory), no gradient on x3 (vanishing), and below 1 - AP.
    Sup-AP: every positive pushed up, x3 pushed down, and an upper bound of 1 - AP."""
    scores, levels = [0.66, 0.67, 0.80], [1, 1, 0]
    one_minus_ap = 1 - (1 / 2 + 2 / 3) / 2
    value, g = score_level(L.build("smooth_ap"), scores, levels)
    assert value < one_minus_ap
    assert float(g[0]) < 0 < float(g[1])
    torch.testing.assert_close(g[0], -g[1], rtol=1e-3, atol=0)  # exact up to the saturated sigmoid terms
    assert abs(float(g[2])) < 1e-4 * abs(float(g[0]))
    value, g = score_level(L.build("sup_ap"), scores, levels)
    assert value >= one_minus_ap
    assert float(g[0]) < 0 and float(g[1]) < 0 and float(g[2]) > 1.0


@pytest.mark.parametrize("seed", range(3))
def test_sup_ap_gradients_raise_positives_lower_violating_negatives(seed):
    x, lab = batch(seed, n=16, dim=3)
    loss = L.build("sup_ap")
    rs = loss.retrieval_set(x, lab)
    rs.scores = rs.scores.detach().requires_grad_(True)
    loss.compute(rs).backward()
    grad = rs.scores.grad
    pos = rs.positives
    has_pos = pos.any(1, keepdim=True)
    assert bool((grad[pos] < 0).all())
    lowest_pos = torch.where(pos, rs.scores.detach(), torch.inf).min(1, keepdim=True).values
    violating = (rs.levels == 0) & rs.valid & has_pos & (rs.scores.detach() >= lowest_pos)
    assert int(violating.sum()) > 0
    assert bool((grad[violating] > 0).all())


# --- invariances, precision, conventions -----------------------------------------------------


@pytest.mark.parametrize("name", ROW_LOSSES)
def test_batch_permutation_invariance(name):
    hier = name in ("hap", "sup_ndcg")
    x, lab = batch(4, n=20, hierarchical=hier)
    x = x.float()
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(1))
    xa, xb = x.clone().requires_grad_(True), x[perm].clone().requires_grad_(True)
    a, b = L.build(name)(xa, lab), L.build(name)(xb, lab[perm])
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    a.backward()
    b.backward()
    torch.testing.assert_close(xa.grad[perm], xb.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ROW_LOSSES + ["roadmap"])
def test_low_precision_inputs_and_autocast_compute_in_float32(name):
    hier = name in ("hap", "sup_ndcg")
    x, lab = batch(5, n=20, dim=16, hierarchical=hier)
    x = x.float()
    loss = L.build(name)
    ref = loss(x, lab)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = loss(x, lab)
    assert under_autocast.dtype == torch.float32
    torch.testing.assert_close(under_autocast, ref, rtol=1e-6, atol=1e-7)
    for dtype in (torch.bfloat16, torch.float16):
        low = x.to(dtype)
        value = loss(low, lab)
        assert value.dtype == torch.float32
        torch.testing.assert_close(value, loss(low.float(), lab), rtol=1e-6, atol=1e-7)  # float32 inside
        torch.testing.assert_close(value, ref, rtol=0.05, atol=0.01)  # only the input rounding differs


def test_smooth_ap_matches_pml_under_reference_convention():
    """PML 2.9 SmoothAPLoss counts the query as its own positive and is only correct when
    #classes == #samples per class (class-contiguous 4 x 4 batches); it then equals our
    ``include_self=True`` Smooth-AP. Our default (query excluded) differs by design, and on 6 x 4
    batches PML's grouping is wrong (it takes B // 4 ... as the number of classes), so no equality there."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 8, generator=g)
    y = torch.arange(4).repeat_interleave(4)
    pml = PMLSmoothAP(temperature=0.01)(x, y)
    torch.testing.assert_close(L.build("smooth_ap", include_self=True)(x, y), pml, rtol=1e-5, atol=1e-6)
    assert abs(float(L.build("smooth_ap")(x, y)) - float(pml)) > 1e-2


def test_include_self_is_reference_code_convention():
    """With ``include_self=True`` the query is its own rank-1 positive (anchors §0.1): the exact-step
    Sup-AP equals 1 - AP computed with the query counted."""
    x, lab = batch(6, n=15)
    exact_step = L.build("sup_ap", tau=1e-6, rho=0.0, delta=0.0, include_self=True)
    expected = R.per_query(x, lab, R.ap_query, include_self=True)
    assert float(exact_step(x, lab)) == pytest.approx(float(expected), abs=1e-9)
    assert float(L.build("sup_ap", include_self=True)(x, lab)) < float(L.build("sup_ap")(x, lab))


@pytest.mark.parametrize("name", ["sup_ap", "hap", "smooth_ap"])
def test_queries_without_positive_are_excluded_and_counted(name):
    x, lab = batch(7, n=10)
    lab = lab.clone()
    lab[-3:] = torch.tensor([20, 21, 22])
    loss = L.build(name)
    value = loss(x, lab)
    assert loss.last_num_queries_without_positive == 3
    torch.testing.assert_close(value, L.build(name)(x[:-3], lab[:-3], x[-3:], lab[-3:]), rtol=1e-9, atol=0)
    lonely = torch.arange(10)
    xg = x.clone().requires_grad_(True)
    zero = loss(xg, lonely)
    zero.backward()
    assert zero.item() == 0.0 and loss.last_num_queries_without_positive == 10


@pytest.mark.parametrize("name", ROW_LOSSES)
def test_chunking_does_not_change_values_or_gradients(name):
    hier = name in ("hap", "sup_ndcg")
    x, lab = batch(8, n=18, hierarchical=hier)
    rx, rlab = batch(9, n=7, hierarchical=hier)
    grads = []
    values = []
    for max_elements in (1, 50, 1 << 24):
        xg = x.clone().requires_grad_(True)
        v = L.build(name, max_elements=max_elements)(xg, lab, rx, rlab)
        v.backward()
        values.append(v)
        grads.append(xg.grad)
    for v, g in zip(values[1:], grads[1:], strict=True):
        torch.testing.assert_close(v, values[0], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(g, grads[0], rtol=1e-10, atol=1e-14)
    with torch.no_grad():
        torch.testing.assert_close(L.build(name, max_elements=5)(x, lab, rx, rlab), values[0].detach())


@pytest.mark.parametrize("cap", [True, False])
def test_fused_sums_match_elementwise_definitions(cap):
    """The fused kernels equal the elementwise ``sup_step`` / sigmoid summed densely, values and
    gradients, including exact ties (t = 0) and differences right at delta."""
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(5, 40, generator=g, dtype=torch.float64) * 0.1
    scores[:, :3] = scores[:, 3:6]  # exact ties between pivots and items
    scores[:, 6] = scores[:, 7] + default_delta()  # right at delta
    pivot_idx = torch.tensor([3, 4, 5, 7])
    masks = torch.rand(5, 2, 40, generator=g) < 0.6
    a = scores.clone().requires_grad_(True)
    b = scores.clone().requires_grad_(True)
    pa, pb = a[:, pivot_idx], b[:, pivot_idx]
    diff = b.unsqueeze(1) - pb.unsqueeze(2)
    if cap:
        fused = sup_rank_sums(a, pa, masks, tau=0.01, rho=100.0, delta=default_delta(), start=0.5)
        dense = sup_step(diff.unsqueeze(2), 0.01, 100.0)
    else:
        fused = sigmoid_sums(a, pa, masks, 0.01)
        dense = torch.sigmoid(diff.unsqueeze(2) / 0.01)
    dense = (dense * masks.unsqueeze(1)).sum(-1)
    torch.testing.assert_close(fused, dense, rtol=1e-10, atol=1e-10)
    weights = torch.randn(fused.shape, generator=g, dtype=torch.float64)
    (fused * weights).sum().backward()
    (dense * weights).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-8, atol=1e-8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_calibration_compiled_kernels_equal_the_torch_path(dtype):
    """The CPU kernels give the torch expressions' values and gradients, scores exactly at alpha and beta
    included (no gradient there: the hinges' subgradient 0), with a reference set and without positives."""
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(40, 6, generator=g, dtype=dtype), dim=1)
    x = torch.cat([x, x[:2] * 0.9 + x[2:4] * 0.1])  # near-duplicates: positives above alpha
    lab = torch.randint(0, 9, (42,), generator=g)
    lab[-1] = 100  # a query without positives
    rx, rlab = torch.randn(7, 6, generator=g, dtype=dtype), torch.randint(0, 9, (7,), generator=g)
    results = {}
    for method in ("compiled", "torch"):
        loss = L.build("calibration", method=method, max_elements=64)  # several chunks on the torch path
        xg, rg = x.clone().requires_grad_(True), rx.clone().requires_grad_(True)
        value = loss(xg, lab, rg, rlab)
        value.backward()
        results[method] = (value.detach(), xg.grad, rg.grad)
    for got, expected in zip(results["compiled"], results["torch"], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=1e-7)
    assert results["torch"][1].abs().sum() > 0  # the batch has active hinges on both sides

    loss = L.build("calibration", method="compiled", alpha=0.5, beta=0.25)
    scores = torch.tensor([[0.5, 0.25, 0.7, 0.1]], dtype=dtype, requires_grad=True)
    levels = torch.tensor([[1, 0, 1, 0]], dtype=torch.int8)
    batch = RetrievalSet(scores, levels, torch.ones_like(levels, dtype=torch.bool), 1, scores, torch.zeros(1, 1))
    value = loss.compute(batch)
    value.backward()
    assert float(value) == 0.0 and scores.grad.abs().sum() == 0  # s = alpha on a positive, s = beta on a negative


def test_calibration_unknown_method_is_refused():
    with pytest.raises(ValueError, match="unknown method"):
        L.build("calibration", method="numba")
