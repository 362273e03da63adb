"""SoftBin AP (ICCV'19 Eq. 5-13, §4.2) and FastAP against brute-force float64 references
written from the papers' equations, and against pytorch-metric-learning's FastAPLoss.
All data are synthetic (random Gaussian embeddings, random labels)."""

from __future__ import annotations

import itertools
import math
from functools import partial

import numpy as np
import pytest
import torch
from pytorch_metric_learning.losses import FastAPLoss as PMLFastAPLoss
from sklearn.metrics import average_precision_score

from rankopt.losses.histogram_ap import FastAPLoss, SoftBinAPLoss, ap_from_histograms, class_balance_weights, soft_histograms
from rankopt.losses.registry import LOSSES

from . import reference as R

# ---------------------------------------------------------------- references (loops, float64)
# Query functions for reference.per_query: s = the query's scores against every item,
# lv = relevance levels, omega = its retrieval set (the query excluded by index).


def _unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=1, keepdim=True)


def _triangle(value, centre, width):
    return torch.clamp(1 - (value - centre).abs() / width, min=0)


def bin_counts(s, lv, omega, num_bins, lo=-1.0, hi=1.0):
    """ICCV'19 Eq. 7: soft counts per bin of all items and of the positives (scores clamped
    into [lo, hi]: open-ended end bins); None without a positive."""
    positives = [k for k in omega if lv[k] > 0]
    if not positives:
        return None
    delta = (hi - lo) / (num_bins - 1)
    kernel = {(k, m): _triangle(torch.clamp(s[k], lo, hi), hi - m * delta, delta) for k in omega for m in range(num_bins)}
    counts = [sum(kernel[k, m] for k in omega) for m in range(num_bins)]
    pos_counts = [sum(kernel[k, m] for k in positives) for m in range(num_bins)]
    return counts, pos_counts, len(positives)


def softbin_query(s, lv, omega, num_bins=20, lo=-1.0, hi=1.0, eq13=False):
    """1 - AP_Q (Eq. 9-11), or with the tie-aware precision of Eq. 13 when ``eq13``."""
    binned = bin_counts(s, lv, omega, num_bins, lo, hi)
    if binned is None:
        return None
    counts, pos_counts, num_pos = binned
    ap, cum, cum_pos = 0.0, 0.0, 0.0
    for c, c_pos in zip(counts, pos_counts):
        if eq13:
            ap = ap + (1 + c_pos + 2 * cum_pos) / (1 + c + 2 * cum) * c_pos / num_pos
        cum, cum_pos = cum + c, cum_pos + c_pos
        if not eq13 and float(cum.detach()) > 0:
            ap = ap + cum_pos / cum * c_pos / num_pos
    return 1 - ap


def fastap_query(s, lv, omega, num_bins=10):
    """1 - FastAP (Cakir et al.): squared distances d2 = |u - v|^2 = 2 - 2 s on the sphere,
    pulses at l 4 / num_bins, FastAP = sum_l h+_l H+_l / H_l / |P| (0/0 -> 0)."""
    positives = [k for k in omega if lv[k] > 0]
    if not positives:
        return None
    step = 4.0 / num_bins
    pulse = {(k, l): _triangle(2 - 2 * s[k], l * step, step) for k in omega for l in range(num_bins + 1)}
    fast_ap, big_h, big_hp = 0.0, 0.0, 0.0
    for l in range(num_bins + 1):
        h_pos = sum(pulse[k, l] for k in positives)
        big_h, big_hp = big_h + sum(pulse[k, l] for k in omega), big_hp + h_pos
        if float(big_h.detach()) > 0:
            fast_ap = fast_ap + h_pos * big_hp / big_h
    return 1 - fast_ap / len(positives)


def class_balanced_reference(x, y, num_bins):
    """ICCV'19 §4.2: mean over classes of the mean 1 - AP_Q of the class's queries."""
    s = _unit(x) @ _unit(x).T
    per_class: dict[int, list] = {}
    for i in range(len(x)):
        term = softbin_query(s[i], [int(y[j] == y[i]) for j in range(len(x))], [j for j in range(len(x)) if j != i], num_bins)
        if term is not None:
            per_class.setdefault(int(y[i]), []).append(term)
    return sum(sum(terms) / len(terms) for terms in per_class.values()) / len(per_class)


def reference_loss(query_fn, **kwargs):
    """A reference loss ``(x, labels, ref=None, ref_y=None)`` averaging ``query_fn`` over queries."""
    include_self = kwargs.pop("include_self", False)
    return lambda x, y, ref=None, ref_y=None: R.per_query(x, y, partial(query_fn, **kwargs), ref, ref_y, include_self)


def _value_and_grads(fn, *tensors):
    leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
    value = fn(*leaves)
    grads = torch.autograd.grad(value, leaves)
    return value.detach(), grads


def assert_matches(loss_fn, reference_fn, x, *rest, ref=None, **ref_kwargs):
    """Loss value and gradient (w.r.t. embeddings and the reference set) agree to 1e-5 relative."""
    tensors = [x] if ref is None else [x, ref]

    def ours(*leaves):
        extra = {} if ref is None else {"ref_embeddings": leaves[1], "ref_labels": ref_kwargs["ref_y"]}
        return loss_fn(leaves[0], *rest, **extra)

    def theirs(*leaves):
        extra = {} if ref is None else {"ref": leaves[1], "ref_y": ref_kwargs["ref_y"]}
        return reference_fn(leaves[0], *rest, **extra)

    value, grads = _value_and_grads(ours, *[t.float() for t in tensors])
    expected, expected_grads = _value_and_grads(theirs, *[t.double() for t in tensors])
    torch.testing.assert_close(value.double(), expected, rtol=1e-5, atol=1e-7)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g.double(), e, rtol=1e-5, atol=1e-5 * float(e.abs().max()))


def _batch(n=24, d=6, classes=7, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=gen, dtype=torch.float64), torch.randint(0, classes, (n,), generator=gen)


# ---------------------------------------------------------------- SoftBin AP


@pytest.mark.parametrize("num_bins,score_range", [(20, (-1.0, 1.0)), (7, (-1.0, 1.0)), (25, (0.0, 1.0))])
def test_softbin_matches_bruteforce(num_bins, score_range):
    x, y = _batch(n=16, seed=num_bins)
    loss = SoftBinAPLoss(num_bins=num_bins, score_range=score_range)
    assert_matches(loss, reference_loss(softbin_query, num_bins=num_bins, lo=score_range[0], hi=score_range[1]), x, y)


def test_softbin_reference_set_and_include_self():
    x, y = _batch(n=12, seed=3)
    ref, ref_y = _batch(n=9, seed=4)
    loss = SoftBinAPLoss(num_bins=10)
    assert_matches(loss, reference_loss(softbin_query, num_bins=10), x, y, ref=ref, ref_y=ref_y)
    with_self = SoftBinAPLoss(num_bins=10, include_self=True)
    assert_matches(with_self, reference_loss(softbin_query, num_bins=10, include_self=True), x, y)


def test_class_balance_weights_by_hand():
    # classes 0, 1, 2 with 3, 2, 4 queries: every class weighs 1/3
    weights = class_balance_weights(torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2]))
    expected = [1 / 9] * 3 + [1 / 6] * 2 + [1 / 12] * 4
    torch.testing.assert_close(weights, torch.tensor(expected, dtype=torch.float64))


def test_class_balanced_loss_matches_bruteforce():
    x, _ = _batch(n=10, seed=5)
    y = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])  # class 3 has no positive: excluded, counted
    loss = SoftBinAPLoss(num_bins=12, class_balanced=True)
    assert_matches(loss, lambda e, lab: class_balanced_reference(e, lab, 12), x, y)
    assert loss.last_num_queries_without_positive == 1
    plain = SoftBinAPLoss(num_bins=12)(x.float(), y)
    assert abs(float(plain) - float(loss(x.float(), y))) > 1e-4  # the weights do change the loss


def _exact_map_loss(x, y):
    s = (_unit(x) @ _unit(x).T).numpy()
    aps = []
    for i in range(len(x)):
        keep = np.arange(len(x)) != i
        truth = (y[keep] == y[i]).numpy()
        if truth.any():
            aps.append(average_precision_score(truth, s[i, keep]))
    return 1 - float(np.mean(aps))


def test_quantised_ap_is_exact_ap_under_hard_assignment():
    """Scores on bin centres, one item per bin: Eq. 11 is the exact AP (sklearn)."""
    gen = torch.Generator().manual_seed(5)
    num_bins = 401
    centres = 1 - torch.arange(num_bins, dtype=torch.float64) * (2 / (num_bins - 1))
    scores = centres[torch.stack([torch.randperm(num_bins, generator=gen)[:30] for _ in range(6)])]
    relevant = torch.rand(6, 30, generator=gen) < 0.3
    relevant[:, 0] = True
    hist, pos_hist = soft_histograms(scores, torch.ones_like(relevant), relevant, -1.0, 1.0, num_bins)
    ap = ap_from_histograms(hist, pos_hist, relevant.sum(1))
    expected = [average_precision_score(r.numpy(), s.numpy()) for r, s in zip(relevant, scores)]
    torch.testing.assert_close(ap, torch.tensor(expected, dtype=torch.float64), rtol=1e-9, atol=1e-9)


def test_softbin_convergence_to_exact_ap():
    """Tie-free random data, M -> infinity. Stated tolerance: Eq. 13 (``"simplified"``) is within
    2e-3 of 1 - mAP from M = 1001 on. The plain mAP_Q (Eq. 11) keeps a bias of about 1e-2 here:
    each item's mass is split between two bins whatever M, so its own precision counts only part
    of itself (documented in the module); the test pins that behaviour."""
    x, y = _batch(n=32, d=8, classes=6, seed=6)
    exact = _exact_map_loss(x, y)
    simplified = [abs(float(SoftBinAPLoss(num_bins=m, tie_aware="simplified")(x.float(), y)) - exact) for m in (11, 1001, 10001)]
    assert simplified[1] < 2e-3 and simplified[2] < 2e-3 and simplified[0] > 4 * simplified[2]
    plain = [float(SoftBinAPLoss(num_bins=m)(x.float(), y)) - exact for m in (11, 101, 1001, 10001)]
    assert plain[0] > plain[1] > plain[2] > 0
    assert 3e-3 < plain[3] < 3e-2


# ---------------------------------------------------------------- tie-aware AP (Eq. 13)


def _lattice_batch():
    """Synthetic embeddings whose pairwise cosines are exactly bin centres of M = 5 bins on
    [-1, 1] (1, 0.5, 0, -0.5, -1): hexagon points in a plane and +-e3, with duplicates."""
    angles = [0, 0, 60, 120, 180, 240, 60]
    pts = [[math.cos(math.radians(a)), math.sin(math.radians(a)), 0.0] for a in angles] + [[0, 0, 1.0], [0, 0, -1.0]]
    return torch.tensor(pts, dtype=torch.float64), torch.tensor([0, 1, 0, 1, 0, 2, 2, 2, 1])


def expected_ap_over_tie_orders(scores, relevant):
    """Mean AP over every order of the tied items (ties = equal scores), by enumeration."""
    groups = sorted({round(s, 6) for s in scores}, reverse=True)
    blocks = [[rel for s, rel in zip(scores, relevant) if round(s, 6) == g] for g in groups]
    total, count = 0.0, 0
    for orders in itertools.product(*[list(itertools.permutations(b)) for b in blocks]):
        ranking = [rel for block in orders for rel in block]
        hits, ap = 0, 0.0
        for t, rel in enumerate(ranking, start=1):
            if rel:
                hits += 1
                ap += hits / t
        total += ap / sum(relevant)
        count += 1
    return total / count


def test_tie_aware_exact_equals_expectation_over_tie_permutations():
    x, y = _lattice_batch()
    s = (_unit(x) @ _unit(x).T).tolist()
    aps = []
    for i in range(len(x)):
        members = [j for j in range(len(x)) if j != i]
        relevant = [bool(y[j] == y[i]) for j in members]
        if any(relevant):
            aps.append(expected_ap_over_tie_orders([s[i][j] for j in members], relevant))
    expected = 1 - sum(aps) / len(aps)
    for mode in (True, "exact"):
        value = SoftBinAPLoss(num_bins=5, tie_aware=mode)(x.float(), y)
        assert float(value) == pytest.approx(expected, rel=1e-5)
    # the plain quantised AP (ties broken pessimistically-ish) and Eq. 13 differ from the expectation
    assert abs(float(SoftBinAPLoss(num_bins=5)(x.float(), y)) - expected) > 1e-3
    assert abs(float(SoftBinAPLoss(num_bins=5, tie_aware="simplified")(x.float(), y)) - expected) > 1e-3


def test_tie_aware_simplified_is_eq13():
    x, y = _batch(n=14, seed=7)
    assert_matches(SoftBinAPLoss(num_bins=9, tie_aware="simplified"), reference_loss(softbin_query, num_bins=9, eq13=True), x, y)


def exact_tie_query(s, lv, omega, num_bins):
    """1 - expected AP under within-bin ties, from brute-force soft counts (float64)."""
    binned = bin_counts(s, lv, omega, num_bins)
    if binned is None:
        return None
    counts, pos_counts, num_pos = binned
    return 1 - ap_from_histograms(torch.stack(counts)[None], torch.stack(pos_counts)[None], torch.tensor([num_pos]), "exact")[0]


def test_tie_aware_exact_gradient_matches_float64_loops():
    """The soft-count extension is smooth: the chunked float32 path and its hand-written
    backward agree with the same formula on brute-force float64 counts under autograd."""
    x, y = _batch(n=12, seed=8)
    assert_matches(SoftBinAPLoss(num_bins=8, tie_aware=True), reference_loss(exact_tie_query, num_bins=8), x, y)


# ---------------------------------------------------------------- FastAP


@pytest.mark.parametrize("num_bins", [10, 4])
def test_fastap_matches_bruteforce(num_bins):
    x, y = _batch(n=20, seed=10 + num_bins)
    assert_matches(FastAPLoss(num_bins=num_bins), reference_loss(fastap_query, num_bins=num_bins), x, y)


@pytest.mark.parametrize("num_bins,seed", [(10, 0), (10, 1), (25, 2)])
def test_fastap_matches_pytorch_metric_learning(num_bins, seed):
    """Same bins, same squared distance, same query exclusion: values and gradients agree."""
    x, y = _batch(n=48, d=16, classes=9, seed=seed)
    ours, (g_ours,) = _value_and_grads(lambda e: FastAPLoss(num_bins=num_bins)(e, y), x.float())
    theirs, (g_theirs,) = _value_and_grads(lambda e: PMLFastAPLoss(num_bins=num_bins)(e, y), x.float())
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(g_ours, g_theirs, rtol=1e-5, atol=1e-5 * float(g_theirs.abs().max()))


def test_fastap_is_softbin_with_one_more_bin():
    x, y = _batch(seed=11)
    assert float(FastAPLoss(num_bins=10)(x.float(), y)) == pytest.approx(float(SoftBinAPLoss(num_bins=11)(x.float(), y)), abs=1e-6)


# ---------------------------------------------------------------- properties, scale paths, bad input


@pytest.mark.parametrize("name", ["softbin_ap", "fastap"])
def test_chunking_permutation_and_low_precision(name):
    x, y = _batch(n=40, seed=12)
    x = x.float()
    full = LOSSES.build(name)(x, y)
    chunked = LOSSES.build(name, max_elements=7 * 40)(x, y)  # 7 queries per chunk
    torch.testing.assert_close(chunked, full)
    perm = torch.randperm(40, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(LOSSES.build(name)(x[perm], y[perm]), full, rtol=1e-6, atol=1e-7)
    for dtype in (torch.bfloat16, torch.float16):
        low = x.to(dtype)
        torch.testing.assert_close(LOSSES.build(name)(low, y), LOSSES.build(name)(low.float(), y))


def test_float64_inputs_compute_in_float64():
    x, y = _batch(n=12, seed=3)
    value = SoftBinAPLoss(num_bins=9)(x, y)
    assert value.dtype == torch.float64
    assert float(value) == pytest.approx(float(reference_loss(softbin_query, num_bins=9)(x, y)), rel=1e-12)


def test_chunked_gradient_equals_full_gradient():
    x, y = _batch(n=30, seed=13)
    _, (g_full,) = _value_and_grads(lambda e: SoftBinAPLoss(tie_aware=True)(e, y), x.float())
    _, (g_chunk,) = _value_and_grads(lambda e: SoftBinAPLoss(tie_aware=True, max_elements=4 * 30)(e, y), x.float())
    torch.testing.assert_close(g_chunk, g_full)


def test_no_positive_anywhere_gives_zero_with_graph():
    x = torch.randn(5, 4, requires_grad=True)
    loss = SoftBinAPLoss()
    value = loss(x, torch.arange(5))
    value.backward()
    assert float(value.detach()) == 0.0 and loss.last_num_queries_without_positive == 5
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_bad_input():
    x, y = torch.randn(6, 4), torch.tensor([0, 0, 1, 1, 2, 2])
    loss = FastAPLoss()
    bad = x.clone()
    bad[2, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        loss(bad, y)
    with pytest.raises(ValueError, match="labels"):
        loss(x, y[:5])
    with pytest.raises(TypeError, match="integer"):
        loss(x, y.float())
    with pytest.raises(ValueError, match="rows"):
        loss(x[:1], y[:1])
    with pytest.raises(ValueError, match="ref_labels"):
        loss(x, y, ref_embeddings=x)
    with pytest.raises(ValueError, match="num_bins"):
        SoftBinAPLoss(num_bins=1)
    with pytest.raises(ValueError, match="num_bins"):
        FastAPLoss(num_bins=0)
    with pytest.raises(ValueError, match="score_range"):
        SoftBinAPLoss(score_range=(1.0, -1.0))
    with pytest.raises(ValueError, match="tie_aware"):
        SoftBinAPLoss(tie_aware="sometimes")
