"""``evaluate(..., query_categories=...)``: every metric per category of queries, each query retrieving
from the whole gallery (open-metric-learning's behaviour), equal to evaluating that category's queries
alone; on every search path. All data are synthetic.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import rankopt.metrics.evaluation as ev
from rankopt.metrics import ALL_METRICS, evaluate

from . import reference

CATEGORIES = ["shoes", "bags", None, "hats"]  # None: the query belongs to no category (overall values only)


def _case(seed: int, n: int = 30, levels: int = 1):
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.integers(-1, 2, size=(n, 3)).astype(np.float64))
    fine = torch.as_tensor(rng.integers(0, 7, size=n))
    y = torch.stack([fine, fine // 2, fine // 4], 1) if levels == 3 else fine
    categories = [CATEGORIES[i] for i in rng.integers(0, len(CATEGORIES), size=n)]
    groups = torch.as_tensor(rng.integers(-1, 4, size=n))
    return x, y, categories, groups


def _assert_same(got, want) -> None:
    assert got.metrics == pytest.approx(want.metrics, abs=1e-12, nan_ok=True)
    assert (got.num_queries, got.num_queries_without_positive, got.num_excluded) == (
        want.num_queries, want.num_queries_without_positive, want.num_excluded)


def _check_self_retrieval(x, y, categories, names, groups=None, **kwargs):
    """Self-retrieval per category = that category's queries against every item, each its own copy excluded."""
    got = evaluate(x, y, metrics=names, similarity="dot", query_categories=categories, query_groups=groups, **kwargs)
    assert got.metrics == pytest.approx(evaluate(x, y, metrics=names, similarity="dot", query_groups=groups, **kwargs).metrics,
                                        nan_ok=True)
    named = sorted({c for c in categories if c is not None})
    assert list(got.by_category) == named
    for name in named:
        rows = torch.tensor([i for i, c in enumerate(categories) if c == name])
        alone = evaluate(x[rows], y[rows], x, y, metrics=names, similarity="dot", query_ref_index=rows,
                         query_groups=None if groups is None else groups[rows], ref_groups=groups, **kwargs)
        _assert_same(got.by_category[name], alone)
    assert sum(r.num_queries for r in got.by_category.values()) == sum(c is not None for c in categories)
    return got


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("levels", [1, 3])
def test_per_category_equals_the_category_alone(seed, levels):
    x, y, categories, groups = _case(seed, levels=levels)
    names = list(ALL_METRICS) + (["ap@level1"] if levels == 3 else [])
    _check_self_retrieval(x, y, categories, names, chunk_size=1 + seed % 7)
    _check_self_retrieval(x, y, categories, names, groups=groups, chunk_size=4)  # with sequences too


@pytest.mark.parametrize("seed", range(3))
def test_every_search_path(seed, monkeypatch):
    """Symmetric top-k tiles, faiss lists, reference blocks and (above the threshold) the tiled kernels."""
    x, y, categories, _ = _case(seed)
    topk = ["recall@1", "precision@4", "map@r"]
    _check_self_retrieval(x, y, categories, topk)
    _check_self_retrieval(x, y, categories, topk, backend="faiss")
    _check_self_retrieval(x, y, categories, ["map", "recall@1"], ref_block_size=7, chunk_size=5)
    monkeypatch.setattr(ev, "TILED_MIN_SCORES", 0)
    _check_self_retrieval(x, y, categories, ["map", "mrr", "recall@1"], method="tiled")
    _check_self_retrieval(x, y, categories, topk, method="tiled")


def test_separate_gallery_against_the_brute_force():
    """Query/gallery: a category's values are the brute-force mean over its queries."""
    x, y, categories, _ = _case(5)
    gallery, gallery_labels = x[::2] + 0.5, y[::2]
    names = ["recall@1", "map", "ndcg"]
    got = evaluate(x, y, gallery, gallery_labels, metrics=names, similarity="dot", query_categories=categories)
    for name, result in got.by_category.items():
        rows = [i for i, c in enumerate(categories) if c == name]
        want, without = reference.evaluate(x[rows].numpy(), y[rows].numpy(), gallery.numpy(), gallery_labels.numpy(), names, "dot")
        assert result.metrics == pytest.approx(want, nan_ok=True)
        assert result.num_queries == len(rows) and result.num_queries_without_positive == without


def test_result_layouts():
    x, y, categories, _ = _case(1)
    got = evaluate(x, y, metrics=["recall@1"], similarity="dot", query_categories=categories)
    as_dict, record = got.to_dict(), got.to_record()
    assert set(as_dict["by_category"]) == {"bags", "hats", "shoes"}
    assert as_dict["by_category"]["bags"] == got.by_category["bags"].to_dict()
    assert set(record["by_category"]["hats"]) == {"recall@1", "num_queries", "num_queries_without_positive"}
    assert record["recall@1"] == got.metrics["recall@1"] and not math.isnan(record["by_category"]["hats"]["recall@1"])
    plain = evaluate(x, y, metrics=["recall@1"], similarity="dot")
    assert "by_category" not in plain.to_dict() and "by_category" not in plain.to_record()


def test_bad_categories():
    x, y = torch.randn(5, 3), torch.arange(5) % 2
    with pytest.raises(ValueError, match="query_categories has 4 entries for 5 queries"):
        evaluate(x, y, query_categories=["a"] * 4)
    with pytest.raises(TypeError, match="sequence of names"):
        evaluate(x, y, query_categories="abcde")
