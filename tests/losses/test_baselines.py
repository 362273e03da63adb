"""Classic baselines: equal to pytorch-metric-learning's own losses on 1-D labels, to the
Σ-over-levels sums on 2-D labels, and to brute-force float64 formulas (loops) with a
reference set and for ProxyNCA++. Synthetic random data."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses
from pytorch_metric_learning import miners as pml_miners

from rankopt.losses.baselines import PMLLoss, without_self_pairs
from rankopt.losses.registry import LOSSES


def _batch(n=24, d=8, classes=6, seed=0, levels=None):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen)
    fine = torch.randint(0, classes, (n,), generator=gen)
    if levels is None:
        return x, fine
    columns = [fine] + [fine // (2 * (level + 1)) for level in range(levels - 1)]  # consistent hierarchy
    return x, torch.stack(columns, dim=1)


def _value_and_grad(fn, x):
    leaf = x.detach().clone().requires_grad_(True)
    value = fn(leaf)
    (grad,) = torch.autograd.grad(value, leaf)
    return value.detach(), grad


def assert_same(fn_a, fn_b, x):
    a, ga = _value_and_grad(fn_a, x)
    b, gb = _value_and_grad(fn_b, x)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(ga, gb, rtol=1e-5, atol=1e-5 * float(gb.abs().max()) + 1e-12)
    assert float(a) > 0


def _pml_reference(name, **kw):
    """PML's own loss (and miner) as the papers' code would call it."""
    if name == "triplet":
        loss, miner = pml_losses.TripletMarginLoss(margin=0.2), pml_miners.TripletMarginMiner(margin=0.2, type_of_triplets="semihard")
        return lambda e, y: loss(e, y, miner(e, y))
    if name == "contrastive":
        return pml_losses.ContrastiveLoss()
    if name == "multi_similarity":
        loss, miner = pml_losses.MultiSimilarityLoss(), pml_miners.MultiSimilarityMiner()
        return lambda e, y: loss(e, y, miner(e, y))
    raise KeyError(name)


@pytest.mark.parametrize("name", ["triplet", "contrastive", "multi_similarity"])
def test_pair_losses_equal_pml(name):
    x, y = _batch(seed=1)
    ours = LOSSES.build(name)
    assert ours.accepts_reference
    assert_same(lambda e: ours(e, y), lambda e: _pml_reference(name)(e, y), x)
    # 2-D labels: the flat baselines use the finest column
    _, y2 = _batch(seed=1, levels=3)
    assert_same(lambda e: ours(e, y2), lambda e: _pml_reference(name)(e, y2[:, 0]), x)


@pytest.mark.parametrize(
    "name,pml_class,kwargs",
    [
        ("normalized_softmax", pml_losses.NormalizedSoftmaxLoss, {"temperature": 0.05}),
        ("proxy_nca", pml_losses.ProxyNCALoss, {"softmax_scale": 1.0}),
        ("proxy_nca_pp", pml_losses.ProxyNCALoss, {"softmax_scale": 9.0}),
    ],
)
def test_proxy_losses_equal_pml(name, pml_class, kwargs):
    x, y = _batch(seed=2)
    ours = LOSSES.build(name, num_classes=6, embedding_dim=8)
    theirs = pml_class(num_classes=6, embedding_size=8, **kwargs)
    theirs.load_state_dict(ours.losses[0].state_dict())
    assert not ours.accepts_reference
    assert_same(lambda e: ours(e, y), lambda e: theirs(e, y), x)
    params = list(ours.parameters())
    assert len(params) == 1 and params[0].requires_grad
    ours(x, y).backward()
    assert float(params[0].grad.abs().sum()) > 0


def test_proxy_nca_pp_matches_its_formula():
    """Teh et al. 2020: -log( exp(-||x^ - p^_y||^2 / T) / sum_c exp(-||x^ - p^_c||^2 / T) )."""
    x, y = _batch(n=10, seed=3)
    loss = LOSSES.build("proxy_nca_pp", num_classes=6, embedding_dim=8)
    proxies = loss.losses[0].proxies.detach().double()
    total = 0.0
    for i in range(10):
        u = x[i].double() / x[i].double().norm()
        logits = [-float(((u - p / p.norm()) ** 2).sum()) * 9.0 for p in proxies]
        top = max(logits)
        log_norm = top + math.log(sum(math.exp(v - top) for v in logits))
        total += -(logits[int(y[i])] - log_norm)
    assert float(loss(x, y).detach()) == pytest.approx(total / 10, rel=1e-5)


def test_sum_triplet_is_the_sum_over_levels():
    x, y = _batch(n=32, seed=4, levels=3)
    ours = LOSSES.build("sum_triplet")
    ref = _pml_reference("triplet")
    assert_same(lambda e: ours(e, y), lambda e: sum(ref(e, y[:, level]) for level in range(3)), x)
    weighted = LOSSES.build("sum_triplet", weights=[1.0, 0.5, 0.25])
    assert_same(lambda e: weighted(e, y), lambda e: sum(w * ref(e, y[:, level]) for level, w in enumerate([1.0, 0.5, 0.25])), x)
    # 1-D labels: one level, the flat loss
    assert_same(lambda e: ours(e, y[:, 0]), lambda e: ref(e, y[:, 0]), x)


@pytest.mark.parametrize("name,pml_class,kwargs", [("sum_nsm", pml_losses.NormalizedSoftmaxLoss, {"temperature": 0.05}), ("sum_proxy_nca_pp", pml_losses.ProxyNCALoss, {"softmax_scale": 9.0})])
def test_sum_proxy_losses_are_sums_of_per_level_losses(name, pml_class, kwargs):
    x, y = _batch(n=20, seed=5, levels=3)
    num_classes = [int(y[:, level].max()) + 1 for level in range(3)]
    ours = LOSSES.build(name, num_classes=num_classes, embedding_dim=8)
    per_level = []
    for level, n in enumerate(num_classes):
        theirs = pml_class(num_classes=n, embedding_size=8, **kwargs)
        theirs.load_state_dict(ours.losses[level].state_dict())
        per_level.append(theirs)
    assert_same(lambda e: ours(e, y), lambda e: sum(loss(e, y[:, level]) for level, loss in enumerate(per_level)), x)
    assert len(list(ours.parameters())) == 3


def _unit(t):
    return t / t.norm(dim=1, keepdim=True)


def test_contrastive_with_reference_set_matches_bruteforce():
    """Every pair (i, j), j in batch ∪ reference, j != i: mean of the non-zero positive terms
    relu(d - 0) plus mean of the non-zero negative terms relu(1 - d), Euclidean d on the sphere."""
    x, y = _batch(n=10, seed=6)
    ref, ref_y = _batch(n=7, seed=7)
    loss = LOSSES.build("contrastive")

    def brute(e, r):
        items, labels = torch.cat([e, r]), torch.cat([y, ref_y])
        u, v = _unit(e), _unit(items)
        pos, neg = [], []
        for i in range(len(e)):
            for j in range(len(items)):
                if j == i:
                    continue
                d = (u[i] - v[j]).norm()
                (pos if labels[j] == y[i] else neg).append(d if labels[j] == y[i] else torch.relu(1 - d))
        pos = [t for t in pos if float(t.detach()) > 0]
        neg = [t for t in neg if float(t.detach()) > 0]
        return sum(pos) / len(pos) + sum(neg) / len(neg)

    leaves = [x.clone().requires_grad_(True), ref.clone().requires_grad_(True)]
    value = loss(leaves[0], y, ref_embeddings=leaves[1], ref_labels=ref_y)
    grads = torch.autograd.grad(value, leaves)
    d_leaves = [x.double().requires_grad_(True), ref.double().requires_grad_(True)]
    expected = brute(*d_leaves)
    expected_grads = torch.autograd.grad(expected, d_leaves)
    assert float(value.detach()) == pytest.approx(float(expected.detach()), rel=1e-5)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g.double(), e, rtol=1e-5, atol=1e-5 * float(e.abs().max()))


def _triplet_reference(x, y, ref, ref_y, margin, semi_hard):
    """Mean of the non-zero relu(d_ap - d_an + m) over triplets (a, p, n) of batch ∪ reference
    with p != a (by index); semi-hard keeps d_ap < d_an <= d_ap + m."""
    items, labels = torch.cat([x, ref]), torch.cat([y, ref_y])
    d = torch.cdist(_unit(x.double()), _unit(items.double()))
    terms = []
    for a in range(len(x)):
        for p in range(len(items)):
            if p == a or labels[p] != y[a]:
                continue
            for n in range(len(items)):
                d_ap, d_an = float(d[a, p]), float(d[a, n])
                if labels[n] != y[a] and (not semi_hard or d_ap < d_an <= d_ap + margin) and d_ap - d_an + margin > 0:
                    terms.append(d_ap - d_an + margin)
    assert len(terms) > 5
    return sum(terms) / len(terms)


def test_triplet_with_reference_set_matches_bruteforce():
    x, y = _batch(n=12, d=4, classes=4, seed=8)
    ref, ref_y = _batch(n=9, d=4, classes=4, seed=9)
    value = LOSSES.build("triplet")(x, y, ref_embeddings=ref, ref_labels=ref_y)
    assert float(value) == pytest.approx(_triplet_reference(x, y, ref, ref_y, 0.2, True), rel=1e-5)
    # without a miner every triplet counts; self-positives (d_ap = 0) would add terms here
    all_triplets = PMLLoss([pml_losses.TripletMarginLoss(margin=1.0)])
    value = all_triplets(x, y, ref_embeddings=ref, ref_labels=ref_y)
    assert float(value) == pytest.approx(_triplet_reference(x, y, ref, ref_y, 1.0, False), rel=1e-5)


def test_self_pairs_are_removed_by_index():
    pairs = (torch.tensor([0, 0, 1]), torch.tensor([0, 2, 3]), torch.tensor([0, 1]), torch.tensor([4, 5]))
    a1, p, a2, n = without_self_pairs(pairs)
    assert a1.tolist() == [0, 1] and p.tolist() == [2, 3] and a2.tolist() == [0, 1] and n.tolist() == [4, 5]
    a, p, n = without_self_pairs((torch.tensor([0, 1, 1]), torch.tensor([2, 1, 0]), torch.tensor([5, 6, 7])))
    assert a.tolist() == [0, 1] and p.tolist() == [2, 0] and n.tolist() == [5, 7]


def test_multi_similarity_with_reference_set_equals_pml_on_explicit_pairs():
    x, y = _batch(n=16, seed=10)
    ref, ref_y = _batch(n=12, seed=11)
    items, item_y = torch.cat([x, ref]), torch.cat([y, ref_y])
    loss, miner = pml_losses.MultiSimilarityLoss(), pml_miners.MultiSimilarityMiner()
    mined = miner(x, y, items, item_y)
    keep = mined[0] != mined[1]
    expected = loss(x, y, (mined[0][keep], mined[1][keep], mined[2], mined[3]), ref_emb=items, ref_labels=item_y)
    value = LOSSES.build("multi_similarity")(x, y, ref_embeddings=ref, ref_labels=ref_y)
    torch.testing.assert_close(value, expected)


def test_low_precision_inputs_compute_in_float32():
    x, y = _batch(seed=12)
    loss = LOSSES.build("contrastive")
    value = loss(x.bfloat16(), y)
    assert value.dtype == torch.float32
    torch.testing.assert_close(value, loss(x.bfloat16().float(), y))


def test_bad_input():
    x, y = _batch(n=8, seed=13)
    nsm = LOSSES.build("normalized_softmax", num_classes=6, embedding_dim=8)
    with pytest.raises(ValueError, match="reference set"):
        nsm(x, y, ref_embeddings=x, ref_labels=y)
    with pytest.raises(ValueError, match=r"\[0, 6\)"):
        nsm(x, y + 6)
    with pytest.raises(ValueError, match="dimension"):
        nsm(x[:, :4], y)
    bad = x.clone()
    bad[3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        LOSSES.build("triplet")(bad, y)
    with pytest.raises(ValueError, match="ref_labels"):
        LOSSES.build("triplet")(x, y, ref_embeddings=x)
    with pytest.raises(ValueError, match="levels"):
        LOSSES.build("sum_nsm", num_classes=[6, 3], embedding_dim=8)(x, torch.stack([y, y // 2, y // 3], 1))
    with pytest.raises(ValueError, match="weights"):
        LOSSES.build("sum_triplet", weights=[1.0, 2.0])(x, torch.stack([y, y // 2, y // 3], 1))
    with pytest.raises(ValueError, match="miner"):
        PMLLoss([pml_losses.ContrastiveLoss()], [None, None])
    with pytest.raises(TypeError, match="integer"):
        LOSSES.build("contrastive")(x, y.float())


def test_proxies_move_with_the_module():
    loss = LOSSES.build("sum_nsm", num_classes=[4, 2], embedding_dim=8)
    clone = copy.deepcopy(loss).double()
    assert all(p.dtype == torch.float64 for p in clone.parameters())
