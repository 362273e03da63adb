"""``evaluate(..., query_groups=..., ref_groups=...)``: each query ignores the references of its
exclusion group (open-metric-learning's ``sequence``), by index, on every search path.

Oracle: the brute-force loops of ``reference.py`` (float64, from the definitions) with each query's
retrieval set written out: the gallery minus its own item and the items of its group. Integer-valued
embeddings with the dot product give many exact ties (pessimistic ranks). All data are synthetic.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import rankopt.metrics.evaluation as ev
from rankopt.metrics import ALL_METRICS, evaluate

from . import reference

TOPK = ["recall@1", "recall@3", "recall@100", "precision@4", "precision@100", "true_recall@2", "map@r", "map@3", "map@100"]


def _items(rng, n: int, levels: int, num_classes: int = 6):
    x = rng.integers(-1, 2, size=(n, 3)).astype(np.float64)
    fine = rng.integers(0, num_classes, size=n)
    labels = np.stack([fine] + [fine // (2 * (c + 1)) for c in range(levels - 1)], axis=1)
    return x, labels


def _groups(rng, labels: np.ndarray, num_groups: int = 5) -> np.ndarray:
    """Random groups (-1: none, about a sixth); class 0's items all in group 0, so its queries in
    group 0 have every positive in their own group."""
    groups = rng.integers(-1, num_groups, size=len(labels))
    groups[labels[:, 0] == 0] = 0
    return groups


def _self_case(seed: int, n: int = 26, levels: int = 1):
    rng = np.random.default_rng(seed)
    x, y = _items(rng, n, levels)
    return x, y, _groups(rng, y)


def _separate_case(seed: int, levels: int = 1, copies: bool = True):
    """Queries and a gallery holding copies of some queries (same embedding, labels and group) among other
    items; ``index``: each query's copy, -1 for none (or every -1 without ``copies``)."""
    rng = np.random.default_rng(seed)
    x, y = _items(rng, 14, levels)
    gq = _groups(rng, y)
    with_copy = np.flatnonzero(rng.random(14) < 0.6) if copies else np.array([], dtype=np.int64)
    xo, yo = _items(rng, 18, levels)
    go = _groups(rng, yo)
    xr, yr, gr = (np.concatenate([a[with_copy], b]) for a, b in ((x, xo), (y, yo), (gq, go)))
    perm = rng.permutation(len(xr))
    xr, yr, gr = xr[perm], yr[perm], gr[perm]
    index = np.full(14, -1, dtype=np.int64)
    index[with_copy] = np.argsort(perm)[np.arange(len(with_copy))]
    return x, y, gq, xr, yr, gr, index


def _brute_self(x, y, g, names):
    return reference.evaluate(x, y, None, None, names, "dot", query_groups=g)


def _brute_separate(x, y, gq, xr, yr, gr, index, names):
    """One query at a time on the gallery without its own copy, its group left out by the reference."""
    per: dict[str, list[float]] = {name: [] for name in names}
    without = 0
    for i in range(len(x)):
        keep = np.arange(len(xr)) != index[i]
        values, no_pos = reference.evaluate(x[i : i + 1], y[i : i + 1], xr[keep], yr[keep], names, "dot",
                                            query_groups=gq[i : i + 1], ref_groups=gr[keep])
        without += no_pos
        for name, value in values.items():
            if not math.isnan(value):
                per[name].append(value)
    return {name: (sum(v) / len(v) if v else math.nan) for name, v in per.items()}, without


def _assert_close(got, want: dict[str, float], without: int) -> None:
    assert set(got.metrics) == set(want)
    for name, value in want.items():
        if math.isnan(value):
            assert math.isnan(got.metrics[name]), name
        else:
            assert got.metrics[name] == pytest.approx(value, abs=1e-9), name
    assert got.num_queries_without_positive == without


def _check_self(case, names, **kwargs):
    x, y, g = case
    t = torch.as_tensor
    got = evaluate(t(x), t(y), metrics=names, similarity="dot", query_groups=t(g), **kwargs)
    _assert_close(got, *_brute_self(x, y, g, names))
    return got


def _check_separate(case, names, **kwargs):
    x, y, gq, xr, yr, gr, index = case
    t = torch.as_tensor
    got = evaluate(t(x), t(y), t(xr), t(yr), metrics=names, similarity="dot", query_ref_index=t(index),
                   query_groups=t(gq), ref_groups=t(gr), **kwargs)
    _assert_close(got, *_brute_separate(x, y, gq, xr, yr, gr, index, names))
    return got


def _hierarchical_names(levels: int) -> list[str]:
    return list(ALL_METRICS) + [f"ap@level{c}" for c in range(1, levels)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("levels", [1, 3])
def test_every_metric_self_retrieval(seed, levels):
    """Chunks sorted per row (hierarchical metrics); chunks mix queries with and without a group."""
    _check_self(_self_case(seed, levels=levels), _hierarchical_names(levels), chunk_size=1 + seed % 5)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("levels", [1, 3])
def test_every_metric_separate_gallery_with_copies(seed, levels):
    """Groups and each query's copy (``query_ref_index``) excluded together; a copy shares its query's group."""
    _check_separate(_separate_case(seed, levels=levels, copies=seed % 2 == 0), _hierarchical_names(levels),
                    chunk_size=1 + seed % 4)


@pytest.mark.parametrize("seed", range(6))
def test_topk_lists(seed):
    """Top-k metrics alone: top-K lists per chunk (self-retrieval leaves its symmetric tiles for them)."""
    _check_self(_self_case(seed), TOPK, chunk_size=1 + seed % 6)
    _check_separate(_separate_case(seed), TOPK, chunk_size=1 + seed % 6)


@pytest.mark.parametrize("seed", range(5))
def test_counting_and_sorting_full_binary(seed, monkeypatch):
    """map/mrr count per positive, or, with many positives, sort the rows: both exact."""
    names = ["map", "mrr", "recall@1", "map@r"]
    counted = _check_self(_self_case(seed), names, chunk_size=1 + seed % 4)
    _check_separate(_separate_case(seed), names)
    monkeypatch.setattr(ev, "MAX_COUNTED_POSITIVES", 0)
    assert _check_self(_self_case(seed), names, chunk_size=3).metrics == pytest.approx(counted.metrics)
    _check_separate(_separate_case(seed), names)


@pytest.mark.parametrize("seed", range(4))
def test_reference_blocks(seed):
    """``ref_block_size``: the groups excluded inside each block of the reference set."""
    for names in (TOPK, ["map", "mrr", "recall@1"]):
        _check_self(_self_case(seed), names, ref_block_size=1 + seed * 3, chunk_size=5)
        _check_separate(_separate_case(seed), names, ref_block_size=2 + seed, chunk_size=4)


@pytest.mark.parametrize("seed", range(3))
def test_tiled_path_routes_to_chunked(seed, monkeypatch):
    """Above the tiled threshold ``method="auto"`` takes the chunked path with groups (still exact);
    ``method="tiled"`` is refused; without groups the tiled kernels run and give the plain values."""
    monkeypatch.setattr(ev, "TILED_MIN_SCORES", 0)
    names = ["recall@1", "map@r", "map", "mrr"]
    x, y, g = _self_case(seed)
    got = _check_self((x, y, g), names)
    plain = evaluate(torch.as_tensor(x), torch.as_tensor(y), metrics=names, similarity="dot", method="tiled")
    assert plain.metrics == pytest.approx(reference.evaluate(x, y, None, None, names, "dot")[0])
    assert got.metrics != pytest.approx(plain.metrics)  # the groups matter on these data
    _check_separate(_separate_case(seed), names)
    with pytest.raises(ValueError, match=r"method='tiled' needs no exclusion groups"):
        evaluate(torch.as_tensor(x), torch.as_tensor(y), query_groups=torch.as_tensor(g), method="tiled")


def test_a_sequence_holding_every_positive_leaves_no_positive():
    """Items 0 and 1, one class, share a group: neither has a positive left (OML's tiger frames)."""
    x = torch.tensor([[1.0, 0.0], [0.99, 0.1], [0.9, 0.3], [0.0, 1.0], [0.1, 0.99]])
    y = torch.tensor([0, 0, 1, 1, 2])
    g = torch.tensor([7, 7, -1, 5, -1])
    names = ["recall@1", "map", "mrr"]
    got = evaluate(x, y, metrics=names, query_groups=g)
    want, without = reference.evaluate(x.numpy(), y.numpy(), None, None, names, query_groups=g.numpy())
    assert got.num_queries_without_positive == without == 3  # queries 0, 1 (their group) and 4 (a single item)
    assert got.num_excluded["map"] == 3
    assert got.metrics == pytest.approx(want)
    plain = evaluate(x, y, metrics=names)
    assert plain.num_queries_without_positive == 1
    assert plain.metrics == pytest.approx(reference.evaluate(x.numpy(), y.numpy(), None, None, names)[0])


def test_no_group_anywhere_is_the_plain_evaluation():
    x, y, _ = (torch.as_tensor(a) for a in _self_case(3, levels=3))
    names = _hierarchical_names(3)
    none = torch.full((len(x),), -1)
    got = evaluate(x, y, metrics=names, similarity="dot", query_groups=none)
    assert got.metrics == pytest.approx(evaluate(x, y, metrics=names, similarity="dot").metrics, nan_ok=True)


def test_a_query_with_nothing_to_retrieve_is_counted():
    """Query 2's group holds the whole rest of the gallery: an empty retrieval set, every metric undefined."""
    x = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.2, 0.9]])
    y = torch.tensor([0, 0, 1, 1])
    xr, yr = x.clone(), y.clone()
    names = ["recall@1", "map", "h-ap", "ndcg"]
    qg, rg = torch.tensor([-1, -1, 3, -1]), torch.tensor([3, 3, 3, 3])
    got = evaluate(x, torch.stack([y, y // 2], 1), xr, torch.stack([yr, yr // 2], 1), metrics=names,
                   query_ref_index=torch.arange(4), query_groups=qg, ref_groups=rg)
    assert got.num_queries_without_positive == 1 and got.num_excluded["map"] == 1 and got.num_excluded["ndcg"] == 1
    assert got.metrics["recall@1"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no query has an item to retrieve"):
        evaluate(x, y, query_groups=torch.zeros(4, dtype=torch.long))


def test_bad_groups_are_named():
    x, y = torch.randn(5, 3), torch.arange(5) % 2
    xr, yr = torch.randn(7, 3), torch.arange(7) % 2
    with pytest.raises(ValueError, match=r"query_groups must have shape \(5,\)"):
        evaluate(x, y, query_groups=torch.zeros(4, dtype=torch.long))
    with pytest.raises(TypeError, match="query_groups must be an integer tensor"):
        evaluate(x, y, query_groups=torch.zeros(5))
    with pytest.raises(TypeError, match="ref_groups must be a torch.Tensor"):
        evaluate(x, y, xr, yr, query_groups=torch.zeros(5, dtype=torch.long), ref_groups=[0] * 7)
    with pytest.raises(ValueError, match=r"ref_groups must have shape \(7,\)"):
        evaluate(x, y, xr, yr, query_groups=torch.zeros(5, dtype=torch.long), ref_groups=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="together"):
        evaluate(x, y, xr, yr, query_groups=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="ref_groups needs ref_embeddings"):
        evaluate(x, y, ref_groups=torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match="backend='faiss' cannot exclude groups"):
        evaluate(x, y, metrics=["recall@1"], backend="faiss", query_groups=torch.zeros(5, dtype=torch.long))
