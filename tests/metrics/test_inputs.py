"""Bad input gives a clear error naming the problem; the CLI end to end on temporary .npy files."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rankopt.cli import main
from rankopt.metrics import evaluate, parse_metric


def test_bad_inputs():
    x, y = torch.randn(8, 3), torch.arange(8) % 2
    bad = x.clone()
    bad[3, 1] = float("nan")
    bad[5, 0] = float("inf")
    with pytest.raises(ValueError, match=r"query_embeddings has 2 row\(s\) with NaN or Inf values: rows 3, 5"):
        evaluate(bad, y)
    with pytest.raises(ValueError, match="ref_embeddings has 1 row"):
        evaluate(x, y, bad[:4], y[:4])
    with pytest.raises(ValueError, match="labels has 7 rows but the embeddings have 8"):
        evaluate(x, y[:7])
    with pytest.raises(ValueError, match="query_embeddings has 0 rows"):
        evaluate(x[:0], y[:0])
    with pytest.raises(ValueError, match="ref_embeddings has 0 rows"):
        evaluate(x, y, x[:0], y[:0])
    with pytest.raises(ValueError, match="1 row"):
        evaluate(x[:1], y[:1])
    with pytest.raises(TypeError, match="integer tensor"):
        evaluate(x, y.float())
    with pytest.raises(ValueError, match="dimensions"):
        evaluate(x, y, torch.randn(4, 5), y[:4])
    with pytest.raises(ValueError, match="levels"):
        evaluate(x, y, x, torch.stack([y, y], 1))
    with pytest.raises(ValueError, match="without ref_labels"):
        evaluate(x, y, x)
    with pytest.raises(ValueError, match="similarity"):
        evaluate(x, y, similarity="euclid")
    with pytest.raises(KeyError, match="unknown metric"):
        evaluate(x, y, metrics=["recal@1"])
    with pytest.raises(KeyError, match="unknown metric"):
        evaluate(x, y, metrics=["recall"])
    with pytest.raises(ValueError, match="columns"):
        evaluate(x, y, metrics=["ap@level1"])
    with pytest.raises(ValueError, match="top-k metrics only"):
        evaluate(x, y, metrics=["map"], backend="faiss")
    with pytest.raises(TypeError, match="unknown evaluate"):
        evaluate(x, y, alpah=2.0)
    assert parse_metric("Recall@10").k == 10 and parse_metric("map@100").family == "map@k"


def _save(tmp_path, name, array):
    path = tmp_path / name
    np.save(path, array)
    return str(path)


def test_cli_self_and_separate(tmp_path, capsys):
    rng = np.random.default_rng(0)
    e = rng.normal(size=(60, 8)).astype(np.float32)
    labels = np.stack([np.arange(60) % 12, np.arange(60) % 12 // 3], axis=1)
    out = tmp_path / "out.json"
    args = ["evaluate-embeddings", "--embeddings", _save(tmp_path, "e.npy", e), "--labels", _save(tmp_path, "l.npy", labels),
            "--metrics", "recall@1", "map@r", "map", "h-ap", "asi", "ndcg", "--json", str(out), "--no-progress"]
    assert main(args) == 0
    data = json.loads(out.read_text())
    want = evaluate(torch.from_numpy(e), torch.from_numpy(labels), metrics=["recall@1", "map@r", "map", "h-ap", "asi", "ndcg"])
    assert data["metrics"] == pytest.approx(want.metrics)
    assert data["num_queries"] == 60 and data["num_queries_without_positive"] == 0
    assert "h-ap" in capsys.readouterr().out

    q = rng.normal(size=(10, 8)).astype(np.float32)
    args = ["evaluate-embeddings", "--embeddings", _save(tmp_path, "e.npy", e), "--labels", _save(tmp_path, "l1.npy", labels[:, 0]),
            "--query-embeddings", _save(tmp_path, "q.npy", q), "--query-labels", _save(tmp_path, "ql.npy", np.arange(10) + 5),
            "--json", str(out), "--no-progress"]
    assert main(args) == 0
    data = json.loads(out.read_text())
    assert set(data["metrics"]) == {"recall@1", "recall@10", "map@r", "map"}
    assert data["num_queries"] == 10 and data["num_queries_without_positive"] == 3  # labels 12, 13, 14 are absent


def test_cli_errors(tmp_path, capsys):
    e = _save(tmp_path, "e.npy", np.zeros((0, 4), dtype=np.float32))
    lab = _save(tmp_path, "l.npy", np.zeros(0, dtype=np.int64))
    assert main(["evaluate-embeddings", "--embeddings", e, "--labels", lab]) == 1
    assert "0 rows" in capsys.readouterr().err
    e = _save(tmp_path, "e.npy", np.ones((4, 2), dtype=np.float32))
    assert main(["evaluate-embeddings", "--embeddings", e, "--labels", _save(tmp_path, "l.npy", np.ones(4))]) == 1
    assert "integer" in capsys.readouterr().err
    assert main(["evaluate-embeddings", "--embeddings", e, "--labels", _save(tmp_path, "l.npy", np.arange(3))]) == 1
    assert "rows" in capsys.readouterr().err


def test_faiss_gpu_k_limit_is_refused(monkeypatch):
    """On a GPU build of faiss, k > 2048 is refused with a clear message (faked faiss module)."""
    import sys
    import types

    import faiss

    fake = types.SimpleNamespace(IndexFlatIP=faiss.IndexFlatIP, IndexFlatL2=faiss.IndexFlatL2, index_cpu_to_all_gpus=lambda index: index)
    monkeypatch.setitem(sys.modules, "faiss", fake)
    from rankopt.metrics.topk import faiss_topk

    x = torch.randn(3000, 4)
    with pytest.raises(ValueError, match="k <= 2048"):
        faiss_topk(x, None, 2500, use_gpu=True)
    values, idx = faiss_topk(x, None, 100, use_gpu=True)
    assert values.shape == (3000, 100) and not bool((idx == torch.arange(3000)[:, None]).any())
