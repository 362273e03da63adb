"""Index folders: save/load round trips, atomic replacement, clear errors for damaged folders."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from safetensors.torch import save_file

from rankopt.search import Index, storage


@pytest.fixture
def built(checkpoint, tree):
    return Index.build(checkpoint, tree, progress=False, device="cpu")


def test_round_trip_gives_identical_results(built, tmp_path, queries):
    folder = built.save(tmp_path / "idx")
    assert sorted(os.listdir(folder)) == ["index.json", "v000001"]
    assert sorted(os.listdir(folder / "v000001")) == ["embeddings.safetensors", "items.json"]
    info = json.loads((folder / "index.json").read_text())
    assert info["format"] == "rankopt-index" and info["format_version"] == 2 and info["count"] == 12
    assert info["version"] == 1 and info["data"] == "v000001" and storage.version(folder) == 1
    assert info["fingerprint"] == built.fingerprint and info["preprocessing"] == built.preprocessing
    assert info["model"]["backbone"] == "convnet_tiny" and info["faiss"] is None and info["created_utc"]
    loaded = Index.load(folder)
    assert torch.equal(loaded.embeddings, built.embeddings) and torch.equal(loaded.labels, built.labels)
    assert loaded.paths == built.paths and loaded.label_names == built.label_names
    assert loaded.level_names == built.level_names and loaded.fingerprint == built.fingerprint
    before, after = built.search(queries, k=5), loaded.search(queries, k=5)  # loaded: the recorded checkpoint
    assert torch.equal(before.rows, after.rows) and torch.equal(before.scores, after.scores)
    assert torch.equal(before.query_labels, after.query_labels)


def test_faiss_round_trip(tmp_path):
    gallery = torch.randn(400, 8, generator=torch.Generator().manual_seed(0))
    index = Index.from_embeddings(gallery, fingerprint="f", faiss="HNSW8", faiss_params="efSearch=16", progress=False)
    folder = index.save(tmp_path / "idx")
    assert (_data(folder) / "faiss.index").is_file()
    loaded = Index.load(folder)
    assert loaded.info["faiss"] == index.info["faiss"] and loaded.backend == "faiss HNSW8"
    assert loaded.faiss_index.hnsw.efSearch == 16
    assert torch.equal(loaded.search(gallery[:30], k=5).rows, index.search(gallery[:30], k=5).rows)


def test_a_failed_save_leaves_the_previous_index_intact(built, tmp_path, monkeypatch):
    folder = built.save(tmp_path / "idx")
    listing = sorted(os.listdir(tmp_path))
    smaller = Index.from_embeddings(torch.randn(3, 16), fingerprint="other")

    inside = sorted(os.listdir(folder))

    def broken(path, value):  # the new version's data folder is written, index.json not yet swapped
        assert (folder / "v000002" / "embeddings.safetensors").is_file()
        raise OSError("disk full")

    monkeypatch.setattr(storage, "_write_json_durably", broken)
    with pytest.raises(OSError, match="disk full"):
        smaller.save(folder)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == listing  # no temporary folder left behind
    assert sorted(p for p in os.listdir(folder) if p != ".lock") == inside
    assert len(Index.load(folder)) == 12 and storage.version(folder) == 1
    smaller.save(folder)  # a successful save replaces it
    assert len(Index.load(folder)) == 3 and sorted(os.listdir(tmp_path)) == listing and storage.version(folder) == 2


def test_a_folder_that_is_not_an_index_is_never_replaced(tmp_path, tree):
    index = Index.from_embeddings(torch.randn(3, 4), fingerprint="f")
    with pytest.raises(ValueError, match="non-empty folder without index.json, not a rankopt index: refusing"):
        index.save(tree)
    assert (tree / "alpha" / "one" / "img0.png").is_file()


def _saved(tmp_path):
    return Index.from_embeddings(torch.randn(5, 4), ["a", "b", "c", "d", "e"], torch.arange(5), fingerprint="f").save(
        tmp_path / "idx")


def _data(folder):
    return folder / json.loads((folder / "index.json").read_text())["data"]


def _edit_json(path, **changes):
    value = json.loads(path.read_text())
    value.update(changes)
    path.write_text(json.dumps(value))


@pytest.mark.parametrize(
    ("damage", "error", "message"),
    [
        (lambda d: (_data(d) / "embeddings.safetensors").unlink(), FileNotFoundError, "embeddings.safetensors is missing"),
        (lambda d: (_data(d) / "items.json").unlink(), FileNotFoundError, "items.json is missing"),
        (lambda d: (d / "index.json").write_text("{not json"), ValueError, "index.json is not valid JSON"),
        (lambda d: _edit_json(d / "index.json", format_version=99), ValueError, "unknown format version 99"),
        (lambda d: _edit_json(d / "index.json", count=6), ValueError, "items.json lists 5 paths but index.json says count=6"),
        (lambda d: _edit_json(_data(d) / "items.json", paths=["a"]), ValueError, "items.json lists 1 paths"),
        (lambda d: _edit_json(d / "index.json", dim=3), ValueError, r"embeddings are torch.float32 \(5, 4\), expected float32 \(5, 3\)"),
        (lambda d: (_data(d) / "embeddings.safetensors").write_bytes(b"\x00" * 20), ValueError, "cannot read .*embeddings.safetensors"),
        (lambda d: save_file({"embeddings": torch.zeros(5, 4), "labels": torch.zeros(4, 1, dtype=torch.long)},
                             str(_data(d) / "embeddings.safetensors")), ValueError, r"labels are torch.int64 \(4, 1\)"),
        (lambda d: save_file({"embeddings": torch.zeros(5, 4)}, str(_data(d) / "embeddings.safetensors")), ValueError,
         "has no labels tensor"),
        (lambda d: _edit_json(_data(d) / "items.json", label_names=[["x"]]), ValueError, "1 label names at level 0 but"),
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
    (_data(a) / "faiss.index").write_bytes((_data(b) / "faiss.index").read_bytes())
    with pytest.raises(ValueError, match="faiss.index holds 40 vectors of dimension 4, but index.json says 50"):
        Index.load(a)
    (_data(a) / "faiss.index").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="cannot read faiss index"):
        Index.load(a)


def _run(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args])


def test_a_writer_killed_mid_change_loses_nothing(tmp_path):
    folder = Index.from_embeddings(torch.zeros(5, 4), fingerprint="f").save(tmp_path / "idx")
    ready = tmp_path / "ready"
    writer = _run("""
        import sys, time, torch
        from pathlib import Path
        from rankopt.search import Index, storage
        def stalled(path, value):  # the new data folder is on disk; index.json not yet replaced
            Path(sys.argv[2]).touch()
            time.sleep(60)
        storage._write_json_durably = stalled
        with Index.editing(sys.argv[1]) as index:
            index.add(torch.ones(3, 4))
        """, str(folder), str(ready))
    try:
        deadline = time.monotonic() + 600  # a loaded machine imports torch slowly
        while not ready.exists():
            assert writer.poll() is None and time.monotonic() < deadline, "the writer did not reach the swap"
            time.sleep(0.05)
        assert (folder / "v000002" / "embeddings.safetensors").is_file()
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
    finally:
        writer.kill()
    loaded = Index.load(folder)  # the last complete version, whole
    assert len(loaded) == 5 and bool((loaded.embeddings == 0).all()) and storage.version(folder) == 1
    with Index.editing(folder) as index:  # the lock died with the writer; its leftovers are cleaned
        index.add(torch.ones(2, 4))
    assert sorted(os.listdir(folder)) == [".lock", "index.json", "v000001", "v000002"]
    assert len(Index.load(folder)) == 7 and Index.load(folder).ids[-2:] == ["5", "6"]


def test_a_reader_sees_the_old_or_the_new_index_never_a_mix(tmp_path):
    folder = Index.from_embeddings(torch.zeros(5, 4), fingerprint="f").save(tmp_path / "idx")
    writer = _run("""
        import sys, torch
        from rankopt.search import Index
        for step in range(20):
            rows = 5 + 2 * (step % 2)
            Index.from_embeddings(torch.full((rows, 4), float(step % 2)), fingerprint="f").save(sys.argv[1])
        """, str(folder))
    seen = set()
    try:
        while writer.poll() is None:
            index = Index.load(folder)
            value = float(index.embeddings[0, 0])
            assert (len(index), value) in ((5, 0.0), (7, 1.0)) and bool((index.embeddings == value).all())
            seen.add(index.info["version"])
    finally:
        writer.kill()
    assert writer.returncode == 0 and len(seen) > 1 and storage.version(folder) == 21
    assert len([p for p in os.listdir(folder) if p.startswith("v")]) == 2  # the current and the previous version


def test_concurrent_changes_never_lose_each_other(tmp_path):
    folder = Index.from_embeddings(torch.zeros(1, 4), fingerprint="f").save(tmp_path / "idx")
    errors = []

    def add(value: float) -> None:
        try:
            for _ in range(5):
                with Index.editing(folder) as index:
                    index.add(torch.full((1, 4), value))
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=add, args=(v,)) for v in (1.0, 2.0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    final = Index.load(folder)
    assert not errors and len(final) == 11 and final.ids == [str(i) for i in range(11)]
    assert sorted(final.embeddings[:, 0].tolist()) == [0.0] + [1.0] * 5 + [2.0] * 5
