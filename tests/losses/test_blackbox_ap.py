"""BlackBox AP: forward = 1 - exact AP (query excluded), backward = the blackbox
perturbation formula, both from brute-force float64 loops. Synthetic random data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankopt.losses.blackbox_ap import BlackBoxAPLoss, pessimistic_ranks
from rankopt.losses.registry import LOSSES

from . import reference as R


def _batch(n=20, d=5, classes=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=gen, dtype=torch.float64), torch.randint(0, classes, (n,), generator=gen)


def _scores(x, ref=None):
    items = x if ref is None else torch.cat([x, ref])
    u = x / x.norm(dim=1, keepdim=True)
    v = items / items.norm(dim=1, keepdim=True)
    return u @ v.T


def _rank(values, j, among):
    """Pessimistic rank of item j among the items ``among``: 1 + #{k != j : v_k >= v_j}."""
    return 1 + sum(1 for k in among if k != j and values[k] >= values[j])


def reference(s, labels, margin, lam, include_self=False):
    """Loss and d loss / d scores (float64 loops): AP on shifted scores, blackbox backward
    on ranks normalised by the retrieval-set size n, ranks among positives constant."""
    num_q, num_items = s.shape
    sets, loss_terms = [], []
    for i in range(num_q):
        members = [j for j in range(num_items) if include_self or j != i]
        positives = [j for j in members if labels[j] == labels[i]]
        if positives:
            sets.append((i, members, positives))
    grad = np.zeros((num_q, num_items))
    for i, members, positives in sets:
        shifted = {j: float(s[i, j]) - margin * ((j in positives) - 0.5) for j in members}
        n = len(members)
        ranks = {j: _rank(shifted, j, members) / n for j in members}
        pos_ranks = {j: _rank(shifted, j, positives) for j in positives}
        loss_terms.append(1 - sum(pos_ranks[j] / (ranks[j] * n) for j in positives) / len(positives))
        # dL/d rank_j (normalised) with L = 1 - mean_i AP_i
        d_rank = {j: (pos_ranks[j] / (n * ranks[j] ** 2) / len(positives) / len(sets) if j in positives else 0.0) for j in members}
        perturbed = {j: shifted[j] + lam * d_rank[j] for j in members}
        for j in members:
            grad[i, j] = -(ranks[j] - _rank(perturbed, j, members) / n) / lam
    return sum(loss_terms) / len(loss_terms), torch.from_numpy(grad)


def _check(x, y, loss, ref=None, ref_y=None):
    leaves = [x.float().requires_grad_(True)] + ([] if ref is None else [ref.float().requires_grad_(True)])
    extra = {} if ref is None else {"ref_embeddings": leaves[1], "ref_labels": ref_y}
    value = loss(leaves[0], y, **extra)
    grads = torch.autograd.grad(value, leaves)
    labels = y.tolist() + ([] if ref_y is None else ref_y.tolist())
    # the reference gradient w.r.t. the scores, chained through cosine similarity in float64
    d_leaves = [t.detach().double().requires_grad_(True) for t in [x] + ([] if ref is None else [ref])]
    s = _scores(*d_leaves)
    expected, d_scores = reference(s.detach().numpy(), labels, loss.margin, loss.lam, loss.include_self)
    expected_grads = torch.autograd.grad((s * d_scores).sum(), d_leaves)
    assert float(value.detach()) == pytest.approx(expected, rel=1e-6)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g.double(), e, rtol=1e-5, atol=1e-5 * float(e.abs().max()))
    assert float(torch.cat([g.flatten() for g in grads]).abs().max()) > 0


def test_pessimistic_ranks():
    s = torch.tensor([[0.5, 0.9, 0.5, float("-inf"), 0.1]])
    assert pessimistic_ranks(s).tolist() == [[3.0, 1.0, 3.0, 5.0, 4.0]]


def test_forward_is_one_minus_exact_ap_without_margin():
    """Against the shared brute-force exact 1 - AP (reference.py: pessimistic ties, query
    excluded by index), with and without a reference set."""
    x, y = _batch(n=30, seed=1)
    ref, ref_y = _batch(n=11, seed=9)
    loss = BlackBoxAPLoss(margin=0.0)
    assert float(loss(x.float(), y)) == pytest.approx(float(R.per_query(x, y, R.ap_query)), rel=1e-6)
    with_ref = loss(x.float(), y, ref_embeddings=ref.float(), ref_labels=ref_y)
    assert float(with_ref) == pytest.approx(float(R.per_query(x, y, R.ap_query, ref, ref_y)), rel=1e-6)


@pytest.mark.parametrize("margin,lam,seed", [(0.02, 4.0, 2), (0.0, 4.0, 3), (0.1, 50.0, 4)])
def test_value_and_blackbox_gradient_match_reference(margin, lam, seed):
    x, y = _batch(seed=seed)
    _check(x, y, BlackBoxAPLoss(lam=lam, margin=margin))


def test_reference_set_and_include_self():
    x, y = _batch(n=10, seed=5)
    ref, ref_y = _batch(n=8, seed=6)
    _check(x, y, BlackBoxAPLoss(lam=30.0), ref=ref, ref_y=ref_y)
    _check(x, y, BlackBoxAPLoss(lam=30.0, include_self=True))


def test_gradient_direction():
    """A negative ranked above a positive: descent raises the positive, lowers the negative."""
    x = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.8, 0.6], [-1.0, 0.1]], requires_grad=True)
    y = torch.tensor([0, 0, 1, 1])
    loss = BlackBoxAPLoss(lam=100.0)
    value = loss(x, y)
    value.backward()
    # query 0: item 2 (negative, cos 0.8) above item 1 (positive, cos 0.6). Along -grad,
    # the positive pair's cosine rises and the violating negative pair's falls.
    probe = x.detach().clone().requires_grad_(True)
    u = torch.nn.functional.normalize(probe, dim=1)
    (d_pos,) = torch.autograd.grad(u[0] @ u[1], probe, retain_graph=True)
    (d_neg,) = torch.autograd.grad(u[0] @ u[2], probe)
    assert float((d_pos * -x.grad).sum()) > 0 > float((d_neg * -x.grad).sum())


def test_registry_and_bad_input():
    loss = LOSSES.build("blackbox_ap")
    assert isinstance(loss, BlackBoxAPLoss) and loss.lam == 4.0 and loss.margin == 0.02
    x = torch.randn(4, 3)
    x[1, 0] = float("inf")
    with pytest.raises(ValueError, match="NaN or Inf"):
        loss(x, torch.tensor([0, 0, 1, 1]))
    with pytest.raises(ValueError, match="ref_labels"):
        loss(torch.randn(4, 3), torch.tensor([0, 0, 1, 1]), ref_embeddings=torch.randn(2, 3))
    with pytest.raises(ValueError, match="lam"):
        BlackBoxAPLoss(lam=0.0)
    with pytest.raises(ValueError, match="margin"):
        BlackBoxAPLoss(margin=-1.0)
