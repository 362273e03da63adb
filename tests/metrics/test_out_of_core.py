"""Memory-bounded embedding and evaluation: embeddings written straight into a ``.npy`` memory map,
evaluated from a memory-mapped file, query chunks prepared one at a time; results equal the in-memory path."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.test_evaluation import Points  # the synthetic dataset of the embedding tests

from rankopt.cli import main
from rankopt.engine.evaluation import embed_dataset
from rankopt.files import open_npy_atomic, read_npy
from rankopt.metrics import evaluate
from rankopt.metrics.search import score_chunks
from rankopt.similarity import pairwise


class FailsAfter(torch.nn.Linear):
    """A linear map that raises on its ``calls``-th call (an interrupted embedding run)."""

    def __init__(self, calls: int):
        super().__init__(4, 3)
        self.calls = calls

    def forward(self, x):
        self.calls -= 1
        if self.calls == 0:
            raise RuntimeError("interrupted")
        return super().forward(x)


def test_embed_dataset_writes_the_embeddings_into_the_npy_file(tmp_path):
    torch.manual_seed(0)
    model, ds = torch.nn.Linear(4, 3), Points(23, seed=23)
    in_memory = embed_dataset(model, ds, batch_size=5, show_progress=False)
    out = tmp_path / "E.npy"
    on_disk = embed_dataset(model, ds, batch_size=5, show_progress=False, out=out,
                            embedding_transform=lambda e: 2 * e)
    assert torch.equal(on_disk.embeddings, 2 * in_memory.embeddings)
    assert np.array_equal(np.load(out), 2 * in_memory.embeddings.numpy())  # the file holds every row
    on_disk.embeddings[0, 0] = 42.0  # a view of the file (its memory map), not a copy
    assert np.load(out)[0, 0] == 42.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["E.npy"]  # no temporary file left


def test_an_interrupted_embedding_leaves_no_file(tmp_path):
    out = tmp_path / "E.npy"
    with pytest.raises(RuntimeError, match="interrupted"):
        embed_dataset(FailsAfter(calls=3), Points(23, seed=23), batch_size=5, show_progress=False, out=out)
    assert list(tmp_path.iterdir()) == []


def test_open_npy_atomic_replaces_the_file_only_when_complete(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.zeros(2))
    with pytest.raises(KeyError), open_npy_atomic(path, (3,), np.int64) as array:
        array[:] = 7
        raise KeyError("stop")
    assert np.array_equal(np.load(path), np.zeros(2)) and len(list(tmp_path.iterdir())) == 1
    with open_npy_atomic(path, (3,), np.int64) as array:
        array[:] = 7
    assert np.array_equal(np.load(path), [7, 7, 7])


def test_read_npy_mmap_never_writes_the_file_and_keeps_the_checks(tmp_path):
    path = tmp_path / "e.npy"
    np.save(path, np.arange(6, dtype=np.float32).reshape(3, 2))
    array = read_npy(path, "--embeddings", mmap=True)
    assert isinstance(array, np.memmap)
    torch.from_numpy(array)[0, 0] = 100.0  # copy-on-write: the file is unchanged
    assert np.load(path)[0, 0] == 0.0
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="dtype=object"):
        read_npy(tmp_path / "o.npy", "--labels", mmap=True)


@pytest.mark.parametrize("similarity", ["cosine", "dot", "neg_l2"])
def test_query_chunks_are_prepared_one_at_a_time_with_the_same_scores(similarity):
    gen = torch.Generator().manual_seed(1)
    query, ref = torch.randn(11, 5, generator=gen), torch.randn(7, 5, generator=gen)
    exclude = torch.tensor([-1, 2, 0, -1, 6, 1, -1, 3, 5, 4, -1])
    chunks = list(score_chunks(query, ref, similarity=similarity, chunk_size=4, exclude=exclude))
    assert [start for start, _ in chunks] == [0, 4, 8]
    expected = pairwise(query, ref, similarity)
    expected[(exclude >= 0).nonzero().squeeze(1), exclude[exclude >= 0]] = float("-inf")
    torch.testing.assert_close(torch.cat([scores for _, scores in chunks]), expected)


@pytest.mark.parametrize("separate_gallery", [False, True])
def test_evaluating_memory_mapped_files_equals_the_in_memory_path(tmp_path, separate_gallery):
    gen = torch.Generator().manual_seed(2)
    emb, labels = torch.randn(40, 6, generator=gen), torch.randint(0, 4, (40, 2), generator=gen)
    labels[:, 1] = labels[:, 0] // 2
    metrics = ["recall@1", "recall@10", "map@r", "map", "mrr", "h-ap", "ndcg"]
    for name, array in (("e", emb), ("l", labels)):
        np.save(tmp_path / f"{name}.npy", array.numpy())
    mapped = torch.from_numpy(read_npy(tmp_path / "e.npy", mmap=True))
    if separate_gallery:
        expected = evaluate(emb[:15], labels[:15], emb[15:], labels[15:], metrics=metrics, chunk_size=4)
        got = evaluate(mapped[:15], labels[:15], mapped[15:], labels[15:], metrics=metrics, chunk_size=4)
    else:
        expected = evaluate(emb, labels, metrics=metrics, chunk_size=4)
        got = evaluate(mapped, labels, metrics=metrics, chunk_size=4)
    assert got.metrics == expected.metrics


def test_evaluate_embeddings_reads_memory_mapped_files(tmp_path):
    gen = torch.Generator().manual_seed(3)
    emb, labels = torch.randn(30, 6, generator=gen), torch.randint(0, 4, (30,), generator=gen)
    np.save(tmp_path / "e.npy", emb.numpy())
    np.save(tmp_path / "l.npy", labels.numpy())
    expected = evaluate(emb, labels, metrics=["recall@1", "map"], chunk_size=4).metrics
    json_path = tmp_path / "m.json"
    assert main(["evaluate-embeddings", "--embeddings", str(tmp_path / "e.npy"), "--labels", str(tmp_path / "l.npy"),
                 "--metrics", "recall@1", "map", "--chunk-size", "4", "--json", str(json_path), "--no-progress"]) == 0
    assert json.loads(json_path.read_text())["metrics"] == expected
