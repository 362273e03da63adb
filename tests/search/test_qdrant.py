"""The Qdrant backend: a local-mode collection answers as rankopt's exact search (float64 brute-force oracle),
filters, changes kept in step, and the CLI round trip (index, search, index-remove, serve)."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from rankopt.cli import main
from rankopt.search import Index, qdrant

pytest.importorskip("qdrant_client")

K = 10
COLOURS = ("red", "green", "blue")


def oracle(x: np.ndarray, q: np.ndarray, similarity: str, keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Top-K ``(scores, rows)`` from the definitions in float64: cosine <q/|q|, r/|r|>, dot <q, r>, -||q - r||_2."""
    x, q = x.astype(np.float64), q.astype(np.float64)
    if similarity == "cosine":
        s = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (x / np.linalg.norm(x, axis=1, keepdims=True)).T
    elif similarity == "dot":
        s = q @ x.T
    else:
        s = -np.sqrt(((q[:, None, :] - x[None, :, :]) ** 2).sum(-1))
    rows = np.arange(len(x)) if keep is None else keep
    s = s[:, rows]
    order = np.argsort(-s, axis=1, kind="stable")[:, :K]
    return np.take_along_axis(s, order, 1), rows[order]


def vectors(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray, dict[str, list]]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 16)).astype(np.float32)
    metadata = {"colour": [COLOURS[i % 3] for i in range(n)], "year": [2020 + i % 2 for i in range(n)]}
    return x, np.arange(n) % 5, metadata


def saved(tmp_path, similarity: str, **attach) -> tuple[Index, np.ndarray]:
    x, labels, metadata = vectors()
    index = Index.from_embeddings(x, labels=labels, fingerprint="f" * 16, similarity=similarity, metadata=metadata,
                                  ids=[f"item-{i}" for i in range(len(x))], progress=False)
    qdrant.attach(index, **attach)
    index.save(tmp_path / "idx")
    return Index.load(tmp_path / "idx"), x


@pytest.fixture
def no_fallback(monkeypatch):
    """Fail if a query is answered by the local exact fallback instead of the collection."""
    answer = qdrant.search

    def refuse_fallback(*args, **kwargs):
        hits = answer(*args, **kwargs)
        assert hits is not None, "answered by the local exact search, not by Qdrant"
        return hits

    monkeypatch.setattr(qdrant, "search", refuse_fallback)


def points(index: Index) -> int:
    location = qdrant.Location.of(index.info["qdrant"], index.folder)
    with location.client() as client:
        return client.count(location.collection, exact=True).count


@pytest.mark.parametrize("similarity", ["cosine", "dot", "neg_l2"])
def test_collection_top_k_equals_the_exact_search(tmp_path, similarity, no_fallback):
    index, x = saved(tmp_path, similarity)
    assert index.backend == "qdrant rankopt (local qdrant)" and points(index) == len(x)
    q = np.random.default_rng(1).standard_normal((20, 16)).astype(np.float32)
    result = index.search(q, K)
    scores, rows = oracle(x, q, similarity)
    assert (result.rows.numpy() == rows).all()  # recall@10 = 1.0, in the same order
    np.testing.assert_allclose(result.scores.numpy(), scores, atol=1e-5)
    assert result.ids == [[f"item-{r}" for r in row] for row in rows.tolist()]
    exact = Index.from_embeddings(x, fingerprint="f" * 16, similarity=similarity, progress=False).search(q, K)
    assert torch.equal(exact.rows, result.rows)


def test_a_filter_is_a_payload_filter_with_rankopt_s_meaning(tmp_path, no_fallback):
    index, x = saved(tmp_path, "cosine")
    q = np.random.default_rng(2).standard_normal((5, 16)).astype(np.float32)
    conditions = {"colour": ["red", "blue"], "year": 2021.0, "label": "3"}  # as texts: 2021.0 = 2021, label 3
    result = index.search(q, K, filter=conditions)
    keep = np.array([i for i in range(len(x)) if COLOURS[i % 3] in ("red", "blue") and i % 2 == 1 and i % 5 == 3])
    scores, rows = oracle(x, q, "cosine", keep)
    assert (result.rows.numpy() == rows).all()
    np.testing.assert_allclose(result.scores.numpy(), scores, atol=1e-5)
    few = index.search(q, K, filter=["colour=red", "year in [2020, 1999]", "label=0"])  # i = 0 mod 30: 10 items
    assert few.rows.shape == (5, K) and set(few.rows.flatten().tolist()) <= set(range(0, 300, 30))
    with pytest.raises(ValueError, match="unknown column 'shape'"):
        index.search(q, K, filter="shape=round")


def test_add_remove_and_unchanged_saves_keep_the_collection_in_step(tmp_path, no_fallback):
    index, x = saved(tmp_path, "dot")
    q = x[:4] * 3  # each query's best item is itself
    with Index.editing(tmp_path / "idx") as editing:
        removed = editing.remove(ids=["item-0", "item-2"])
    assert removed == ["item-0", "item-2"]
    index = Index.load(tmp_path / "idx")
    assert points(index) == len(x) - 2
    result = index.search(q, K)
    assert not {"item-0", "item-2"} & {i for row in result.ids for i in row}
    keep = np.setdiff1d(np.arange(len(x)), [0, 2])
    scores, rows = oracle(x, q, "dot", keep)
    assert [[index.ids[r] for r in row] for row in result.rows.tolist()] == [[f"item-{r}" for r in row] for row in rows.tolist()]
    with Index.editing(tmp_path / "idx") as editing:
        editing.add(x[:1] * 10, ids=["again"], metadata={"colour": ["red"], "year": [1999]})
    index = Index.load(tmp_path / "idx")
    assert points(index) == len(x) - 1 and index.search(q[:1], 1).ids == [["again"]]
    assert index.search(q[:1], 1, filter="year=1999").ids == [["again"]]
    assert qdrant.sync(index, tmp_path / "idx") == {"upserted": 0, "deleted": 0}  # nothing changed


def test_a_snapshot_older_than_the_collection_is_answered_exactly(tmp_path):
    old, x = saved(tmp_path, "cosine")
    with Index.editing(tmp_path / "idx") as editing:  # the collection moves on: a new best item, one removed
        editing.add(x[:1] * 2, ids=["newer"])
        editing.remove(ids=["item-5"])
    q = np.concatenate([x[:1], x[5:6]])
    result = old.search(q, K)
    scores, rows = oracle(x, q, "cosine")
    assert (result.rows.numpy() == rows).all()
    np.testing.assert_allclose(result.scores.numpy(), scores, atol=1e-5)


def test_attach_refuses_faiss_and_names_the_missing_package(tmp_path, monkeypatch):
    pytest.importorskip("faiss")
    x, _, _ = vectors(100)
    with pytest.raises(ValueError, match="faiss or Qdrant"):
        qdrant.attach(Index.from_embeddings(x, fingerprint="f", faiss="Flat", progress=False))
    monkeypatch.setitem(sys.modules, "qdrant_client", None)
    with pytest.raises(ImportError, match=r"pip install 'rankopt\[qdrant\]'"):
        qdrant.import_qdrant()


def test_cli_index_search_remove_and_serve_through_qdrant(tmp_path, checkpoint, tree, queries, capsys, no_fallback):
    common = ["--images", str(tree), "--device", "cpu", "--no-progress"]
    assert main(["index", str(checkpoint), *common, "--out", str(tmp_path / "exact")]) == 0
    assert main(["index", str(checkpoint), *common, "--out", str(tmp_path / "q"), "--backend", "qdrant",
                 "--qdrant-collection", "photos"]) == 0
    info = json.loads((tmp_path / "q" / "index.json").read_text())
    assert info["qdrant"] == {"url": None, "path": "qdrant", "collection": "photos"}
    assert (tmp_path / "q" / "qdrant").is_dir()
    records = {}
    for name in ("exact", "q"):
        assert main(["search", str(tmp_path / name), str(queries), "--top-k", "5", "--json", str(tmp_path / f"{name}.json"),
                     "--device", "cpu", "--no-progress"]) == 0
        records[name] = json.loads((tmp_path / f"{name}.json").read_text())
    assert "qdrant photos (local qdrant)" in capsys.readouterr().out
    for mine, exact in zip(records["q"], records["exact"]):
        assert [r["id"] for r in mine["results"]] == [r["id"] for r in exact["results"]]
        np.testing.assert_allclose([r["score"] for r in mine["results"]], [r["score"] for r in exact["results"]],
                                   atol=1e-5)
    first = records["q"][0]["results"][0]["id"]
    assert main(["index-remove", str(tmp_path / "q"), "--id", first]) == 0
    index = Index.load(tmp_path / "q")
    assert points(index) == len(index) == 11

    from fastapi.testclient import TestClient

    from rankopt.serve import IndexHolder, Settings, create_app

    vector = index.embeddings[0].tolist()
    app = create_app(IndexHolder(tmp_path / "q", device="cpu"), Settings(reload_every_s=0))
    with TestClient(app, base_url="http://localhost") as client:  # a Host the service answers
        response = client.post("/search", json={"vector": vector, "k": 3})
    assert response.status_code == 200, response.text
    assert [r["id"] for r in response.json()["results"]] == index.search(index.embeddings[:1], 3).ids[0]
    assert main(["index", str(checkpoint), *common, "--out", str(tmp_path / "x"), "--backend", "qdrant",
                 "--faiss", "Flat"]) == 1
    assert "--faiss and --backend qdrant" in capsys.readouterr().err
