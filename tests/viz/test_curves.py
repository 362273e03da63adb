"""PR curves vs a float64 brute force from the definition and vs scikit-learn; training curves."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import precision_recall_curve

from rankopt.viz import plot_pr_curves, plot_training_curves, precision_recall
from rankopt.viz.curves import PANEL_INCHES, _history_series

from .viz_helpers import clusters, expected_pixels, png_size, synthetic_hier


def scores_f64(q, r, kind):
    q, r = q.double().numpy(), r.double().numpy()
    if kind == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        r = r / np.linalg.norm(r, axis=1, keepdims=True)
    return q @ r.T


def brute_pr(q, ql, r, rl, column, same_set, grid, kind="cosine"):
    """Per query, every distinct score t is an operating point: P(t) = #pos>=t / #>=t, R(t) = #pos>=t / |P|;
    p_interp(r) = max{P(t): R(t) >= r}; mean over queries with a positive. Positive = equal labels at columns >= column."""
    s = scores_f64(q, r, kind)
    qlm, rlm = ql.reshape(len(q), -1).numpy(), rl.reshape(len(r), -1).numpy()
    curves, without = [], 0
    for i in range(len(q)):
        items = [j for j in range(len(r)) if not (same_set and j == i)]
        pos = {j for j in items if (qlm[i, column:] == rlm[j, column:]).all()}
        if not pos:
            without += 1
            continue
        points = []
        for t in sorted({s[i, j] for j in items}):
            above = [j for j in items if s[i, j] >= t]
            hits = sum(j in pos for j in above)
            points.append((hits / len(pos), hits / len(above)))
        curves.append([max(p for rec, p in points if rec >= g) for g in grid])
    return np.mean(curves, axis=0), len(curves), without


@pytest.mark.parametrize("same_set", [True, False])
def test_pr_matches_brute_force_per_level(same_set):
    x, labels = synthetic_hier()
    args = (x, labels) if same_set else (x[:25], labels[:25], x[25:], labels[25:])
    curves = precision_recall(*args, num_points=21, level_names=("class", "super"))
    assert [c.name for c in curves] == ["class", "super"]
    q, ql = args[0], args[1]
    r, rl = (x, labels) if same_set else (args[2], args[3])
    for column, curve in enumerate(curves):
        ref, n, without = brute_pr(q, ql, r, rl, column, same_set, curve.recall)
        np.testing.assert_allclose(curve.precision, ref, atol=1e-6)
        assert (curve.num_queries, curve.num_queries_without_positive) == (n, without)
    assert curves[1].interpolated_ap < curves[0].interpolated_ap + 1  # both finite numbers
    assert np.all(np.diff(curves[0].precision) <= 1e-12)  # interpolated precision never increases


def test_pr_exact_ties_are_pessimistic():
    """Integer embeddings with dot similarity give exact ties: tied items enter together."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randint(0, 3, (30, 3), generator=gen).float()
    labels = torch.randint(0, 4, (30,), generator=gen)
    curve = precision_recall(x, labels, similarity="dot", num_points=11)[0]
    ref, n, without = brute_pr(x, labels, x, labels, 0, True, curve.recall, kind="dot")
    np.testing.assert_allclose(curve.precision, ref, atol=1e-12)
    assert curve.num_queries == n and curve.num_queries_without_positive == without


def test_pr_matches_sklearn_on_tie_free_data():
    x, labels = clusters(5, 8, noise=1.5, seed=7)
    curve = precision_recall(x, labels, num_points=101)[0]
    s = scores_f64(x, x, "cosine")
    per_query = []
    for i in range(len(x)):
        keep = np.arange(len(x)) != i
        prec, rec, _ = precision_recall_curve((labels[keep] == labels[i]).numpy(), s[i, keep])
        prec, rec = prec[:-1], rec[:-1]  # drop sklearn's artificial (recall 0, precision 1) end point
        per_query.append([prec[rec >= g].max() for g in curve.recall])
    np.testing.assert_allclose(curve.precision, np.mean(per_query, axis=0), atol=1e-6)


def test_pr_query_subsample_and_no_positive_queries():
    x, labels = clusters(6, 5, seed=8)
    labels = labels.clone()
    labels[:3] = torch.tensor([100, 101, 102])  # three singleton classes: no positive
    full = precision_recall(x, labels)[0]
    assert full.num_queries_without_positive == 3 and full.num_queries == 27
    sub = precision_recall(x, labels, max_queries=10, seed=1)[0]
    assert sub.num_queries + sub.num_queries_without_positive == 10
    single = precision_recall(x[:4], torch.tensor([100, 101, 102, 103]))[0]
    assert single.num_queries == 0 and np.isnan(single.precision).all()


def test_pr_chunking_does_not_change_the_result(monkeypatch):
    x, labels = synthetic_hier()
    whole = precision_recall(x, labels)
    monkeypatch.setattr("rankopt.viz._common._CHUNK_ELEMENTS", 100)  # 1 query per chunk
    chunked = precision_recall(x, labels)
    for a, b in zip(whole, chunked, strict=True):
        np.testing.assert_allclose(a.precision, b.precision, atol=1e-12)


def test_plot_pr_curves_png(tmp_path):
    x, labels = synthetic_hier()
    path = plot_pr_curves(precision_recall(x, labels), tmp_path / "pr.png", title_note="synthetic")
    assert png_size(path) == expected_pixels(*PANEL_INCHES)
    with pytest.raises(ValueError, match="curves is empty"):
        plot_pr_curves([], tmp_path / "empty.png")


def test_training_curves_png_and_errors(tmp_path):
    # the trainer's records: bookkeeping keys (step, num_*) are not plotted, lr_* get their own panel
    history = [
        {"epoch": e, "step": 10 * e, "loss": 1.0 / (e + 1) if e else float("nan"), "lr_backbone": 1e-4, "recall@1": 0.5 + 0.04 * e,
         "map@r": 0.3, "num_queries": 500, "num_queries_without_positive": 0, "note": "x"}
        for e in range(5)
    ]
    assert set(_history_series(history)[2]) == {"loss", "lr_backbone", "recall@1", "map@r"}
    path = plot_training_curves(history, tmp_path / "train.png")
    assert png_size(path) == expected_pixels(3 * PANEL_INCHES[0], PANEL_INCHES[1])
    path = plot_training_curves([{k: h[k] for k in ("epoch", "loss", "recall@1")} for h in history], tmp_path / "train2.png")
    assert png_size(path) == expected_pixels(2 * PANEL_INCHES[0], PANEL_INCHES[1])
    metrics_only = [{"recall@1": 0.1}, {"recall@1": 0.2, "map@r": 0.1}]  # no epoch, missing keys
    path = plot_training_curves(metrics_only, tmp_path / "train1.png")
    assert png_size(path) == expected_pixels(*PANEL_INCHES)
    with pytest.raises(ValueError, match="non-empty list"):
        plot_training_curves([], tmp_path / "e.png")
    with pytest.raises(TypeError, match="entries \\[1\\]"):
        plot_training_curves([{"loss": 1.0}, 3], tmp_path / "e.png")
    with pytest.raises(ValueError, match="no numeric metric"):
        plot_training_curves([{"epoch": 1, "step": 3, "note": "x"}], tmp_path / "e.png")
