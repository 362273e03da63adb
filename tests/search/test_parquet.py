"""Parquet export/import of an index: one table and clip-retrieval's layout (read back with plain numpy + pyarrow)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rankopt.cli import main
from rankopt.postprocess import PostProcessing, Whitening
from rankopt.search import Index
from rankopt.search.parquet import export_clip_layout, export_parquet, import_index


@pytest.fixture
def index():
    gen = torch.Generator().manual_seed(0)
    labels = torch.stack([torch.arange(12) % 4, torch.arange(12) % 2], dim=1)
    labels[5] = -1
    metadata = {"city": ["Paris", "Rome", None] * 4, "year": list(range(2000, 2012)), "ok": [True, False] * 6,
                "score": [0.5 * i for i in range(12)]}
    built = Index.from_embeddings(torch.randn(12, 6, generator=gen), [f"photos/{i}.jpg" for i in range(12)], labels,
                                  fingerprint="abc", similarity="dot", preprocessing={"transform": "test", "image_size": 64},
                                  level_names=("kind", "group"), label_names=[["a", "b", "c", "d"], ["x", "y"]],
                                  metadata=metadata)
    built.remove(ids=["2"])
    built.set_threshold({"value": 0.25, "fmr": 1e-3})
    return built


def _same(a: Index, b: Index) -> None:
    assert torch.equal(a.embeddings, b.embeddings) and torch.equal(a.labels, b.labels)
    assert a.ids == b.ids and a.paths == b.paths and a.metadata == b.metadata and a.items.next_id == b.items.next_id
    assert (a.fingerprint, a.similarity, a.preprocessing, a.level_names, a.label_names, a.threshold) == \
        (b.fingerprint, b.similarity, b.preprocessing, b.level_names, b.label_names, b.threshold)
    queries = torch.randn(3, a.dim, generator=torch.Generator().manual_seed(5))
    assert a.search(queries, k=4).records() == b.search(queries, k=4).records()


def test_one_table_round_trip(index, tmp_path):
    out = export_parquet(index, tmp_path / "items.parquet")
    table = pq.read_table(out)
    assert table.column_names == ["id", "path", "label", "label_1", "city", "year", "ok", "score", "embedding"]
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 6)
    assert table.column("label").to_pylist()[:5] == ["a", "b", "d", "a", None]  # names; id 2 removed, row 5 unknown
    assert json.loads(table.schema.metadata[b"rankopt"])["fingerprint"] == "abc"
    _same(index, import_index(out))


def test_clip_layout_is_read_by_plain_numpy_and_pyarrow(index, tmp_path):
    folder = export_clip_layout(index, tmp_path / "clip", shard_rows=4)
    shards = sorted((folder / "img_emb").iterdir())
    assert [p.name for p in shards] == ["img_emb_0.npy", "img_emb_1.npy", "img_emb_2.npy"]
    vectors = np.concatenate([np.load(folder / "img_emb" / f"img_emb_{i}.npy") for i in range(3)])
    rows = pa.concat_tables([pq.read_table(folder / "metadata" / f"metadata_{i}.parquet") for i in range(3)])
    assert vectors.dtype == np.float32 and np.array_equal(vectors, index.embeddings.numpy())
    assert rows.column("image_path").to_pylist() == index.paths and rows.column("id").to_pylist() == index.ids
    assert rows.column("year").to_pylist() == index.metadata["year"]
    _same(index, import_index(folder))
    with pytest.raises(ValueError, match="exists and is not an empty folder"):
        export_clip_layout(index, folder)


def test_the_embedding_pipeline_travels(index, tmp_path):
    gen = torch.Generator().manual_seed(1)
    whitening = Whitening(torch.randn(6, generator=gen, dtype=torch.float64),
                          torch.randn(6, 6, generator=gen, dtype=torch.float64), "pca", 0.5, 0.0)
    index.post = PostProcessing(None, whitening)
    back = import_index(export_parquet(index, tmp_path / "w.parquet"))
    assert back.post.whitening.digest() == whitening.digest()


def test_foreign_clip_output_needs_the_fingerprint(tmp_path):
    folder = tmp_path / "theirs"
    (folder / "img_emb").mkdir(parents=True)
    (folder / "metadata").mkdir()
    np.save(folder / "img_emb" / "img_emb_0.npy", np.eye(3, 4, dtype=np.float16))
    pq.write_table(pa.table({"image_path": ["a.jpg", "b.jpg", "c.jpg"], "caption": ["x", "y", "z"]}),
                   folder / "metadata" / "metadata_0.parquet")
    with pytest.raises(ValueError, match="no rankopt description .* pass the fingerprint"):
        import_index(folder)
    index = import_index(folder, fingerprint="theirs")
    assert index.paths == ["a.jpg", "b.jpg", "c.jpg"] and index.metadata == {"caption": ["x", "y", "z"]}
    assert index.ids == ["0", "1", "2"] and index.embeddings.dtype == torch.float32


def test_cli_export_and_import(index, tmp_path, capsys):
    source = index.save(tmp_path / "idx")
    assert main(["index-export", str(source), "--parquet", str(tmp_path / "e.parquet")]) == 0
    assert main(["index-export", str(source), "--clip-layout", str(tmp_path / "clip")]) == 0
    assert main(["index-import", str(tmp_path / "clip"), "--out", str(tmp_path / "back"), "--faiss", "Flat"]) == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed and "11 items" in printed and f"saved {tmp_path / 'back'}" in printed
    back = Index.load(tmp_path / "back")
    assert back.backend == "faiss Flat" and back.ids == index.ids and back.metadata == index.metadata
