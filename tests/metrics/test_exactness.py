"""rankopt.metrics.evaluate against independent references on many random cases.

Oracles: the brute-force float64 loops of ``reference.py`` (ties included: integer-valued
embeddings with the dot product give many exact ties), scikit-learn
(``average_precision_score``, ``ndcg_score``; tie-free data, where definitions coincide)
and pytorch-metric-learning's AccuracyCalculator (R@1 and mAP@R). All data are synthetic.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import rankopt.metrics.evaluation as ev
from rankopt.metrics import evaluate

from . import reference

BINARY = ["recall@1", "recall@3", "precision@1", "precision@4", "true_recall@2", "true_recall@5",
          "map@r", "map@3", "map", "mrr"]  # fmt: skip
HIER = ["h-ap", "sum_wap", "ndcg", "asi", "ap@level0", "ap@level1"]


def _case(seed: int, n: int, num_classes: int, ties: bool, dim: int = 4, levels: int = 1):
    rng = np.random.default_rng(seed)
    x = rng.integers(-1, 2, size=(n, dim)).astype(np.float64) if ties else rng.normal(size=(n, dim))
    fine = rng.integers(0, num_classes, size=n)
    if levels == 1:
        return x, fine
    cols = [fine] + [fine // (2 * (c + 1)) for c in range(levels - 1)]  # consistent hierarchy
    return x, np.stack(cols, axis=1)


def _assert_close(got: dict[str, float], want: dict[str, float]) -> None:
    for name, value in want.items():
        if math.isnan(value):
            assert math.isnan(got[name]), name
        else:
            assert got[name] == pytest.approx(value, abs=1e-9), name


def _check(x, y, xr, yr, names, similarity, **kwargs):
    t = lambda a: None if a is None else torch.as_tensor(a)  # noqa: E731
    got = evaluate(t(x), t(y), t(xr), t(yr), metrics=names, similarity=similarity, **kwargs)
    want, without = reference.evaluate(x, y, xr, yr, names, similarity)
    _assert_close(got.metrics, want)
    assert got.num_queries_without_positive == without
    assert got.num_queries == len(x)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("ties", [True, False])
def test_binary_self_retrieval(seed, ties):
    x, y = _case(seed, n=40, num_classes=9, ties=ties)
    _check(x, y, None, None, BINARY, "dot" if ties else "cosine", chunk_size=1 + seed % 7)


@pytest.mark.parametrize("seed", range(8))
def test_topk_only_self_retrieval(seed):
    """Top-k metrics alone in self-retrieval take the symmetric tiled search (tile = chunk_size)."""
    ties = seed % 2 == 0
    x, y = _case(seed, n=45, num_classes=9, ties=ties)
    names = [n for n in BINARY if n not in ("map", "mrr")]
    _check(x, y, None, None, names, "dot" if ties else "cosine", chunk_size=1 + 3 * seed)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("similarity", ["dot", "neg_l2", "cosine"])
def test_binary_separate_gallery(seed, similarity):
    ties = similarity != "cosine"  # normalising integer vectors does not keep ties exact
    x, y = _case(seed, n=25, num_classes=6, ties=ties)
    xr, yr = _case(seed + 100, n=35, num_classes=7, ties=ties)
    _check(x, y, xr, yr, BINARY, similarity, chunk_size=4)


@pytest.mark.parametrize("seed", range(6))
def test_sort_path_equals_counting_path(seed, monkeypatch):
    """With many positives the binary metrics take their ranks from each chunk row sorted without
    indices (a binary search per positive): the brute-force values, self-retrieval or not."""
    x, y = _case(seed, n=40, num_classes=3, ties=seed % 2 == 0)
    monkeypatch.setattr(ev, "MAX_COUNTED_POSITIVES", 0)
    _check(x, y, None, None, BINARY, "dot", chunk_size=1 + seed % 5)
    xr, yr = _case(seed + 7, n=30, num_classes=4, ties=seed % 2 == 0)
    _check(x, y, xr, yr, BINARY, "dot", chunk_size=1 + seed % 5)


@pytest.mark.parametrize("seed", range(4))
def test_binary_and_hierarchical_metrics_share_the_sorted_rows(seed, monkeypatch):
    """Binary metrics by sorted rows next to hierarchical ones (one sort of each row serves both)."""
    x, y = _case(seed, n=36, num_classes=6, ties=True, levels=2)
    monkeypatch.setattr(ev, "MAX_COUNTED_POSITIVES", 0)
    _check(x, y, None, None, BINARY + HIER, "dot", chunk_size=7)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("levels", [2, 3])
def test_hierarchical(seed, levels):
    ties = seed % 2 == 0
    x, y = _case(seed, n=36, num_classes=12, ties=ties, levels=levels)
    names = HIER + (["ap@level2"] if levels == 3 else []) + ["map", "recall@2", "map@r"]
    _check(x, y, None, None, names, "dot", chunk_size=5)
    xr, yr = _case(seed + 50, n=30, num_classes=12, ties=ties, levels=levels)
    _check(x, y, xr, yr, names, "dot", chunk_size=8)


@pytest.mark.parametrize("alpha", [0.5, 2.0])
def test_hap_alpha(alpha):
    x, y = _case(3, n=30, num_classes=10, ties=True, levels=3)
    got = evaluate(torch.as_tensor(x), torch.as_tensor(y), metrics=["h-ap"], similarity="dot", alpha=alpha)
    want, _ = reference.evaluate(x, y, None, None, ["h-ap"], "dot", alpha=alpha)
    assert got.metrics["h-ap"] == pytest.approx(want["h-ap"], abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_faiss_backend_topk(seed):
    x, y = _case(seed, n=50, num_classes=8, ties=True)
    names = [n for n in BINARY if n not in ("map", "mrr")]
    _check(x, y, None, None, names, "dot", backend="faiss")
    xr, yr = _case(seed + 9, n=40, num_classes=8, ties=True)
    _check(x, y, xr, yr, names, "neg_l2", backend="faiss")


@pytest.mark.parametrize("seed", range(5))
def test_sklearn_average_precision(seed):
    from sklearn.metrics import average_precision_score

    x, y = _case(seed, n=30, num_classes=5, ties=False, dim=8)
    xr, yr = _case(seed + 1, n=200, num_classes=5, ties=False, dim=8)
    s = reference.scores(x, xr, "cosine")
    want = np.mean([average_precision_score(yr == y[i], s[i]) for i in range(len(x))])
    got = evaluate(torch.as_tensor(x), torch.as_tensor(y), torch.as_tensor(xr), torch.as_tensor(yr), metrics=["map"])
    assert got.metrics["map"] == pytest.approx(want, abs=1e-10)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("gains", ["exp", "linear", (0.0, 0.5, 4.0, 5.0)])
def test_sklearn_ndcg(seed, gains):
    from sklearn.metrics import ndcg_score

    x, y = _case(seed, n=20, num_classes=10, ties=False, dim=8, levels=3)
    xr, yr = _case(seed + 1, n=80, num_classes=10, ties=False, dim=8, levels=3)
    s = reference.scores(x, xr, "cosine")
    levels = np.stack([(y[i][None, :] == yr).sum(1) for i in range(len(x))])
    table = {"exp": 2.0 ** np.arange(4) - 1, "linear": np.arange(4.0)}.get(gains, np.asarray(gains))  # type: ignore[arg-type]
    true = table[levels]
    keep = true.sum(1) > 0
    want = np.mean([ndcg_score(true[i : i + 1], s[i : i + 1]) for i in np.flatnonzero(keep)])
    got = evaluate(torch.as_tensor(x), torch.as_tensor(y), torch.as_tensor(xr), torch.as_tensor(yr), metrics=["ndcg"], gains=gains)
    assert got.metrics["ndcg"] == pytest.approx(want, abs=1e-10)


@pytest.mark.parametrize("seed", range(3))
def test_pml_accuracy_calculator(seed):
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(60), rng.integers(2, 7, size=60))
    x = torch.nn.functional.normalize(torch.as_tensor(rng.normal(size=(len(y), 16)), dtype=torch.float32), dim=1)
    labels = torch.as_tensor(y)
    calc = AccuracyCalculator(include=("precision_at_1", "mean_average_precision_at_r"), k="max_bin_count")
    want = calc.get_accuracy(x, labels, x, labels, ref_includes_query=True)
    got = evaluate(x, labels, metrics=["recall@1", "map@r"]).metrics
    assert got["recall@1"] == pytest.approx(want["precision_at_1"], abs=1e-6)
    assert got["map@r"] == pytest.approx(want["mean_average_precision_at_r"], abs=1e-6)
