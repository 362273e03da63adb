"""``evaluate(..., method="tiled")``: the compiled one-pass kernels of :mod:`rankopt.metrics.tiled`.

Oracles: the brute-force float64 loops of ``reference.py`` (integer-valued embeddings with the
dot product give many exact ties, including ties between positives and negatives and with a
query's excluded copy) and the chunked torch path (``method="chunked"``). Tiles are made tiny so
that every kind of tile (positive tiles, off-diagonal pair tiles, skipped ranges, overflowing
candidate buffers) occurs in a few dozen items. All data are synthetic.
"""

from __future__ import annotations

import functools
import numpy as np
import pytest
import torch

import rankopt.metrics.evaluation as ev
from rankopt.metrics import evaluate, tiled

from . import reference
from . import test_query_ref_index as copies

pytest.importorskip("numba")
SEARCH = tiled.tiled_search

BINARY = ["recall@1", "recall@3", "recall@20", "precision@1", "precision@4", "true_recall@2", "true_recall@5",
          "map@r", "map@3", "map", "mrr"]  # fmt: skip
TOPK = [name for name in BINARY if name not in ("map", "mrr")]


@pytest.fixture(params=["counted", "heaps"])
def path(request, monkeypatch):
    """The metric names for each tiled path: every binary metric from counted ranks (no lists), or top-k
    metrics alone from top-k heaps (forced: the tests' classes are small enough to be counted)."""
    if request.param == "heaps":
        monkeypatch.setattr(ev, "COUNTED_TOPK_POSITIVES", 0)
        return TOPK
    return BINARY


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of ``tile`` (positive ranges up to twice that), candidate buffers of ``capacity`` per thread,
    kernels on ``threads`` ranges."""

    torch_threads = torch.get_num_threads()  # the pool sets torch's count on exit: put the real one back

    def use(tile: int = 8, capacity: int | None = None, threads: int = 3) -> None:
        monkeypatch.setattr(torch, "get_num_threads", lambda: threads)  # row and column ranges run in a pool
        monkeypatch.setattr(tiled, "TILE", tile)
        monkeypatch.setattr(tiled, "SELF_COUNT_TILE", tile)
        monkeypatch.setattr(tiled, "POSITIVE_RANGE", 2 * tile)
        monkeypatch.setattr(tiled, "tiled_search", functools.partial(SEARCH, candidate_capacity=capacity))

    yield use
    torch.set_num_threads(torch_threads)


def _case(seed: int, n: int, num_classes: int, ties: bool, dim: int = 3):
    rng = np.random.default_rng(seed)
    x = rng.integers(-1, 2, size=(n, dim)).astype(np.float64) if ties else rng.normal(size=(n, dim))
    return x, rng.integers(0, num_classes, size=n)


def _both(x, y, xr=None, yr=None, names=BINARY, similarity="dot", **kwargs):
    t = lambda a: None if a is None else torch.as_tensor(a)  # noqa: E731
    got = evaluate(t(x), t(y), t(xr), t(yr), metrics=names, similarity=similarity, method="tiled", **kwargs)
    chunked = evaluate(t(x), t(y), t(xr), t(yr), metrics=names, similarity=similarity, method="chunked", **kwargs)
    return got, chunked


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize(("tile", "threads"), [(5, 3), (8, 1), (64, 2)])
def test_self_retrieval_against_brute_force(seed, tile, threads, small_tiles, path):
    small_tiles(tile, threads=threads)
    ties = seed % 3 != 0
    x, y = _case(seed, n=45, num_classes=11, ties=ties)
    got, chunked = _both(x, y, names=path, similarity="dot" if ties else "cosine")
    want, without = reference.evaluate(x, y, None, None, path, "dot" if ties else "cosine")
    copies._assert_close(got.metrics, want)
    assert got.metrics == chunked.metrics
    assert got.num_queries_without_positive == without


@pytest.mark.parametrize("seed", range(6))
def test_overflowing_candidate_buffers_fall_back_to_the_column_scan(seed, small_tiles, monkeypatch):
    """With room for one candidate per task, every pair tile overflows and takes the fallback."""
    from rankopt.metrics import _tile_kernels

    calls = []
    fallback = _tile_kernels.column_heaps_pass
    monkeypatch.setattr(_tile_kernels, "column_heaps_pass", lambda *a: (calls.append(1), fallback(*a))[1])
    monkeypatch.setattr(ev, "COUNTED_TOPK_POSITIVES", 0)
    small_tiles(8, capacity=1)
    x, y = _case(seed, n=40, num_classes=9, ties=True)
    got, _ = _both(x, y, names=TOPK)
    want, _ = reference.evaluate(x, y, None, None, TOPK, "dot")
    copies._assert_close(got.metrics, want)
    assert calls, "no tile overflowed: the fallback was not exercised"


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("similarity", ["dot", "neg_l2", "cosine"])
def test_separate_gallery_against_brute_force(seed, similarity, small_tiles, path):
    """Gallery classes absent from the queries and query classes absent from the gallery; the positive
    ranges straddle tiles, so the skipped column ranges are exercised."""
    small_tiles(6)
    ties = similarity != "cosine"
    x, y = _case(seed, n=25, num_classes=9, ties=ties)
    xr, yr = _case(seed + 100, n=50, num_classes=12, ties=ties)
    got, chunked = _both(x, y, xr, yr, names=path, similarity=similarity)
    want, without = reference.evaluate(x, y, xr, yr, path, similarity)
    copies._assert_close(got.metrics, want)
    assert got.metrics == chunked.metrics
    assert got.num_queries_without_positive == without


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("mode", ["mixed", "all", "any"])
def test_query_copies_excluded_by_index(seed, mode, small_tiles, path):
    """A gallery holding copies of the queries (tied with them), some exclusions pointing at unrelated items."""
    small_tiles(4)
    x, y, xr, yr, index = copies._case(seed, num_queries=16, num_others=30, copies=mode)
    names = path
    got = evaluate(*map(torch.as_tensor, (x, y, xr, yr)), metrics=names, similarity="dot",
                   query_ref_index=torch.as_tensor(index), method="tiled")
    want, without = copies._brute_force(x, y, xr, yr, index, names)
    copies._assert_close(got.metrics, want)
    assert got.num_queries_without_positive == without


def test_lists_holding_the_whole_retrieval_set(small_tiles, path):
    """``recall@100`` on 30 items: every list holds the whole retrieval set (every rank is below the cut-off)."""
    small_tiles(8)
    x, y = _case(1, n=30, num_classes=6, ties=True)
    names = ["recall@100", "precision@10", "map@r"] + (["map", "mrr"] if "map" in path else [])
    got, _ = _both(x, y, names=names)
    want, _ = reference.evaluate(x, y, None, None, names, "dot")
    copies._assert_close(got.metrics, want)


@pytest.mark.parametrize("num_classes", [2, 30])
def test_float32_and_large_classes_for_top_k_metrics(num_classes, small_tiles):
    """Top-k metrics alone: classes of any size (60 items: heaps; 4: counted ranks), float32 embeddings."""
    small_tiles(16)
    x, y = _case(4, n=120, num_classes=num_classes, ties=True)
    names = ["recall@1", "recall@10", "precision@5", "map@r"]
    x32 = torch.as_tensor(x, dtype=torch.float32)
    got = evaluate(x32, torch.as_tensor(y), metrics=names, similarity="dot", method="tiled")
    chunked = evaluate(x32, torch.as_tensor(y), metrics=names, similarity="dot", method="chunked")
    assert got.metrics == chunked.metrics
    want, _ = reference.evaluate(x, y, None, None, names, "dot")
    copies._assert_close(got.metrics, want)


@pytest.mark.parametrize(("k", "threads"), [(7, 2), (0, 2), (0, 3)])
def test_tiled_search_lists_and_ranks_against_the_definitions(k, threads, monkeypatch):
    """The raw outputs: each top-k list holds the k best scores of the retrieval set, and each rank is
    ``#{k in Omega : s_k >= t_p}`` for the positive's score ``t_p`` (``k = 0``: the counts alone, the
    threads' column counts added at the end)."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.integers(-2, 3, size=(50, 4)).astype(np.float64))
    y = torch.as_tensor(rng.integers(0, 12, size=50))
    found = SEARCH(x, y, None, y, torch.arange(50), k=k, count_positives=True,
                                           similarity="dot", tile=8, candidate_capacity=2)
    s = (x @ x.T).fill_diagonal_(float("-inf"))
    assert torch.equal(found.values, s.topk(k, dim=1).values)
    assert torch.equal(s.gather(1, found.indices), found.values)
    for i in range(50):
        positives = [j for j in range(50) if j != i and y[j] == y[i]]
        want = sorted((float(s[i, j]) for j in positives), reverse=True)
        got = found.positive_scores[i, found.positive_valid[i]].tolist()
        assert got == want
        for t, rank in zip(got, found.ranks[i, found.positive_valid[i]].tolist()):
            assert rank == int((s[i] >= t).sum())


def test_query_blocks_end_at_class_boundaries_and_respect_the_limits():
    counts = [3, 1, 9, 2, 2, 5]
    starts = [0, 4, 4, 10, 11, 20]
    ends = [4, 4, 10, 11, 20, 22]
    blocks = tiled.query_blocks(counts, starts, ends, tile=4, limit=7)
    assert blocks[0][0] == 0 and blocks[-1][1] == sum(counts)
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:]))  # the blocks cover the queries in order
    assert all(0 < hi - lo <= 4 for lo, hi, _, _ in blocks)
    class_of = np.repeat(np.arange(len(counts)), counts)
    boundaries = set(np.cumsum([0] + counts).tolist())
    for lo, hi, r_lo, r_hi in blocks:
        classes = set(class_of[lo:hi].tolist())
        assert all(r_lo <= starts[c] and ends[c] <= r_hi for c in classes)  # every positive in the range
        assert r_hi - r_lo <= 7 or len(classes) == 1  # the limit holds unless one class alone exceeds it
        assert hi in boundaries or (class_of[hi - 1] == class_of[hi] and counts[class_of[hi]] > 4)  # only big classes are cut
    assert blocks == [(0, 4, 0, 4), (4, 8, 4, 10), (8, 12, 4, 10), (12, 15, 4, 11), (15, 17, 11, 20), (17, 21, 20, 22), (21, 22, 20, 22)]


def test_method_choice_and_refusals(monkeypatch):
    x, y = _case(0, n=30, num_classes=6, ties=False)
    x, y = torch.as_tensor(x), torch.as_tensor(y)
    used = []
    real = tiled.tiled_search
    monkeypatch.setattr(tiled, "tiled_search", lambda *a, **k: (used.append(1), real(*a, **k))[1])
    evaluate(x, y, metrics=["map"])  # below the threshold: chunked
    assert not used
    monkeypatch.setattr(ev, "TILED_MIN_SCORES", 10)
    evaluate(x, y, metrics=["map"])
    assert used
    with pytest.raises(ValueError, match="binary metrics only"):
        evaluate(x, torch.stack([y, y // 2], 1), metrics=["h-ap"], method="tiled")
    with pytest.raises(ValueError, match="at most 32 positives"):
        evaluate(torch.randn(40, 3), torch.zeros(40, dtype=torch.long), metrics=["map"], method="tiled")
    with pytest.raises(ValueError, match="unknown method"):
        evaluate(x, y, method="fast")
    with pytest.raises(ValueError, match="without ref_block_size"):
        evaluate(x, y, metrics=["map"], method="tiled", ref_block_size=8)
    with pytest.raises(ValueError, match="backend='torch'"):
        evaluate(x, y, metrics=["recall@1"], method="tiled", backend="faiss")


def test_small_classes_count_ranks_instead_of_keeping_lists(monkeypatch):
    """Top-k metrics alone: counted ranks (``k = 0``) up to ``COUNTED_TOPK_POSITIVES`` positives per query,
    top-k heaps above; with ``map``/``mrr``, always counted ranks. Values equal the chunked path's."""
    calls = []
    real = tiled.tiled_search
    monkeypatch.setattr(tiled, "tiled_search", lambda *a, **k: (calls.append(k), real(*a, **k))[1])
    x = torch.as_tensor(_case(3, n=60, num_classes=1, ties=False)[0])
    for class_size, names, want_k in [(4, TOPK, 0), (20, TOPK, 21), (20, BINARY, 0)]:
        y = torch.arange(60) // class_size
        got = evaluate(x, y, metrics=names, method="tiled")
        assert calls[-1]["k"] == want_k and calls[-1]["count_positives"] == (want_k == 0)
        assert got.metrics == pytest.approx(evaluate(x, y, metrics=names, method="chunked").metrics, abs=1e-12)


def test_evaluate_embeddings_method_flag(tmp_path, capsys):
    from rankopt.cli import main

    x, y = _case(2, n=40, num_classes=8, ties=False)
    np.save(tmp_path / "E.npy", x.astype(np.float32))
    np.save(tmp_path / "L.npy", y)
    printed = {}
    for method in ("tiled", "chunked"):
        out = tmp_path / f"{method}.json"
        assert main(["evaluate-embeddings", "--embeddings", str(tmp_path / "E.npy"), "--labels", str(tmp_path / "L.npy"),
                     "--metrics", "recall@1", "map", "--method", method, "--json", str(out), "--no-progress"]) in (0, None)
        printed[method] = out.read_text()
    assert printed["tiled"] == printed["chunked"]
    capsys.readouterr()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("separate", [False, True])
def test_deep_lists_filled_above_a_selection_floor(seed, separate, small_tiles, monkeypatch):
    """Lists of 41 (``recall@40``, ``map@40``): a heap that is empty or only partly filled by a short
    positive tile is filled from the scores above a floor drawn from chunk maxima, in one selection."""
    small_tiles(128, threads=2)
    monkeypatch.setattr(ev, "COUNTED_TOPK_POSITIVES", 0)
    names = ["recall@1", "recall@40", "precision@40", "map@40", "map@r"]
    ties = seed % 2 == 0
    x, y = _case(seed, n=260, num_classes=40, ties=ties, dim=4)
    xr, yr = _case(seed + 50, n=400, num_classes=60, ties=ties, dim=4) if separate else (None, None)
    similarity = "dot" if ties else "cosine"
    got, chunked = _both(x, y, xr, yr, names=names, similarity=similarity)
    want, _ = reference.evaluate(x, y, xr, yr, names, similarity)
    copies._assert_close(got.metrics, want)
    assert got.metrics == pytest.approx(chunked.metrics, abs=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_quickselect_keeps_the_k_largest(seed):
    """``_keep_best`` (with its ids) against a sort, on values with many ties."""
    from rankopt.metrics import _tile_kernels

    rng = np.random.default_rng(seed)
    size = int(rng.integers(1, 300))
    k = int(rng.integers(1, size + 1))
    values = rng.integers(0, 1 + seed % 7, size=size).astype(np.float32) if seed % 2 else rng.normal(size=size).astype(np.float32)
    ids = np.arange(size)
    work_values, work_ids = values.copy(), ids.copy()
    _tile_kernels._keep_best(work_values, work_ids, size, k)
    np.testing.assert_array_equal(np.sort(work_values[:k]), np.sort(values)[size - k :])
    np.testing.assert_array_equal(values[work_ids], work_values)  # ids moved with their values
    np.testing.assert_array_equal(np.sort(work_ids), ids)
