"""The rank losses (Sup-AP, Smooth-AP, Sup-H-AP, Sup-NDCG) under a given relevance (multi-label items, a grade
matrix) against a float64 brute force written here from their definitions, their gradients by
``torch.autograd.gradcheck``, and labels against the equivalent relevance.

Brute force, per query ``i`` with a relevant item (``Omega``: the other items; ``P``: grade ``> 0``):

* Smooth-AP (Eq. 6-7): ``rank(j) = 1 + sum_{k in Omega, k != j} G(s_k - s_j)``, ``rank+(j)`` the same over ``P``,
  ``1 - mean_j rank+(j)/rank(j)``, ``G(t) = sigma(t / tau)``.
* SupRank (TPAMI Eq. 3-5): ``rank+(k) = 1 + #{j != k : g_j >= g_k, s_j >= s_k}`` (exact, ties pessimistic),
  ``rank-(k) = sum_{j : g_j < g_k} H^-(s_j - s_k)`` with ``H^-`` of TPAMI Eq. 4; flat losses use ``g > 0`` as grades.
* Sup-AP (Eq. 11): ``1 - mean_{k in P} rank+(k)/(rank+(k) + rank-(k))``.
* Sup-H-AP (Eq. 18-21): ``rel(k) = (g_k/G) / |Omega^(g_k)|``, ``H-rank+(k) = rel(k) + sum_{j in P, j != k}
  min(rel(k), rel(j)) 1[s_j >= s_k]``, ``1 - sum_k H-rank+(k)/(rank+(k) + rank-(k)) / sum_k rel(k)``.
* Sup-NDCG (Eq. 24): ``1 - sum_k (2^g_k - 1)/log2(1 + rank+(k) + rank-(k)) / iDCG``, iDCG the ideal DCG.

The loss is the mean over the queries with a relevant item.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rankopt.losses import build
from rankopt.rank import Relevance

TAU, RHO, START = 0.01, 100.0, 0.5
DELTA = TAU * math.log(0.99 / 0.01)


def sigmoid(t: float) -> float:
    return 1.0 / (1.0 + math.exp(-t))


def h_minus(t: float) -> float:
    if t < 0:
        return sigmoid(t / TAU)
    if t <= DELTA:
        return sigmoid(t / TAU) + START
    return RHO * (t - DELTA) + sigmoid(DELTA / TAU) + START


def brute(name: str, scores: np.ndarray, grades: np.ndarray) -> float:
    """The loss over the batch: ``scores``/``grades`` ``(B, M)``, query ``i`` is item ``i``."""
    flat = name in ("sup_ap", "smooth_ap")
    g_all = (grades > 0).astype(int) if flat else grades
    top = max(int(g_all.max()), 1)
    terms = []
    for i in range(scores.shape[0]):
        omega = [j for j in range(scores.shape[1]) if j != i]
        s, g = scores[i], g_all[i]
        pos = [j for j in omega if g[j] > 0]
        if not pos:
            continue
        if name == "smooth_ap":
            rank = {j: 1 + sum(sigmoid((s[k] - s[j]) / TAU) for k in omega if k != j) for j in pos}
            plus = {j: 1 + sum(sigmoid((s[k] - s[j]) / TAU) for k in pos if k != j) for j in pos}
            terms.append(1 - sum(plus[j] / rank[j] for j in pos) / len(pos))
            continue
        plus = {k: 1 + sum(1 for j in omega if j != k and g[j] >= g[k] and s[j] >= s[k]) for k in pos}
        minus = {k: sum(h_minus(s[j] - s[k]) for j in omega if g[j] < g[k]) for k in pos}
        rank = {k: plus[k] + minus[k] for k in pos}
        if name == "sup_ap":
            terms.append(1 - sum(plus[k] / rank[k] for k in pos) / len(pos))
        elif name == "hap":
            size = {lv: sum(1 for j in omega if g[j] == lv) for lv in range(1, top + 1)}
            rel = {k: (g[k] / top) / size[g[k]] for k in pos}
            h_plus = {k: rel[k] + sum(min(rel[k], rel[j]) for j in pos if j != k and s[j] >= s[k]) for k in pos}
            terms.append(1 - sum(h_plus[k] / rank[k] for k in pos) / sum(rel.values()))
        else:
            dcg = sum((2.0 ** g[k] - 1) / math.log2(1 + rank[k]) for k in pos)
            ideal = sorted((2.0 ** g[k] - 1 for k in pos), reverse=True)
            terms.append(1 - dcg / sum(v / math.log2(2 + n) for n, v in enumerate(ideal)))
    return sum(terms) / len(terms)


LOSSES = ["sup_ap", "smooth_ap", "hap", "sup_ndcg"]


def dyadic_batch(seed: int, b: int, r: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings in multiples of 1/8: dot products exact in float64, many exact ties."""
    rng = np.random.default_rng(seed)
    return (torch.from_numpy(rng.integers(-2, 3, size=(n, 3)) / 8.0) for n in (b, r))  # type: ignore[return-value]


@pytest.mark.parametrize("name", LOSSES)
@pytest.mark.parametrize("seed", range(3))
def test_losses_under_multilabel_relevance_match_the_brute_force(name, seed):
    rng = np.random.default_rng(100 + seed)
    x, ref = dyadic_batch(seed, 10, 4)
    hot = torch.from_numpy((rng.random((14, 4)) < 0.35).astype(np.float64))
    hot[0] = 0  # a query without any label: no relevant item, left out
    for graded in (False, True):
        relevance = Relevance.multilabel(hot[:10], hot, graded=graded)
        loss = build(name, similarity="dot")
        items = torch.cat([x, ref])
        grades = relevance.block(slice(None)).numpy()
        want = brute(name, (x @ items.T).numpy(), grades)
        assert float(loss(x, relevance, ref)) == pytest.approx(want, abs=1e-10), graded
        assert loss.last_num_queries_without_positive == int(((grades * (1 - np.eye(10, 14))).sum(1) == 0).sum())


@pytest.mark.parametrize("name", LOSSES)
def test_losses_under_a_graded_matrix_match_the_brute_force(name):
    rng = np.random.default_rng(9)
    x, _ = dyadic_batch(1, 12)
    grades = torch.from_numpy(rng.choice(4, size=(12, 12), p=[0.55, 0.15, 0.15, 0.15]))
    loss = build(name, similarity="dot")
    want = brute(name, (x @ x.T).numpy(), grades.numpy())
    assert float(loss(x, Relevance.matrix(grades))) == pytest.approx(want, abs=1e-10)
    assert float(loss(x, Relevance.matrix(grades.to_sparse()))) == float(loss(x, Relevance.matrix(grades)))


@pytest.mark.parametrize("name", LOSSES)
def test_gradients_under_relevance(name):
    """Continuous scores (no ties, no score within the finite-difference step of a kink)."""
    rng = np.random.default_rng(4)
    x = torch.from_numpy(rng.normal(size=(7, 3))).requires_grad_(True)
    grades = torch.from_numpy(rng.choice(3, size=(7, 7), p=[0.4, 0.3, 0.3]))
    loss = build(name, tau=0.1)
    assert torch.autograd.gradcheck(lambda e: loss(e, Relevance.matrix(grades)), (x,), eps=1e-7, atol=1e-5)


@pytest.mark.parametrize("name", LOSSES)
def test_labels_and_their_relevance_give_the_same_loss_and_gradient(name):
    rng = np.random.default_rng(2)
    x = torch.from_numpy(rng.normal(size=(16, 5))).float().requires_grad_(True)
    ref = torch.from_numpy(rng.normal(size=(6, 5))).float()
    fine = torch.from_numpy(rng.integers(0, 4, size=22))
    labels = fine if name in ("sup_ap", "smooth_ap") else torch.stack([fine, fine // 2], 1)
    loss = build(name)
    by_labels = loss(x, labels[:16], ref, labels[16:])
    (grad_labels,) = torch.autograd.grad(by_labels, x)
    if labels.ndim == 1:
        relevance = Relevance.matrix((fine[:16, None] == fine[None, :]).long())
    else:
        hot = torch.zeros(22, 6)
        hot[torch.arange(22), fine] = 1
        hot[torch.arange(22), 4 + fine // 2] = 1
        relevance = Relevance.multilabel(hot[:16], hot, graded=True)
    by_relevance = loss(x, relevance, ref)
    (grad_relevance,) = torch.autograd.grad(by_relevance, x)
    assert torch.isfinite(by_labels)  # float32 Sup-NDCG once gave NaN: padding divided by log2(1 + ~0)
    assert torch.equal(by_labels, by_relevance) and torch.equal(grad_labels, grad_relevance)


def test_relevance_inputs_are_checked():
    x = torch.randn(4, 3)
    with pytest.raises(TypeError, match="FastAPLoss takes class labels, not a Relevance"):
        build("fastap")(x, Relevance.matrix(torch.eye(4)))
    with pytest.raises(TypeError, match="ROD combination .* takes class labels"):
        build("roadmap")(x, Relevance.matrix(torch.eye(4)))
    with pytest.raises(TypeError, match="a sum of losses takes class labels"):
        build("sup_ap+smooth_ap")(x, Relevance.matrix(torch.eye(4)))
    with pytest.raises(TypeError, match="TripletLoss takes class labels|takes class labels"):
        build("triplet")(x, Relevance.matrix(torch.eye(4)))
    with pytest.raises(ValueError, match=r"relevance is 4 x 4 \(matrix\) but the batch x its retrieval set"):
        build("sup_ap")(x, Relevance.matrix(torch.eye(4)), torch.randn(2, 3))
    with pytest.raises(ValueError, match="ref_labels must be None"):
        build("sup_ap")(x, Relevance.matrix(torch.zeros(4, 6)), torch.randn(2, 3), torch.zeros(2, dtype=torch.long))
