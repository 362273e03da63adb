"""The compiled sums of ``H^-`` and of the sigmoid (``method="compiled"``, numba) against the dense torch
path (the reference) and the elementwise definition: values and gradients, float32 and float64, exact ties,
differences exactly at ``delta``, empty masks, several blocks, and the losses built on them."""

from __future__ import annotations

import pytest
import torch

import rankopt.losses as L
from rankopt.rank import surrogates as S

from .test_step_counts import tied_batch

TAU, DELTA = 0.25, 0.125
"""Powers of two: dyadic scores give exact scaled differences, some exactly ``delta / tau`` (the branch boundary)."""


def dyadic_case(dtype, seed: int = 0, rows: int = 6, width: int = 40, num_masks: int = 3):
    """Scores in multiples of 1/16 (exact ties; differences exactly 0 and exactly ``DELTA``), pivots drawn from
    the items with repeats, masks with one empty mask and one empty row."""
    g = torch.Generator().manual_seed(seed)
    scores = (torch.randint(-8, 9, (rows, width), generator=g) / 16).to(dtype)
    pivot_index = torch.randint(0, width, (rows, 7), generator=g)
    pivot_index[:, 1] = pivot_index[:, 0]  # tied pivots
    masks = torch.rand(rows, num_masks, width, generator=g) < 0.6
    masks[0, 1] = False
    masks[2] = False
    return scores, pivot_index, masks


def sums_and_gradients(method: str, scores, pivot_index, masks, weights, **kernel):
    a = scores.clone().requires_grad_(True)
    sums = S.sup_rank_sums(a, torch.gather(a, 1, pivot_index), masks, method=method, **kernel)
    (sums * weights).sum().backward()
    return sums.detach(), a.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kernel", [dict(tau=TAU, rho=3.0, delta=DELTA, start=0.5), dict(tau=0.01, rho=100.0, delta=S.default_delta(), start=0.0)])
def test_compiled_sums_equal_the_torch_path_and_the_definition(dtype, kernel):
    scores, pivot_index, masks = dyadic_case(dtype)
    if kernel["tau"] == TAU:  # the case really has differences exactly at delta, on both sides of pivots
        diff = scores.unsqueeze(1) - torch.gather(scores, 1, pivot_index).unsqueeze(2)
        assert (diff == DELTA).any() and (diff == 0).any()
    weights = torch.randn(scores.shape[0], pivot_index.shape[1], masks.shape[1], generator=torch.Generator().manual_seed(1), dtype=dtype)
    compiled = sums_and_gradients("compiled", scores, pivot_index, masks, weights, **kernel)
    dense = sums_and_gradients("torch", scores, pivot_index, masks, weights, **kernel)
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-11)
    for fast, reference in zip(compiled, dense, strict=True):
        torch.testing.assert_close(fast, reference, **tol)
    # the definition, elementwise in float64: sum_{k in mask g} H^-(s_k - s_p), autograd for the gradient
    a = scores.double().requires_grad_(True)
    diff = a.unsqueeze(1) - torch.gather(a, 1, pivot_index).unsqueeze(2)
    steps = S.sup_step(diff.unsqueeze(2), kernel["tau"], kernel["rho"], kernel["delta"], kernel["start"])
    definition = (steps * masks.unsqueeze(1)).sum(-1)
    (definition * weights.double()).sum().backward()
    torch.testing.assert_close(compiled[0].double(), definition.detach(), **tol)
    torch.testing.assert_close(compiled[1].double(), a.grad, **tol)
    assert (compiled[0][2] == 0).all() and (compiled[0][0, :, 1] == 0).all()  # empty row, empty mask: exactly 0


def test_compiled_sums_over_several_blocks_and_wide_rows(monkeypatch):
    """Blocks of one row and rows much wider than the pivots (float32, random scores): same as the torch path."""
    g = torch.Generator().manual_seed(2)
    scores = torch.randn(9, 300, generator=g) * 0.05
    pivot_index = torch.randint(0, 300, (9, 31), generator=g)
    masks = torch.rand(9, 2, 300, generator=g) < 0.9
    weights = torch.randn(9, 31, 2, generator=g)
    kernel = dict(tau=0.01, rho=100.0, delta=S.default_delta(), start=0.5)
    dense = sums_and_gradients("torch", scores, pivot_index, masks, weights, **kernel)
    monkeypatch.setattr(S, "KERNEL_BLOCK", 1)
    compiled = sums_and_gradients("compiled", scores, pivot_index, masks, weights, **kernel)
    for fast, reference in zip(compiled, dense, strict=True):
        torch.testing.assert_close(fast, reference, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["sup_ap", "hap"])
@pytest.mark.parametrize("reference", [False, True])
def test_losses_equal_with_both_methods(name, dtype, reference):
    """Sup-AP and Sup-H-AP (coarsest level shared by every item: every item a pivot, few in the H^- kernel) with
    exact ties, with and without a reference set: compiled and torch sums give the same values and gradients."""
    x, lab = tied_batch(3, 24, dtype=dtype)
    refs = tied_batch(4, 7, dtype=dtype) if reference else (None, None)
    results = []
    for method in ("compiled", "torch"):
        loss = L.build(name, method=method, similarity="dot", max_elements=200)  # several row chunks
        xg = x.clone().requires_grad_(True)
        rg = None if refs[0] is None else refs[0].clone().requires_grad_(True)
        value = loss(xg, lab, rg, refs[1])
        value.backward()
        results.append((value.detach(), xg.grad) + (() if rg is None else (rg.grad,)))
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-13)
    for fast, dense in zip(*results, strict=True):
        torch.testing.assert_close(fast, dense, **tol)
    assert all(bool(torch.isfinite(g).all()) for g in results[0][1:])  # chunks of rows without a positive: no NaN
    assert float(results[0][1].abs().sum()) > 0


def test_method_is_checked():
    scores = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="unknown method"):
        S.sup_rank_sums(scores, scores, torch.ones(2, 1, 3), tau=0.01, rho=1.0, delta=0.05, start=0.5, method="fast")
    with pytest.raises(ValueError, match="float32 or float64 CPU"):
        S.sup_rank_sums(scores.half(), scores.half(), torch.ones(2, 1, 3), tau=0.01, rho=1.0, delta=0.05, start=0.5, method="compiled")
    with pytest.raises(ValueError, match="unknown method"):
        S.sigmoid_sums(scores, scores, torch.ones(2, 1, 3), 0.01, method="fast")
    with pytest.raises(ValueError, match="unknown method"):
        L.build("sup_ap", method="fast")
    assert "method='torch'" in repr(L.build("hap", method="torch"))


def sigmoid_sums_and_gradients(method: str, scores, pivot_index, masks, weights, tau):
    a = scores.clone().requires_grad_(True)
    sums = S.sigmoid_sums(a, torch.gather(a, 1, pivot_index), masks, tau, method=method)
    (sums * weights).sum().backward()
    return sums.detach(), a.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_compiled_sigmoid_sums_equal_the_torch_path_and_the_definition(dtype):
    """Smooth-AP's sums (no cap) with exact ties, an empty mask and an empty row: compiled = torch = the definition."""
    scores, pivot_index, masks = dyadic_case(dtype, seed=3)
    weights = torch.randn(scores.shape[0], pivot_index.shape[1], masks.shape[1], generator=torch.Generator().manual_seed(4), dtype=dtype)
    compiled = sigmoid_sums_and_gradients("compiled", scores, pivot_index, masks, weights, TAU)
    dense = sigmoid_sums_and_gradients("torch", scores, pivot_index, masks, weights, TAU)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    for fast, reference in zip(compiled, dense, strict=True):
        torch.testing.assert_close(fast, reference, **tol)
    a = scores.double().requires_grad_(True)
    diff = a.unsqueeze(1) - torch.gather(a, 1, pivot_index).unsqueeze(2)
    definition = (torch.sigmoid(diff / TAU).unsqueeze(2) * masks.unsqueeze(1)).sum(-1)
    (definition * weights.double()).sum().backward()
    torch.testing.assert_close(compiled[0].double(), definition.detach(), **tol)
    torch.testing.assert_close(compiled[1].double(), a.grad, **tol)
    assert (compiled[0][2] == 0).all() and (compiled[0][0, :, 1] == 0).all()


@pytest.mark.parametrize("cap", [False, True])
def test_compiled_sums_of_a_row_spread_past_the_factorised_range(cap):
    """A row whose scaled scores spread over ``SPREAD`` takes ``exp`` per pair (its factors would overflow): the same
    values and gradients as the torch path, float64, next to an ordinary row."""
    from rankopt.rank import _surrogate_kernels as kernels

    g = torch.Generator().manual_seed(5)
    scores = torch.rand(2, 50, generator=g, dtype=torch.float64) * 0.5
    scores[1, :25] += 20.0  # tau = 0.01: a spread of ~2000 in units of tau
    pivot_index = torch.randint(0, 50, (2, 6), generator=g)
    masks = torch.rand(2, 2, 50, generator=g) < 0.7
    weights = torch.randn(2, 6, 2, generator=g, dtype=torch.float64)
    mode = kernels.exponentials(scores / 0.01, torch.gather(scores, 1, pivot_index) / 0.01)[4]
    assert mode.tolist() == [kernels.FLOAT64, kernels.DIRECT]
    if cap:
        kernel = dict(tau=0.01, rho=100.0, delta=S.default_delta(), start=0.5)
        results = [sums_and_gradients(m, scores, pivot_index, masks, weights, **kernel) for m in ("compiled", "torch")]
    else:
        results = [sigmoid_sums_and_gradients(m, scores, pivot_index, masks, weights, 0.01) for m in ("compiled", "torch")]
    for fast, reference in zip(*results, strict=True):
        assert torch.isfinite(fast).all()
        torch.testing.assert_close(fast, reference, rtol=1e-10, atol=1e-10)


def test_float32_rows_take_float32_values_only_within_their_range():
    """float32 rows spread over at most ``SPREAD_FLOAT32`` are evaluated in float32 (sums in float64), wider ones in
    float64 and past ``SPREAD`` per pair: each equal to the torch path on the same float32 inputs."""
    from rankopt.rank import _surrogate_kernels as kernels

    g = torch.Generator().manual_seed(8)
    scores = torch.rand(3, 700, generator=g, dtype=torch.float64) * 0.4 - 0.2
    scores[1, :300] += 1.0  # tau = 0.01: a spread of ~140 (float32 mode), ~240 (float64) and ~2040 (per pair)
    scores[1, 300:] -= 0.2
    scores[2, :100] += 20.0
    scores[0, :50] += 1.8
    scores = scores[[1, 0, 2]]
    pivot_index = torch.randint(0, 700, (3, 9), generator=g)
    masks = torch.rand(3, 2, 700, generator=g) < 0.6
    weights = torch.randn(3, 9, 2, generator=g, dtype=torch.float64)
    narrow = scores.float()
    mode = kernels.exponentials(narrow / 0.01, torch.gather(narrow, 1, pivot_index) / 0.01)[4]
    assert mode.tolist() == [kernels.FLOAT32, kernels.FLOAT64, kernels.DIRECT]
    assert kernels.exponentials(scores / 0.01, torch.gather(scores, 1, pivot_index) / 0.01)[4].tolist() == [kernels.FLOAT64] * 2 + [kernels.DIRECT]
    kernel = dict(tau=0.01, rho=100.0, delta=S.default_delta(), start=0.5)
    reference = sums_and_gradients("torch", narrow, pivot_index, masks, weights.float(), **kernel)  # the same float tests
    fast = sums_and_gradients("compiled", narrow, pivot_index, masks, weights.float(), **kernel)
    for got, want in zip(fast, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_compiled_sums_pass_gradcheck():
    """Scores and pivots as separate float64 inputs, differences away from 0 and ``delta`` (no branch switch within
    the finite-difference step): the compiled backward is the derivative of the compiled forward."""
    g = torch.Generator().manual_seed(6)
    scores = torch.rand(3, 9, generator=g, dtype=torch.float64).requires_grad_(True)
    pivots = torch.rand(3, 4, generator=g, dtype=torch.float64).requires_grad_(True)
    masks = torch.rand(3, 2, 9, generator=g) < 0.7
    kernel = dict(tau=0.1, rho=3.0, delta=0.05, start=0.5, method="compiled")
    assert torch.autograd.gradcheck(lambda a, p: S.sup_rank_sums(a, p, masks, **kernel), (scores, pivots))
    assert torch.autograd.gradcheck(lambda a, p: S.sigmoid_sums(a, p, masks, 0.1, method="compiled"), (scores, pivots))
