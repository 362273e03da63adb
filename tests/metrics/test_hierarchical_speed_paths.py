"""The hierarchical metrics' relevant-items path (``rankopt.metrics.hierarchical``) against brute
force and against the sorted rows it replaces.

``LevelIndex.relevant`` against every (query, reference) level counted directly;
``RankedLevels.from_scores`` against the ranked lists of the previous path (``torch.sort`` of
the whole row, ``list_ranks``, levels read along the order); the metrics per query against
``reference.py``. Scores are small integers (many exact ties, rows where every item ties), labels
are a tree, independent columns (not a tree) or have a column shared by every item; some query
classes are absent from the gallery and each query may have an excluded reference.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rankopt.metrics import evaluate
from rankopt.metrics.hierarchical import LevelIndex, RankedLevels, argsort_descending, hierarchical_metrics
from rankopt.metrics.ranking import count_below, sorted_rows
from rankopt.metrics.ranking import list_ranks

from . import reference

KINDS = ("tree", "independent", "shared")
NAMES = ["h-ap", "sum_wap", "ndcg", "asi", "ap@level0", "ap@level1", "ap@level2"]


def _labels(rng: np.random.Generator, n: int, kind: str) -> torch.Tensor:
    """``(n, 3)`` labels, column 0 finest."""
    fine = rng.integers(0, 6, n)
    if kind == "tree":
        cols = [fine, fine // 2, fine // 4]
    elif kind == "independent":  # a reference may share a coarse label and not a finer one
        cols = [fine, rng.integers(0, 3, n), rng.integers(0, 2, n)]
    else:  # the coarsest level is shared by every item
        cols = [fine, fine // 3, np.zeros(n, dtype=np.int64)]
    return torch.as_tensor(np.stack(cols, axis=1))


def _case(seed: int, kind: str, num_queries: int = 7, num_refs: int = 25):
    """Integer scores (ties), query labels partly absent from the gallery, an excluded reference per query or -1."""
    rng = np.random.default_rng(seed)
    r_labels = _labels(rng, num_refs, kind)
    q_labels = _labels(rng, num_queries, kind)
    q_labels[::3, 0] += 100  # finest class absent from the gallery
    exclude = torch.as_tensor(rng.integers(-1, num_refs, num_queries))
    scores = torch.as_tensor(rng.integers(-2, 3, (num_queries, num_refs)).astype(np.float32))
    scores[1] = 1.0  # every item tied
    has = exclude >= 0
    scores[has.nonzero().squeeze(1), exclude[has]] = float("-inf")
    dense = (q_labels.unsqueeze(1) == r_labels.unsqueeze(0)).sum(dim=2)  # (Q, R) levels, counted directly
    dense[has.nonzero().squeeze(1), exclude[has]] = 0  # not in the retrieval set
    return scores, q_labels, r_labels, exclude, dense


def _ranked(scores, q_labels, r_labels, exclude) -> RankedLevels:
    idx, levels = LevelIndex(r_labels).relevant(q_labels, exclude)
    sizes = scores.shape[1] - (exclude >= 0).long()
    return RankedLevels.from_scores(scores, idx, levels, sizes, r_labels.shape[1])


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("kind", KINDS)
def test_relevant_lists_each_relevant_reference_once_with_its_level(seed, kind):
    _, q_labels, r_labels, exclude, dense = _case(seed, kind)
    idx, levels = LevelIndex(r_labels).relevant(q_labels, exclude)
    assert idx.shape == levels.shape and int(levels.min()) >= 0
    for q in range(q_labels.shape[0]):
        got = sorted((int(k), int(lv)) for k, lv in zip(idx[q], levels[q]) if lv > 0)
        want = [(k, int(dense[q, k])) for k in range(r_labels.shape[0]) if dense[q, k] > 0]
        assert got == want


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("kind", KINDS)
def test_ranks_levels_and_counts_match_the_sorted_rows(seed, kind):
    scores, q_labels, r_labels, exclude, dense = _case(seed, kind)
    r = _ranked(scores, q_labels, r_labels, exclude)
    values, order = scores.sort(dim=1, descending=True)  # the previous path
    ranks = list_ranks(values, complete=True)
    sorted_levels = dense.gather(1, order)
    for q in range(scores.shape[0]):
        relevant = r.levels[q] > 0
        width = int(relevant.sum())
        assert bool(relevant[:width].all()) and not bool(relevant[width:].any())  # padding last
        assert bool((r.ranks[q, 1:width] >= r.ranks[q, : width - 1]).all())  # decreasing scores
        got = sorted(zip(r.ranks[q, :width].tolist(), r.levels[q, :width].tolist()))
        want = sorted((rk, lv) for rk, lv in zip(ranks[q].tolist(), sorted_levels[q].tolist()) if lv > 0)
        assert got == want
        for lv in range(1, r_labels.shape[1] + 1):
            assert r.counts[q, lv] == sum(1 for _, level in want if level == lv)
            at_or_before = [sum(1 for rk2, level in want if level == lv and rk2 <= rk) for rk in r.ranks[q, :width].tolist()]
            assert r.at_rank[lv - 1, q, :width].tolist() == at_or_before
        assert r.counts[q, 0] == scores.shape[1] - int(exclude[q] >= 0) - len(want)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("kind", KINDS)
def test_metrics_per_query_match_brute_force(seed, kind):
    scores, q_labels, r_labels, exclude, dense = _case(seed, kind)
    requests = [(name, "ap@level" if name.startswith("ap@level") else name, int(name[8:]) if name.startswith("ap@level") else 0)
                for name in NAMES]
    got = hierarchical_metrics(_ranked(scores, q_labels, r_labels, exclude), requests)
    for q in range(scores.shape[0]):
        omega = [k for k in range(scores.shape[1]) if k != int(exclude[q])]
        want = reference.query_metrics([float(scores[q, k]) for k in omega], [int(dense[q, k]) for k in omega], 3, NAMES)
        for name in NAMES:
            if math.isnan(want[name]):
                assert math.isnan(float(got[name][q])), (name, q)
            else:
                assert float(got[name][q]) == pytest.approx(want[name], abs=1e-12), (name, q)


def _ndcg(s: list[float], levels: list[int], gains: list[float]) -> float:
    """Eq. 23 with pessimistic ranks and any per-level gains (``g_0`` too), NaN without ideal gain."""
    ranks = [1 + sum(1 for k in range(len(s)) if k != j and s[k] >= s[j]) for j in range(len(s))]
    dcg = sum(gains[lv] / math.log2(1 + rk) for lv, rk in zip(levels, ranks))
    idcg = sum(g / math.log2(1 + i) for i, g in enumerate(sorted((gains[lv] for lv in levels), reverse=True), start=1))
    return dcg / idcg if idcg > 0 else math.nan


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("gains", [(0.5, 1.0, 3.0, 4.0), (2.0, 0.0, 1.0, 3.0)])
def test_ndcg_with_a_level_zero_gain(seed, gains):
    """``g_0 != 0``: the level-0 items' discounts come from the sorted rows (self-retrieval and a separate gallery)."""
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.integers(-1, 2, (20, 3)).astype(np.float64))
    xr = torch.as_tensor(rng.integers(-1, 2, (24, 3)).astype(np.float64))
    y, yr = _labels(rng, 20, KINDS[seed % 3]), _labels(rng, 24, KINDS[seed % 3])
    for query_labels, ref, ref_labels in ((y, None, None), (y, xr, yr)):
        got = evaluate(x, query_labels, ref, ref_labels, metrics=["ndcg"], similarity="dot", gains=list(gains), chunk_size=6)
        gallery, gallery_labels = (x, y) if ref is None else (xr, yr)
        per_query = []
        for q in range(x.shape[0]):
            omega = [k for k in range(gallery.shape[0]) if ref is not None or k != q]
            s = [float(x[q] @ gallery[k]) for k in omega]
            levels = [int((y[q] == gallery_labels[k]).sum()) for k in omega]
            per_query.append(_ndcg(s, levels, list(gains)))
        defined = [v for v in per_query if not math.isnan(v)]
        assert got.metrics["ndcg"] == pytest.approx(sum(defined) / len(defined), abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_sort_helpers_match_torch(dtype):
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.integers(-3, 4, (9, 40))).to(dtype)
    x[::2, 5] = float("-inf")
    ascending = sorted_rows(x)
    assert torch.equal(ascending, x.sort(dim=1).values)
    t = x[:, rng.permutation(40)[:12]]
    assert torch.equal(count_below(ascending, t), (x.unsqueeze(1) < t.unsqueeze(2)).sum(dim=2))
    order = argsort_descending(x)
    assert torch.equal(x.gather(1, order), x.sort(dim=1, descending=True).values)
    assert torch.equal(order.sort(dim=1).values, torch.arange(40).expand(9, -1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_equals_cpu():
    rng = np.random.default_rng(1)
    x = torch.as_tensor(rng.integers(-1, 2, (60, 4)).astype(np.float32))
    y = _labels(rng, 60, "independent")
    names = NAMES + ["map", "recall@1"]
    cpu = evaluate(x, y, metrics=names, similarity="dot", gains=[1.0, 1.0, 2.0, 4.0], chunk_size=7).metrics
    cuda = evaluate(x, y, metrics=names, similarity="dot", gains=[1.0, 1.0, 2.0, 4.0], chunk_size=7, device="cuda").metrics
    assert cuda == pytest.approx(cpu, abs=1e-9)
