"""Embedding datasets and scoring them (rankopt.engine.evaluation), against brute force."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from rankopt.config import EvalConfig
from rankopt.engine.evaluation import embed_dataset, evaluate_model


class Points(Dataset):
    """SYNTHETIC: 'images' are 4-d vectors; the model is a linear map."""

    def __init__(self, n: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=gen)
        self.labels = np.arange(n).reshape(-1, 1) % 5
        self.paths = [f"p{i}" for i in range(n)]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"image": self.x[i], "label": torch.tensor(self.labels[i]), "index": i, "path": self.paths[i]}


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
    from rankopt.engine.evaluation import EmbeddedSplit, score

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
