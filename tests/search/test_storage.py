"""Index folders: save/load round trips, atomic replacement, clear errors for damaged folders."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

from rankopt.search import Index, storage


@pytest.fixture
def built(checkpoint, tree):
    return Index.build(checkpoint, tree, progress=False, device="cpu")


def test_round_trip_gives_identical_results(built, tmp_path, queries):
    folder = built.save(tmp_path / "idx")
    assert sorted(os.listdir(folder)) == ["embeddings.safetensors", "index.json", "items.json"]
    info = json.loads((folder / "index.json").read_text())
    assert info["format"] == "rankopt-index" and info["format_version"] == 1 and info["count"] == 12
    assert info["fingerprint"] == built.fingerprint and info["preprocessing"] == built.preprocessing
    assert info["model"]["backbone"] == "convnet_tiny" and info["faiss"] is None and info["created_utc"]
    loaded = Index.load(folder)
    assert torch.equal(loaded.embeddings, built.embeddings) and torch.equal(loaded.labels, built.labels)
    assert loaded.paths == built.paths and loaded.label_names == built.label_names
    assert loaded.level_names == built.level_names and loaded.fingerprint == built.fingerprint
    before, after = built.search(queries, k=5), loaded.search(queries, k=5)  # loaded: the recorded checkpoint
    assert torch.equal(before.ids, after.ids) and torch.equal(before.scores, after.scores)
    assert torch.equal(before.query_labels, after.query_labels)


def test_faiss_round_trip(tmp_path):
    gallery = torch.randn(400, 8, generator=torch.Generator().manual_seed(0))
    index = Index.from_embeddings(gallery, fingerprint="f", faiss="HNSW8", faiss_params="efSearch=16", progress=False)
    folder = index.save(tmp_path / "idx")
    assert (folder / "faiss.index").is_file()
    loaded = Index.load(folder)
    assert loaded.info["faiss"] == index.info["faiss"] and loaded.backend == "faiss HNSW8"
    assert loaded.faiss_index.hnsw.efSearch == 16
    assert torch.equal(loaded.search(gallery[:30], k=5).ids, index.search(gallery[:30], k=5).ids)


def test_a_failed_save_leaves_the_previous_index_intact(built, tmp_path, monkeypatch):
    folder = built.save(tmp_path / "idx")
    listing = sorted(os.listdir(tmp_path))
    smaller = Index.from_embeddings(torch.randn(3, 16), fingerprint="other")

    def broken(path, text):
        raise OSError("disk full")

    monkeypatch.setattr(storage, "write_text_atomic", broken)
    with pytest.raises(OSError, match="disk full"):
        smaller.save(folder)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == listing  # no temporary folder left behind
    assert len(Index.load(folder)) == 12
    smaller.save(folder)  # a successful save replaces it
    assert len(Index.load(folder)) == 3 and sorted(os.listdir(tmp_path)) == listing


def test_a_folder_that_is_not_an_index_is_never_replaced(tmp_path, tree):
    index = Index.from_embeddings(torch.randn(3, 4), fingerprint="f")
    with pytest.raises(ValueError, match="non-empty folder without index.json, not a rankopt index: refusing"):
        index.save(tree)
    assert (tree / "alpha" / "one" / "img0.png").is_file()


def _saved(tmp_path):
    return Index.from_embeddings(torch.randn(5, 4), ["a", "b", "c", "d", "e"], torch.arange(5), fingerprint="f").save(
        tmp_path / "idx")


def _edit_json(path, **changes):
    value = json.loads(path.read_text())
    value.update(changes)
    path.write_text(json.dumps(value))


@pytest.mark.parametrize(
    ("damage", "error", "message"),
    [
        (lambda d: (d / "embeddings.safetensors").unlink(), FileNotFoundError, "embeddings.safetensors is missing"),
        (lambda d: (d / "items.json").unlink(), FileNotFoundError, "items.json is missing"),
        (lambda d: (d / "index.json").write_text("{not json"), ValueError, "index.json is not valid JSON"),
        (lambda d: _edit_json(d / "index.json", format_version=99), ValueError, "unknown format version 99"),
        (lambda d: _edit_json(d / "index.json", count=6), ValueError, "items.json lists 5 paths but index.json says count=6"),
        (lambda d: _edit_json(d / "items.json", paths=["a"]), ValueError, "items.json lists 1 paths"),
        (lambda d: _edit_json(d / "index.json", dim=3), ValueError, r"embeddings are torch.float32 \(5, 4\), expected float32 \(5, 3\)"),
        (lambda d: (d / "embeddings.safetensors").write_bytes(b"\x00" * 20), ValueError, "cannot read .*embeddings.safetensors"),
        (lambda d: save_file({"embeddings": torch.zeros(5, 4), "labels": torch.zeros(4, 1, dtype=torch.long)},
                             str(d / "embeddings.safetensors")), ValueError, r"labels are torch.int64 \(4, 1\)"),
        (lambda d: save_file({"embeddings": torch.zeros(5, 4)}, str(d / "embeddings.safetensors")), ValueError,
         "has no labels tensor"),
        (lambda d: _edit_json(d / "items.json", label_names=[["x"]]), ValueError, "1 label names at level 0 but"),
        (lambda d: _edit_json(d / "index.json", faiss={"spec": "Flat"}), FileNotFoundError, "faiss.index is missing"),
    ],
)
def test_damaged_folders_are_named(tmp_path, damage, error, message):
    folder = _saved(tmp_path)
    damage(folder)
    with pytest.raises(error, match=message):
        Index.load(folder)


def test_a_faiss_file_of_another_size_is_refused(tmp_path):
    a = Index.from_embeddings(torch.randn(50, 4), fingerprint="f", faiss="Flat", progress=False).save(tmp_path / "a")
    b = Index.from_embeddings(torch.randn(40, 4), fingerprint="f", faiss="Flat", progress=False).save(tmp_path / "b")
    (a / "faiss.index").write_bytes((b / "faiss.index").read_bytes())
    with pytest.raises(ValueError, match="faiss.index holds 40 vectors of dimension 4, but index.json says 50"):
        Index.load(a)
    (a / "faiss.index").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cannot read faiss index"):
        Index.load(a)
