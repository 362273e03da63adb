"""Memory-bounded embedding and evaluation: embeddings written straight into a ``.npy`` memory map,
evaluated from a memory-mapped file, query chunks prepared one at a time, the reference set read in
blocks (``ref_block_size``); results equal the in-memory path."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from helpers.vectors import Points

from rankopt.cli import main
from rankopt.engine.embed_and_score import embed_dataset
from rankopt.files import open_npy_atomic, read_npy
from rankopt.metrics import evaluate
from rankopt.metrics.evaluation import MAX_COUNTED_POSITIVES
from rankopt.metrics.topk import ref_block_scores, score_chunks
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


BLOCKED_METRICS = ["recall@1", "recall@5", "recall@100", "precision@3", "true_recall@4", "map@r", "map@5", "map", "mrr"]


def _mapped(tmp_path, name: str, array: torch.Tensor) -> torch.Tensor:
    """``array`` saved as ``name.npy`` and read back as a tensor over its memory map."""
    np.save(tmp_path / f"{name}.npy", array.numpy())
    return torch.from_numpy(read_npy(tmp_path / f"{name}.npy", mmap=True))


def _assert_same(got, expected):
    assert got.metrics.keys() == expected.metrics.keys()
    for name, value in expected.metrics.items():
        assert got.metrics[name] == pytest.approx(value, abs=1e-6), name
    assert (got.num_excluded, got.num_queries_without_positive) == (expected.num_excluded, expected.num_queries_without_positive)


def _points(seed: int, rows: int, similarity: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantised embeddings (many exact ties) for ``dot``; Gaussian ones otherwise. Labels in 6 classes."""
    gen = torch.Generator().manual_seed(seed)
    emb = torch.randint(-2, 3, (rows, 4), generator=gen).float() if similarity == "dot" else torch.randn(rows, 4, generator=gen)
    return emb, torch.randint(0, 6, (rows,), generator=gen)


@pytest.mark.parametrize("similarity", ["dot", "cosine", "neg_l2"])
@pytest.mark.parametrize("block", [1, 7, 47])
def test_self_retrieval_with_the_reference_set_in_blocks_equals_the_in_memory_path(tmp_path, similarity, block):
    emb, labels = _points(4, 47, similarity)
    expected = evaluate(emb, labels, metrics=BLOCKED_METRICS, similarity=similarity)
    got = evaluate(_mapped(tmp_path, "e", emb), labels, metrics=BLOCKED_METRICS, similarity=similarity,
                   chunk_size=10, ref_block_size=block)
    _assert_same(got, expected)


@pytest.mark.parametrize("similarity", ["dot", "cosine"])
@pytest.mark.parametrize("block", [1, 7, 40])
def test_a_gallery_in_blocks_with_query_copies_equals_the_in_memory_path(tmp_path, similarity, block):
    ref, ref_labels = _points(5, 40, similarity)
    query, query_labels = _points(6, 17, similarity)
    own = torch.randint(-1, 40, (17,), generator=torch.Generator().manual_seed(7))
    query[own >= 0] = ref[own[own >= 0]]  # a query with a copy in the gallery is that copy
    query_labels[own >= 0] = ref_labels[own[own >= 0]]
    for index in (None, own):
        expected = evaluate(query, query_labels, ref, ref_labels, metrics=BLOCKED_METRICS, similarity=similarity,
                            query_ref_index=index)
        got = evaluate(_mapped(tmp_path, "q", query), query_labels, _mapped(tmp_path, "r", ref), ref_labels,
                       metrics=BLOCKED_METRICS, similarity=similarity, chunk_size=6, query_ref_index=index,
                       ref_block_size=block)
        _assert_same(got, expected)


def test_ref_block_scores_reads_only_blocks_and_excludes_by_index():
    gen = torch.Generator().manual_seed(8)
    query, ref = torch.randn(5, 3, generator=gen), torch.randn(11, 3, generator=gen)
    read: list[int] = []

    class Rows:  # a reference set that records the rows read
        shape = ref.shape

        def __getitem__(self, rows: slice) -> torch.Tensor:
            read.append(len(range(*rows.indices(ref.shape[0]))))
            return ref[rows]

    exclude = torch.tensor([10, -1, 0, 4, 4])
    blocks = list(ref_block_scores(query, Rows(), similarity="dot", block_size=4, exclude=exclude))
    assert read == [4, 4, 3] and [start for start, _ in blocks] == [0, 4, 8]
    expected = pairwise(query, ref, "dot")
    expected[[0, 2, 3, 4], [10, 0, 4, 4]] = float("-inf")
    torch.testing.assert_close(torch.cat([scores for _, scores in blocks], dim=1), expected)


def test_ref_block_size_refuses_what_needs_whole_rows():
    emb, labels = _points(9, 20, "cosine")
    with pytest.raises(ValueError, match="need whole rows"):
        evaluate(emb, torch.stack([labels, labels // 2], dim=1), metrics=["recall@1", "h-ap"], ref_block_size=4)
    with pytest.raises(ValueError, match="backend='torch'"):
        evaluate(emb, labels, metrics=["recall@1"], backend="faiss", ref_block_size=4)
    with pytest.raises(ValueError, match="ref_block_size must be >= 1"):
        evaluate(emb, labels, metrics=["recall@1"], ref_block_size=0)
    big = torch.zeros(MAX_COUNTED_POSITIVES + 2, dtype=torch.long)
    with pytest.raises(ValueError, match=f"at most {MAX_COUNTED_POSITIVES} positives"):
        evaluate(torch.randn(big.numel(), 3), big, metrics=["map"], ref_block_size=4)
    assert evaluate(torch.randn(big.numel(), 3), big, metrics=["recall@1"], ref_block_size=4).metrics == {"recall@1": 1.0}


def test_evaluate_embeddings_ref_block_size_flag(tmp_path, capsys):
    emb, labels = _points(10, 30, "cosine")
    np.save(tmp_path / "e.npy", emb.numpy())
    np.save(tmp_path / "l.npy", labels.numpy())
    expected = evaluate(emb, labels, metrics=["recall@1", "map"])
    json_path = tmp_path / "m.json"
    args = ["evaluate-embeddings", "--embeddings", str(tmp_path / "e.npy"), "--labels", str(tmp_path / "l.npy"),
            "--metrics", "recall@1", "map", "--ref-block-size", "7", "--json", str(json_path), "--no-progress"]
    assert main(args) == 0
    got = json.loads(json_path.read_text())["metrics"]
    assert got == pytest.approx(expected.metrics, abs=1e-6)
    assert main([*args[:5], "--metrics", "ndcg", "--ref-block-size", "7"]) == 1
    assert "evaluate without ref_block_size" in capsys.readouterr().err


def test_the_finiteness_check_reads_row_blocks_and_names_the_row():
    from rankopt.checks import FINITE_CHECK_ROWS, check_embeddings

    x = torch.zeros(FINITE_CHECK_ROWS + 10, 2)
    x[FINITE_CHECK_ROWS + 3, 1] = float("nan")
    with pytest.raises(ValueError, match=rf"1 row\(s\) with NaN or Inf values: rows {FINITE_CHECK_ROWS + 3}"):
        check_embeddings(x)
    assert check_embeddings(x[:FINITE_CHECK_ROWS]) is not None
