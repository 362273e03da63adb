"""Embedding datasets and scoring them (rankopt.engine.embed_and_score), against brute force."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankopt.config import EvalConfig
from helpers.vectors import Points
from rankopt.engine.embed_and_score import embed_dataset, evaluate_model


class Linear(torch.nn.Linear):
    embedding_dim = 3


def _recall_at_1(q, ql, r, rl, self_retrieval):
    """Brute force: fraction of queries whose nearest (cosine) reference shares the label."""
    q = torch.nn.functional.normalize(q, dim=1).double()
    r = torch.nn.functional.normalize(r, dim=1).double()
    hits = 0
    for i in range(len(q)):
        best, best_j = -2.0, None
        for j in range(len(r)):
            if self_retrieval and i == j:
                continue
            s = float(q[i] @ r[j])
            if s > best:
                best, best_j = s, j
        hits += int(ql[i] == rl[best_j])
    return hits / len(q)


def test_embed_dataset_matches_model_and_restores_mode():
    torch.manual_seed(0)
    model = Linear(4, 3).train()
    ds = Points(23, 0)
    split = embed_dataset(model, ds, batch_size=5, show_progress=False)
    assert model.training
    assert torch.allclose(split.embeddings, model(ds.x).detach(), atol=1e-6)
    assert split.labels.shape == (23, 1) and split.paths == ds.paths


@pytest.mark.parametrize("two_splits", [False, True])
def test_evaluate_model_self_and_query_gallery(two_splits):
    torch.manual_seed(0)
    model = Linear(4, 3)
    query, gallery = Points(20, 1), Points(30, 2)
    datasets = {"query": query, "gallery": gallery} if two_splits else {"test": query}
    result, splits = evaluate_model(model, datasets, EvalConfig(metrics=["recall@1"], batch_size=7), show_progress=False)
    with torch.no_grad():
        q = model(query.x)
        r = model(gallery.x) if two_splits else q
    rl = gallery.labels[:, 0] if two_splits else query.labels[:, 0]
    expected = _recall_at_1(q, query.labels[:, 0], r, rl, self_retrieval=not two_splits)
    assert result.metrics["recall@1"] == pytest.approx(expected)
    assert len(splits) == (2 if two_splits else 1)


def test_landmark_ground_truth_uses_the_revisitop_protocol():
    from rankopt.engine.embed_and_score import EmbeddedSplit, score

    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    g = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [-1.0, 0.0]])
    # query 0: easy = gallery 0, hard = gallery 2 (ranked 2nd); query 1: easy = gallery 1, junk = gallery 3
    truth = [{"easy": [0], "hard": [2], "junk": []}, {"easy": [1], "hard": [], "junk": [3]}]
    query = EmbeddedSplit(q, torch.zeros(2, 1, dtype=torch.long), ["q0", "q1"], {"ground_truth": truth})
    gallery = EmbeddedSplit(g, torch.zeros(4, 1, dtype=torch.long), [f"g{i}" for i in range(4)])
    result = score([query, gallery], EvalConfig())
    assert result.num_queries == 2
    assert result.metrics["medium/map"] == pytest.approx(1.0)  # every positive ranked before every negative
    assert result.metrics["easy/map"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------- OML's sequence and category
def _split(x, labels, paths, **metadata):
    from rankopt.engine.embed_and_score import EmbeddedSplit

    return EmbeddedSplit(torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(labels).reshape(-1, 1), paths,
                         {k: np.asarray(v, dtype=str) for k, v in metadata.items()})


def test_score_excludes_sequences_and_reports_categories():
    """``metadata["sequence"]`` -> exclusion groups numbered jointly over query and gallery (``""``: none);
    ``metadata["category"]`` on the queries -> ``by_category``; as ``evaluate`` with those arguments."""
    from rankopt.engine.embed_and_score import score
    from rankopt.metrics import evaluate

    gen = torch.Generator().manual_seed(0)
    q, g = torch.randn(6, 4, generator=gen), torch.randn(9, 4, generator=gen)
    ql, gl = [0, 0, 1, 1, 2, 2], [0, 0, 0, 1, 1, 2, 2, 2, 1]
    qs, gs = ["a", "", "b", "b", "", "c"], ["a", "a", "", "b", "x", "c", "c", "c", ""]
    cats = ["shoes", "shoes", "bags", "", "bags", "hats"]
    cfg = EvalConfig(metrics=["recall@1", "map", "map@r"])
    got = score([_split(q, ql, [f"q{i}" for i in range(6)], sequence=qs, category=cats),
                 _split(g, gl, [f"g{i}" for i in range(9)], sequence=gs)], cfg)
    codes = {"a": 0, "b": 1, "c": 2, "x": 3}
    to_groups = lambda names: torch.tensor([codes.get(n, -1) for n in names])  # noqa: E731
    want = evaluate(q, torch.tensor(ql), g, torch.tensor(gl), metrics=cfg.metrics, query_groups=to_groups(qs),
                    ref_groups=to_groups(gs), query_categories=[c or None for c in cats])
    assert got.metrics == pytest.approx(want.metrics)
    assert list(got.by_category) == ["bags", "hats", "shoes"] and got.by_category["bags"].num_queries == 2
    for name, sub in want.by_category.items():
        assert got.by_category[name].metrics == pytest.approx(sub.metrics, nan_ok=True)
    plain = evaluate(q, torch.tensor(ql), g, torch.tensor(gl), metrics=cfg.metrics)
    assert (got.num_queries_without_positive, plain.num_queries_without_positive) == (1, 0)  # query 5's positives: its sequence


def test_score_self_retrieval_with_sequences():
    from rankopt.engine.embed_and_score import score
    from rankopt.metrics import evaluate

    x = torch.randn(12, 4, generator=torch.Generator().manual_seed(1))
    labels, seq = [i % 4 for i in range(12)], ["s0", "s1", "", "", "s0", "s1", "", "", "s0", "", "", ""]
    cfg = EvalConfig(metrics=["recall@1", "map"])
    got = score([_split(x, labels, [f"p{i}" for i in range(12)], sequence=seq)], cfg)
    groups = torch.tensor([{"s0": 0, "s1": 1}.get(s, -1) for s in seq])
    assert got.metrics == pytest.approx(evaluate(x, torch.tensor(labels), metrics=cfg.metrics, query_groups=groups).metrics)
    assert got.num_queries_without_positive == 3 and not got.by_category  # class 0: items 0, 4, 8 share s0


def test_media_averaging_refuses_per_item_sequences():
    from rankopt.engine.embed_and_score import score

    split = _split(torch.randn(4, 3), [0, 0, 1, 1], list("abcd"), sequence=["s", "s", "", ""])
    split.metadata["media"] = np.array([0, 0, 1, 1])
    with pytest.raises(ValueError, match="media averaging"):
        score([split], EvalConfig())
