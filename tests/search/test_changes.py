"""An index that lives: stable ids through add/remove/update, removed items never returned, metadata
columns returned and filtered on (exactly, any backend), metadata from CSV datasets and files."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from rankopt.data import build_dataset
from rankopt.search import Embedder, Index

from helpers.images import draw
from .test_index import brute_force

BACKENDS = [None, "Flat", "HNSW16"]


def _index(rows: int = 300, dim: int = 8, faiss: str | None = None, seed: int = 0) -> Index:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=gen)
    metadata = {"city": [("Paris", "Rome", "Oslo")[i % 3] for i in range(rows)], "year": [2000 + i % 5 for i in range(rows)],
                "ok": [bool(i % 2) for i in range(rows)]}
    return Index.from_embeddings(x, [f"img{i}.png" for i in range(rows)], torch.arange(rows) % 7, fingerprint="f",
                                 metadata=metadata, faiss=faiss, progress=False)


@pytest.mark.parametrize("faiss", BACKENDS)
def test_removed_items_are_never_returned_and_ids_stay(faiss):
    index = _index(faiss=faiss)
    vectors = dict(zip(index.ids, index.embeddings.clone()))
    gone = ["3", "17", "250"]
    assert index.remove(ids=gone[:2], paths=["img250.png"]) == gone
    assert len(index) == 297 and not set(gone) & set(index.ids)
    assert all(torch.equal(index.embeddings[r], vectors[i]) for r, i in enumerate(index.ids))  # ids follow their vectors
    queries = torch.stack([vectors[i] for i in gone])  # each removed vector would be its own top hit
    result = index.search(queries, k=10)
    returned = {i for row in result.ids for i in row}
    assert not returned & set(gone) and len(returned) > 10
    if faiss != "HNSW16":  # exact backends: the brute force over what is left
        _, order = brute_force(queries, index.embeddings, 10, "cosine")
        assert result.rows.tolist() == order.tolist()
        assert result.ids == [[index.ids[j] for j in row] for row in order.tolist()]
    # new items get new ids, never a removed one; existing ids unchanged
    before = list(index.ids)
    index.add(torch.randn(4, 8), [f"new{i}.png" for i in range(4)], fingerprint="f")
    assert index.ids[:297] == before and index.ids[297:] == ["300", "301", "302", "303"]
    if faiss is not None:
        assert index.faiss_index.ntotal == len(index)


def test_unknown_ids_and_paths_are_named_and_nothing_is_removed():
    index = _index(rows=10)
    with pytest.raises(ValueError, match=r"2 unknown item\(s\) \(not in the index\): 'x', 'nope.png'"):
        index.remove(ids=["1", "x"], paths=["nope.png"])
    assert len(index) == 10
    with pytest.raises(ValueError, match="'42'"):
        index.item("42")
    assert index.item("4") == {"id": "4", "path": "img4.png", "label": 4, "labels": {"class": 4},
                               "metadata": {"city": "Rome", "year": 2004, "ok": False}}


def test_given_ids_are_kept_and_checked():
    x = torch.randn(3, 4)
    index = Index.from_embeddings(x, ids=["a", "b", "7"], fingerprint="f")
    index.add(torch.randn(8, 4), fingerprint="f")
    assert index.ids == ["a", "b", "7", "0", "1", "2", "3", "4", "5", "6", "8"]  # the counter skips "7"
    with pytest.raises(ValueError, match="already in the index, e.g. 'a'"):
        index.add(torch.randn(1, 4), ids=["a"])
    with pytest.raises(ValueError, match="not unique: 'z'"):
        Index.from_embeddings(x, ids=["z", "y", "z"], fingerprint="f")


FILTERS = {  # a filter and the same condition written out: accept(metadata, finest labels, row)
    "equality": ({"city": "Paris"}, lambda m, y, i: m["city"][i] == "Paris"),
    "membership text": ("year in [2001, 2003]", lambda m, y, i: m["year"][i] in (2001, 2003)),
    "two conditions": (["city=Rome", "ok=true"], lambda m, y, i: m["city"][i] == "Rome" and m["ok"][i]),
    "label and text of a number": ({"year": ["2002"], "label": [1, 2]}, lambda m, y, i: m["year"][i] == 2002 and y[i] in (1, 2)),
    "nothing passes": ("city=Nowhere", lambda m, y, i: False),
}


@pytest.mark.parametrize("faiss", BACKENDS)
@pytest.mark.parametrize("case", FILTERS)
def test_a_filtered_search_is_the_brute_force_over_the_filtered_items(faiss, case):
    filter, accept = FILTERS[case]
    index = _index(faiss=faiss, seed=1)
    queries = torch.randn(6, 8, generator=torch.Generator().manual_seed(9))
    labels = index.labels[:, 0].tolist()
    keep = np.array([i for i in range(len(index)) if accept(index.metadata, labels, i)], dtype=np.int64)
    result = index.search(queries, k=25, filter=filter)
    assert result.k == min(25, keep.size)
    if keep.size:
        scores, order = brute_force(queries, index.embeddings[keep], result.k, "cosine")
        assert result.rows.tolist() == keep[order].tolist()
        np.testing.assert_allclose(result.scores.numpy(), scores, rtol=1e-5, atol=1e-5)
        first = result.records()[0]["results"][0]
        assert first["metadata"] == index.item(first["id"])["metadata"]
    if keep.size < 25:
        assert f"the filter keeps {keep.size} of 300 items" in result.note


def test_filters_are_checked():
    index = _index(rows=10)
    with pytest.raises(ValueError, match="unknown column 'town'; the index's columns: city, label, ok, year"):
        index.search(torch.randn(1, 8), filter="town=Paris")
    with pytest.raises(ValueError, match="write key=value"):
        index.search(torch.randn(1, 8), filter="Paris")
    result = index.search(torch.randn(1, 8), k=10, filter='city in ["Paris", Oslo]')
    assert {index.metadata["city"][r] for r in result.rows[0].tolist()} == {"Paris", "Oslo"}


def test_metadata_survives_save_load_and_changes(tmp_path):
    index = _index(rows=12)
    index.remove(ids=["0"])
    folder = index.save(tmp_path / "idx")
    loaded = Index.load(folder)
    assert loaded.ids == index.ids and loaded.metadata == index.metadata and loaded.items.next_id == 12
    with Index.editing(folder) as editing:
        editing.add(torch.randn(1, 8), ["x.png"], metadata={"city": ["Lima"], "rank": [1]}, fingerprint="f")
    again = Index.load(folder)
    assert again.ids[-1] == "12" and again.item("12")["metadata"] == {"city": "Lima", "year": None, "ok": None, "rank": 1}
    assert again.item("5")["metadata"]["rank"] is None and again.info["version"] == 2


def test_update_re_embeds_changed_files_and_removes_vanished_ones(checkpoint, tree, tmp_path):
    index = Index.build(checkpoint, tree, progress=False, device="cpu")
    folder = index.save(tmp_path / "idx")
    ids = {p.split("gallery/")[1]: i for p, i in zip(index.paths, index.ids)}
    before = dict(zip(index.ids, index.embeddings.clone()))
    changed, gone, touched = tree / "alpha/one/img0.png", tree / "beta/four/img2.png", tree / "alpha/two/img1.png"
    draw(changed, (250, 10, 10), 123)
    gone.unlink()
    os.utime(touched, ns=(1, 1))  # a new mtime, the same content: not re-embedded
    with Index.editing(folder) as editing:  # the model: the checkpoint recorded in the index
        report = editing.update()
    assert report == {"changed": [ids["alpha/one/img0.png"]], "removed": [ids["beta/four/img2.png"]], "checked": 12}
    loaded = Index.load(folder)
    assert len(loaded) == 11 and ids["beta/four/img2.png"] not in loaded.ids
    fresh = Embedder.from_checkpoint(checkpoint, device="cpu", progress=False).embed([changed]).embeddings[0]
    for row, item in enumerate(loaded.ids):
        expected = fresh if item == ids["alpha/one/img0.png"] else before[item]
        torch.testing.assert_close(loaded.embeddings[row], expected, rtol=1e-5, atol=1e-6)
    item = ids["alpha/one/img0.png"]
    assert loaded.labels[loaded.ids.index(item)].tolist() == index.labels[index.ids.index(item)].tolist()  # labels stay
    assert Index.load(folder).update() == {"changed": [], "removed": [], "checked": 11}  # stamps were refreshed


def test_a_csv_dataset_brings_ids_and_metadata_and_a_file_adds_columns(checkpoint, tree, tmp_path):
    table = tmp_path / "items.csv"
    rows = ["label,path,split,id,place,category"]
    files = sorted(tree.rglob("*.png"))
    rows += [f"{f.parent.name},{f},test,item-{i},{('north', 'south')[i % 2]},{f.parent.parent.name}"
             for i, f in enumerate(files)]
    table.write_text("\n".join(rows) + "\n")
    extra = tmp_path / "extra.csv"
    extra.write_text("path,score\n" + f"{files[0].relative_to(tmp_path)},0.5\nnot/indexed.png,1\n")
    dataset = build_dataset("csv", table, "test")
    index = Index.build(checkpoint, dataset, metadata=extra, progress=False, device="cpu")
    assert index.ids == [f"item-{i}" for i in range(len(files))]
    assert sorted(index.metadata) == ["category", "place", "score"]
    first = index.item("item-0")
    assert first["metadata"] == {"category": files[0].parent.parent.name, "place": "north", "score": "0.5"}
    assert index.item("item-1")["metadata"]["score"] is None
    result = index.search(torch.randn(2, 16), k=20, filter={"place": "south", "category": "beta"})
    assert all(r["metadata"]["place"] == "south" and r["metadata"]["category"] == "beta"
               for rec in result.records() for r in rec["results"])
    assert result.k == 3  # the odd rows of beta: 6 images, 3 of them "south"
