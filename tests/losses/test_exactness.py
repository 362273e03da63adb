"""Every rank loss against a brute-force float64 reference written from the paper's equations
(``reference.py``): loss value AND gradient w.r.t. the embeddings, to 1e-5 relative.

Inputs are small synthetic batches: random float64 embeddings, unequal class counts, a class
with a single sample (a query without positive), duplicated rows (exact score ties) and,
for some cases, a reference set (memory bank)."""

from __future__ import annotations

from functools import partial

import pytest
import torch

import rankopt.losses as L

from . import reference as R


def batch(seed: int, n: int = 13, dim: int = 6, hierarchical: bool = False, duplicates: bool = True):
    """Synthetic float64 batch; labels 1-D, or (n, 3) consistent fine -> mid -> coarse."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g, dtype=torch.float64)
    fine = torch.randint(0, 5, (n,), generator=g)
    fine[-1] = 7  # a class with a single sample: a query without positive
    if duplicates:
        x[1] = x[0]
        x[3] = x[2]
    if not hierarchical:
        return x, fine
    return x, torch.stack([fine, fine // 2, fine // 4], dim=1)


def check(loss, ref_fn, x, lab, ref_x=None, ref_lab=None, include_self=False):
    xa = x.clone().requires_grad_(True)
    xb = x.clone().requires_grad_(True)
    rxa = None if ref_x is None else ref_x.clone().requires_grad_(True)
    rxb = None if ref_x is None else ref_x.clone().requires_grad_(True)
    value = loss(xa, lab, rxa, ref_lab)
    expected = R.per_query(xb, lab, ref_fn, rxb, ref_lab, include_self=include_self)
    torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-8)
    value.backward()
    expected.backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-8)
    if ref_x is not None:
        torch.testing.assert_close(rxa.grad, rxb.grad, rtol=1e-5, atol=1e-8)
    assert xa.grad.abs().sum() > 0


FLAT = {
    "sup_ap": (dict(), R.sup_ap_query),
    "sup_ap_rho10": (dict(rho=10.0, tau=0.05), partial(R.sup_ap_query, tau=0.05, rho=10.0, delta=0.05 * torch.log(torch.tensor(99.0)).item())),
    "smooth_ap": (dict(), R.smooth_ap_query),
    "smooth_ap_tau": (dict(tau=0.1), partial(R.smooth_ap_query, tau=0.1)),
    "sup_recall": (dict(), R.sup_recall_query),
    "sup_recall_ks": (dict(ks=(1, 3), tau_star=0.5), partial(R.sup_recall_query, ks=(1, 3), tau_star=0.5)),
    "smooth_recall": (dict(), R.smooth_recall_query),
    "calibration": (dict(), R.calibration_query),
}


@pytest.mark.parametrize("case", sorted(FLAT))
@pytest.mark.parametrize("seed", [0, 1])
def test_flat_losses_match_reference(case, seed):
    kwargs, ref_fn = FLAT[case]
    name = case.split("_rho")[0].split("_tau")[0].split("_ks")[0]
    x, lab = batch(seed)
    check(L.build(name, **kwargs), ref_fn, x, lab)


@pytest.mark.parametrize("name", ["sup_ap", "smooth_ap", "sup_recall", "calibration"])
def test_reference_set_and_include_self(name):
    kwargs, ref_fn = FLAT[name]
    x, lab = batch(3, n=9)
    rx, rlab = batch(4, n=6, duplicates=False)
    check(L.build(name, **kwargs), ref_fn, x, lab, rx, rlab)
    check(L.build(name, include_self=True, **kwargs), ref_fn, x, lab, include_self=True)


HIER = {
    "hap": (dict(), partial(R.hap_query, num_levels=3)),
    "hap_alpha2": (dict(alpha=2.0), partial(R.hap_query, num_levels=3, rel_fn=partial(R.hap_relevance, alpha=2.0))),
    "hap_sum_wap": (dict(relevance="sum_wap"), partial(R.hap_query, num_levels=3, rel_fn=R.sum_wap_relevance)),
    "sup_ndcg": (dict(), R.ndcg_query),
}


@pytest.mark.parametrize("case", sorted(HIER))
@pytest.mark.parametrize("seed", [0, 1])
def test_hierarchical_losses_match_reference(case, seed):
    kwargs, ref_fn = HIER[case]
    x, lab = batch(seed, n=14, hierarchical=True)
    check(L.build(case.split("_alpha")[0].split("_sum")[0], **kwargs), ref_fn, x, lab)


def test_hierarchical_with_reference_set():
    x, lab = batch(5, n=8, hierarchical=True)
    rx, rlab = batch(6, n=7, hierarchical=True, duplicates=False)
    check(L.build("hap"), partial(R.hap_query, num_levels=3), x, lab, rx, rlab)
    check(L.build("sup_ndcg"), R.ndcg_query, x, lab, rx, rlab)


def test_calibration_violating_pairs_matches_reference_code_averaging():
    x, lab = batch(2)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    value = L.build("calibration", reduction="violating_pairs")(xa, lab)
    expected = R.calibration_violating_pairs(xb, lab)
    torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-8)
    value.backward()
    expected.backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-8)


def test_proxy_dg_matches_reference_and_trains_proxies():
    x, lab = batch(7)
    loss = L.build("proxy_dg", num_classes=8, embedding_dim=6).double()
    proxies = loss.proxies.detach().clone().requires_grad_(True)
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    value = loss(xa, lab)
    expected = R.proxy_dg(xb, lab, proxies)
    torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-8)
    value.backward()
    expected.backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(loss.proxies.grad, proxies.grad, rtol=1e-5, atol=1e-8)
    assert [p is loss.proxies for p in loss.parameters()] == [True]


@pytest.mark.parametrize(
    "name, rank_ref, lam",
    [
        ("roadmap", R.sup_ap_query, 0.5),
        ("rod_ap", R.sup_ap_query, 0.1),
        ("rod_recall", R.sup_recall_query, 0.1),
        ("happier", partial(R.hap_query, num_levels=3), 0.1),
        ("rod_ndcg", R.ndcg_query, 0.1),
    ],
)
def test_rod_combinations(name, rank_ref, lam):
    hier = name in ("happier", "rod_ndcg")
    x, lab = batch(8, n=12, hierarchical=hier)
    kwargs = {} if name == "roadmap" else dict(num_classes=8, embedding_dim=6)
    loss = L.build(name, **kwargs).double()
    assert isinstance(loss, L.ROD) and loss.lam == lam and loss.accepts_reference
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    value = loss(xa, lab)
    if name == "roadmap":
        dg = R.per_query(xb, lab, R.calibration_query)
    else:
        dg = R.proxy_dg(xb, lab, loss.decomposability_loss.proxies.detach())
    expected = (1 - lam) * R.per_query(xb, lab, rank_ref) + lam * dg
    torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-8)
    value.backward()
    expected.backward()
    torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-5, atol=1e-8)


def test_rod_routes_keyword_arguments():
    loss = L.build("happier", num_classes=5, embedding_dim=4, alpha=2.0, temperature=0.1, tau=0.05, lam=0.3)
    assert loss.rank_loss.alpha == 2.0 and loss.rank_loss.tau == 0.05
    assert loss.decomposability_loss.temperature == 0.1 and loss.lam == 0.3
    roadmap = L.build("roadmap", alpha=0.8, beta=0.5, rho=10.0, include_self=True)
    assert roadmap.decomposability_loss.alpha == 0.8 and roadmap.rank_loss.rho == 10.0
    assert roadmap.rank_loss.include_self and roadmap.decomposability_loss.include_self
    generic = L.ROD(L.SupAPLoss(), L.CalibrationLoss(), 0.25)
    x, lab = batch(9)
    torch.testing.assert_close(generic(x, lab), 0.75 * L.SupAPLoss()(x, lab) + 0.25 * L.CalibrationLoss()(x, lab))
