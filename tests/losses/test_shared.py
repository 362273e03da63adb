"""Combinations compute their retrieval set once (ROD sharing) and the faster exact paths equal their references:
shared terms vs separate terms, compiled step counts vs ``torch.sort``, blocked kernels vs one block, dense vs
sparse padded columns, blocked row counts vs ``sum``."""

from __future__ import annotations

import pytest
import torch

import rankopt.losses as L
import rankopt.losses.rank_loss as base
import rankopt.similarity as sim
from rankopt.rank import surrogates as S

from .test_exactness import batch
from .test_step_counts import brute_counts, tied_batch

COMBINATIONS = ["roadmap", "rod_ap", "rod_recall", "happier", "rod_ndcg"]


def build(name: str, **kwargs) -> L.ROD:
    if name != "roadmap":
        kwargs.update(num_classes=8, embedding_dim=6)
    torch.manual_seed(0)
    return L.build(name, **kwargs).double()


def separate(loss: L.ROD, x, lab, rx=None, rlab=None) -> torch.Tensor:
    """The combination term by term, each loss on its own retrieval set (the reference path)."""
    refs = () if rx is None else (rx, rlab)
    dg = loss.decomposability_loss
    return (1 - loss.lam) * loss.rank_loss(x, lab, *refs) + loss.lam * dg(x, lab, *(refs if dg.accepts_reference else ()))


@pytest.mark.parametrize("name", COMBINATIONS)
@pytest.mark.parametrize("variant", ["batch", "reference", "include_self"])
def test_shared_retrieval_set_equals_separate_terms(name, variant):
    hier = name in ("happier", "rod_ndcg")
    x, lab = batch(11, n=12, hierarchical=hier)
    rx, rlab = batch(12, n=5, hierarchical=hier, duplicates=False) if variant == "reference" else (None, None)
    loss = build(name, include_self=variant == "include_self")
    assert loss.shares_retrieval_set(rx is not None)
    values, grads = [], []
    for fn in (loss, lambda *a: separate(loss, *a)):
        xg = x.clone().requires_grad_(True)
        rg = None if rx is None else rx.clone().requires_grad_(True)
        loss.zero_grad()
        value = fn(xg, lab, rg, rlab) if rx is not None else fn(xg, lab)
        value.backward()
        values.append(value)
        params = [p.grad.clone() for p in loss.parameters()]
        grads.append([xg.grad] + ([] if rg is None else [rg.grad]) + params)
    torch.testing.assert_close(values[0], values[1], rtol=1e-12, atol=1e-14)
    for shared, alone in zip(*grads, strict=True):
        torch.testing.assert_close(shared, alone, rtol=1e-10, atol=1e-14)
    assert grads[0][0].abs().sum() > 0


@pytest.mark.parametrize("name, expected", [("roadmap", 1), ("rod_ap", 1), ("happier", 1), ("sup_ap", 1), ("calibration", 1)])
def test_score_matrix_and_levels_computed_once(monkeypatch, name, expected):
    calls = {"pairwise": 0, "same_class": 0}

    def counted(fn, key):
        def wrapper(*args, **kwargs):
            calls[key] += 1
            return fn(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(sim, "pairwise", counted(sim.pairwise, "pairwise"))
    monkeypatch.setattr(base, "same_class", counted(base.same_class, "same_class"))
    x, lab = batch(13, n=12, hierarchical=name == "happier")
    loss = build(name) if name in COMBINATIONS else L.build(name)
    loss(x.requires_grad_(True), lab).backward()
    assert calls == {"pairwise": expected, "same_class": expected}
    if name == "roadmap":  # the reference path computes both twice
        calls.update(pairwise=0, same_class=0)
        separate(loss, x, lab)
        assert calls == {"pairwise": 2, "same_class": 2}


def test_terms_that_cannot_share_run_separately():
    """Another similarity, or a flat term next to a hierarchical one on 2-D labels: each term on its own set."""
    x, lab = batch(14, n=12, hierarchical=True)
    for loss in (L.ROD(L.SupAPLoss(), L.CalibrationLoss(similarity="dot"), 0.3), L.ROD(L.HAPLoss(), L.CalibrationLoss(), 0.3)):
        assert not loss.shares_retrieval_set(False)
        xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        value, expected = loss(xa, lab), separate(loss, xb, lab)
        torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-14)
        value.backward()
        expected.backward()
        torch.testing.assert_close(xa.grad, xb.grad, rtol=1e-10, atol=1e-14)
    no_reference = L.ROD(L.SupAPLoss(), L.CalibrationLoss(), 0.5)
    no_reference.decomposability_loss.accepts_reference = False
    assert no_reference.shares_retrieval_set(False) and not no_reference.shares_retrieval_set(True)


@pytest.mark.parametrize("shared_top", [True, False])
def test_compiled_step_counts_equal_torch_and_brute_force(shared_top):
    """float32 scores with exact ties, -0.0 next to +0.0, padding (level 0) and rows of equal scores."""
    x, lab = tied_batch(5, 40, shared_top=shared_top)
    scores = x @ x.T
    scores[:, :4] = torch.tensor([0.0, -0.0, 0.0, -0.0])
    scores[0] = 0.25
    levels = (lab.unsqueeze(1) == lab.unsqueeze(0)).sum(2)
    levels[:, -5:] = 0
    compiled = S.level_step_counts(scores, levels, 3, method="compiled")
    torch.testing.assert_close(compiled, S.level_step_counts(scores, levels, 3, method="torch"), rtol=0, atol=0)
    torch.testing.assert_close(compiled.double(), brute_counts(scores, levels, 3), rtol=0, atol=0)
    with pytest.raises(ValueError, match="float32 CPU"):
        S.level_step_counts(scores.double(), levels, 3, method="compiled")
    with pytest.raises(ValueError, match="unknown method"):
        S.level_step_counts(scores, levels, 3, method="fast")


@pytest.mark.parametrize("cap", [True, False])
def test_kernel_blocks_do_not_change_values_or_gradients(monkeypatch, cap):
    """One block of rows vs blocks of a single row (float64, exact ties and differences right at delta)."""
    g = torch.Generator().manual_seed(6)
    scores = torch.randn(7, 30, generator=g, dtype=torch.float64) * 0.1
    scores[:, :3] = scores[:, 3:6]
    scores[:, 6] = scores[:, 7] + S.default_delta()
    pivots = scores[:, [3, 4, 7]]
    masks = torch.rand(7, 2, 30, generator=g) < 0.6
    weights = torch.randn(7, 3, 2, generator=g, dtype=torch.float64)
    results = []
    for block in (1 << 20, 1):
        monkeypatch.setattr(S, "KERNEL_BLOCK", block)
        a, p = scores.clone().requires_grad_(True), pivots.clone().requires_grad_(True)
        sums = S.sup_rank_sums(a, p, masks, tau=0.01, rho=100.0, delta=S.default_delta(), start=0.5) if cap else S.sigmoid_sums(a, p, masks, 0.01)
        (sums * weights).sum().backward()
        results.append((sums.detach(), a.grad, p.grad))
    for one, many in zip(*results, strict=True):
        torch.testing.assert_close(one, many, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("density", [0.02, 0.5, 1.0])
def test_padded_columns_and_row_counts(density):
    g = torch.Generator().manual_seed(7)
    mask = torch.rand(9, 33, generator=g) < density
    mask[3] = False  # an empty row
    index, present = S.padded_columns(mask)
    counts = mask.sum(1)
    assert present.sum(1).tolist() == counts.tolist() and index.shape[1] == max(1, int(counts.max()))
    for row in range(9):
        assert index[row][present[row]].tolist() == mask[row].nonzero().flatten().tolist()
        assert (index[row][~present[row]] == 0).all()
    torch.testing.assert_close(S.row_counts(mask), counts)
    wide = torch.rand(5, S.KERNEL_BLOCK // 2 + 1, generator=g) < density  # two rows per block: three blocks
    torch.testing.assert_close(S.row_counts(wide), wide.sum(1))


def test_roadmap_method_reaches_both_terms_and_both_paths_agree():
    """``method`` is named by Sup-AP and calibration alike: ``build("roadmap", method=...)`` sets it on both, and the
    compiled and torch paths of the whole combination give the same value and gradient."""
    import rankopt.losses as L

    x = torch.randn(24, 8, generator=torch.Generator().manual_seed(3))
    labels = torch.arange(24) // 3
    results = []
    for method in ("compiled", "torch"):
        loss = L.build("roadmap", method=method)
        assert loss.rank_loss.method == method and loss.decomposability_loss.method == method
        xg = x.clone().requires_grad_(True)
        value = loss(xg, labels)
        value.backward()
        results.append((value.detach(), xg.grad))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-4, atol=1e-6)
