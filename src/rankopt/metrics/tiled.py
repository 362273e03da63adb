"""Exact binary retrieval metrics on CPU in one pass over tiles of the score matrix.

Every binary metric is a function of the positives' pessimistic ranks
``rank(j) = #{k in Omega : s_k >= s_j}`` (:func:`rankopt.metrics.binary.from_positive_ranks`);
a top-``K`` list is needed only where counting costs more than keeping it (top-k metrics alone,
classes of more than a few positives) or where the list itself is wanted. :func:`tiled_search`
gets the ranks and, if asked, the lists from one pass over tiles of the product, each read once
by a compiled kernel (:mod:`rankopt.metrics._tile_kernels`) that counts the items scoring at
least each positive's score and keeps a bounded heap of the ``K`` best scores per query: no sort,
no ``(Q, R)`` matrix, no ``torch.topk`` over whole tiles.

A count ``#{k : s_k >= t_j}`` needs the threshold ``t_j = s_j`` before the tiles are read, and it
must be the very value the tiles hold, or ties break. Queries and references are therefore
reordered by finest label so that each block of queries has all its positives in one contiguous
range of references, its *positive tile*, computed first: the thresholds are read from it, and
every later tile of the block holds negatives only. In self-retrieval the blocks end at class
boundaries, the positive tiles are the diagonal tiles, and each off-diagonal tile serves its rows
and, transposed, its columns: half the products, as :func:`rankopt.metrics.topk.self_topk`.

Threads: each pool thread owns a share of every block's rows, computes its rows of each tile and
serves them, without waiting for the others (rows are never shared); columns (self-retrieval)
are counted into one accumulator per thread, added at the end. Only column heaps are shared:
with them, the threads meet at every off-diagonal tile (:class:`_PairPass`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from rankopt.metrics.ranking import tie_ends
from rankopt.threads import ThreadPool
from rankopt.similarity import pairwise, prepare

TILE = 2048  # rows and columns of a tile (the fastest with top-k heaps and for a separate gallery;
             # measured: benchmarks/results/metrics.md)
SELF_COUNT_TILE = 1024  # self-retrieval without heaps: smaller diagonal tiles, half the products computed twice
POSITIVE_RANGE = 8192  # most references in one query block's positive tile (separate gallery)


@functools.cache
def available() -> bool:
    """Whether the compiled kernels can be used (numba importable)."""
    try:
        import numba  # noqa: F401, PLC0415 - optional at run time, imported lazily
    except ImportError:  # pragma: no cover - depends on the environment
        return False
    return True


@dataclass
class TiledSearch:
    """Per query (original order): the exact top-``K`` list and the positives' ranks.

    ``values``/``indices``: ``(Q, K)`` best scores, decreasing, and their references (a slot the
    retrieval set cannot fill holds the query's excluded reference at ``-inf``).
    ``positive_scores``/``positive_valid``: ``(Q, P)`` the positives' scores, decreasing, padding
    (not valid, ``-inf``) last. ``ranks``: ``(Q, P)`` ``#{k in Omega : s_k >= t_p}``, pessimistic.
    """

    values: torch.Tensor
    indices: torch.Tensor
    positive_scores: torch.Tensor
    positive_valid: torch.Tensor
    ranks: torch.Tensor


def query_blocks(counts: list[int], ref_starts: list[int], ref_ends: list[int], tile: int,
                 limit: int) -> list[tuple[int, int, int, int]]:
    """``(q_lo, q_hi, r_lo, r_hi)`` blocks over queries sorted by class.

    Class ``c`` has ``counts[c]`` consecutive queries and its positives at references
    ``[ref_starts[c], ref_ends[c])`` (non-decreasing in ``c``). A block holds at most ``tile``
    queries and a reference range of at most ``limit``; it ends at a class boundary unless one
    class alone has more than ``tile`` queries, which is then split.
    """
    blocks: list[tuple[int, int, int, int]] = []
    start = pos = lo = hi = 0
    for count, ref_start, ref_end in zip(counts, ref_starts, ref_ends):
        if pos > start and (pos + count - start > tile or ref_end - lo > limit):
            blocks.append((start, pos, lo, hi))
            start = pos
        if pos == start:
            lo = ref_start
        hi = ref_end
        end = pos + count
        while end - start > tile:  # a class with more than `tile` queries, alone in its blocks
            blocks.append((start, start + tile, lo, hi))
            start += tile
        pos = end
    if pos > start:
        blocks.append((start, pos, lo, hi))
    return blocks


class _State:
    """Heaps, thresholds and counts of the queries, in the sorted order, as numpy views of tensors."""

    def __init__(self, num_queries: int, k: int, width: int, dtype: torch.dtype) -> None:
        self.heap_values = torch.full((num_queries, k), float("-inf"), dtype=dtype)
        self.heap_ids = torch.full((num_queries, k), -1, dtype=torch.int64)
        self.thresholds = torch.full((num_queries, width), float("inf"), dtype=dtype)  # +inf: counts nothing
        self.npos = torch.zeros(num_queries, dtype=torch.int64)
        self.counts = torch.zeros((num_queries, width), dtype=torch.int64)

    def numpy(self, rows: slice) -> tuple[np.ndarray, ...]:
        return tuple(t[rows].numpy()
                     for t in (self.heap_values, self.heap_ids, self.thresholds, self.npos, self.counts))


def tiled_search(
    query: torch.Tensor,
    query_fine: torch.Tensor,
    ref: torch.Tensor | None,
    ref_fine: torch.Tensor,
    own: torch.Tensor | None,
    *,
    k: int,
    count_positives: bool,
    similarity: str = "cosine",
    tile: int | None = None,
    candidate_capacity: int | None = None,
) -> TiledSearch:
    """Top-``k`` lists and positives' ranks of every query, exact (ties pessimistic), on CPU.

    ``ref=None``: self-retrieval (``ref_fine`` is ``query_fine``). ``own``: ``(Q,)`` the reference
    excluded from each query's retrieval set (``-1``: none; self-retrieval: ``arange(Q)``).
    Positives of a query: the references of its finest label, ``own`` excluded.
    ``count_positives=False`` skips the ranks (``P = 0``). ``candidate_capacity``: room for column
    candidates per thread of :class:`_PairPass` (default: an eighth of a tile, at least 65,536; tests make it tiny
    to exercise the fallback). Runs on ``torch.get_num_threads()`` threads; while it runs, torch itself is set
    to one thread (each pool thread computes its own rows of every product) and restored on return.
    ``tile``: default :data:`SELF_COUNT_TILE` in self-retrieval without heaps (``k = 0``), else :data:`TILE`.
    """
    from rankopt.metrics import _tile_kernels as kernels  # noqa: PLC0415 - numba: slow import

    tile = tile or (SELF_COUNT_TILE if ref is None and k == 0 else TILE)
    self_retrieval = ref is None
    num_queries = query.shape[0]
    num_refs = num_queries if self_retrieval else ref.shape[0]
    if count_positives:
        q_order, r_order, ref_starts, ref_counts, class_of_query, blocks = _class_blocks(
            query_fine, ref_fine, self_retrieval, tile)
    else:  # plain tiles in the given order; the diagonal tiles (self-retrieval) come first
        q_order, r_order = torch.arange(num_queries), torch.arange(num_refs)
        blocks = [(lo, min(lo + tile, num_queries)) * 2 if self_retrieval else (lo, min(lo + tile, num_queries), 0, 0)
                  for lo in range(0, num_queries, tile)]
    x_query = prepare(query, similarity)[q_order]
    x_ref = x_query if self_retrieval else prepare(ref, similarity)[r_order]
    q_labels = query_fine[q_order].contiguous()
    r_labels = q_labels if self_retrieval else ref_fine[r_order].contiguous()
    own_sorted = _sorted_own(own, q_order, r_order)

    width = max(int(ref_counts.max()), 1) if count_positives and ref_counts.numel() else int(count_positives)
    state = _State(num_queries, k, width, x_query.dtype)
    rows_max = max(q_hi - q_lo for q_lo, q_hi, _, _ in blocks)
    cols_max = max([tile, rows_max] + [r_hi - r_lo for _, _, r_lo, r_hi in blocks])

    with ThreadPool(torch.get_num_threads()) as pool:
        buffers = [torch.empty(-(-rows_max // pool.threads) * cols_max, dtype=x_query.dtype)
                   for _ in range(pool.threads)]

        def scores_of(t: int, rows: slice, cols: slice) -> torch.Tensor:
            """The scores of ``rows x cols``, computed by pool thread ``t`` into its own buffer."""
            out = buffers[t][: (rows.stop - rows.start) * (cols.stop - cols.start)].view(
                rows.stop - rows.start, cols.stop - cols.start)
            return pairwise(x_query[rows], x_ref[cols], similarity, prepared=True, out=out)

        def serve_rows(scores: torch.Tensor, rows: slice, cols: slice, skip: tuple[int, int],
                       check_labels: bool) -> None:
            local = own_sorted[rows] - cols.start
            own_in = torch.where((local >= 0) & (local < scores.shape[1]), local, -1).numpy()
            kernels.rows_pass(scores.numpy(), 0, scores.shape[0], cols.start, *state.numpy(rows), own_in, *skip,
                              q_labels[rows].numpy(), r_labels[cols].numpy(), check_labels)

        def positive_tiles(t: int) -> None:
            """Thread ``t``'s rows of every positive tile: their thresholds, then the tile's counts."""
            for q_lo, q_hi, r_lo, r_hi in blocks:
                rows, cols = pool.share(t, q_lo, q_hi), slice(r_lo, r_hi)
                if r_hi == r_lo or rows.stop == rows.start:
                    continue
                scores = scores_of(t, rows, cols)
                if width:
                    _read_thresholds(state, rows, scores, ref_starts[class_of_query[rows]] - r_lo,
                                     ref_counts[class_of_query[rows]], own_sorted[rows] - r_lo)
                serve_rows(scores, rows, cols, (r_hi - r_lo, r_hi - r_lo), True)

        def gallery_tiles(t: int) -> None:
            """Thread ``t``'s rows of every reference tile outside the blocks' positive ranges (separate gallery)."""
            for q_lo, q_hi, r_lo, r_hi in blocks:
                rows = pool.share(t, q_lo, q_hi)
                for c_lo in range(0, num_refs if rows.stop > rows.start else 0, tile):
                    n = min(c_lo + tile, num_refs) - c_lo
                    skip_lo, skip_hi = min(max(r_lo - c_lo, 0), n), min(max(r_hi - c_lo, 0), n)
                    if skip_lo == 0 and skip_hi == n:
                        continue
                    cols = slice(c_lo, c_lo + n)
                    serve_rows(scores_of(t, rows, cols), rows, cols,
                               (skip_lo, skip_hi) if skip_lo < skip_hi else (n, n), False)

        pool.each(positive_tiles)  # rows are never shared between threads: no synchronisation inside a phase
        if not self_retrieval:
            pool.each(gallery_tiles)
        elif k == 0:
            _pair_counts(state, pool, blocks, scores_of)
        else:
            _pair_heaps(state, pool, blocks, x_query, similarity, rows_max * cols_max,
                        _PairPass(state, pool, rows_max, candidate_capacity))
    return _result(state, q_order, r_order, own_sorted, own, width)


def _sorted_own(own: torch.Tensor | None, q_order: torch.Tensor, r_order: torch.Tensor) -> torch.Tensor:
    """Each sorted query's own reference as a position in the sorted references (``-1``: none)."""
    if own is None:
        return torch.full((q_order.shape[0],), -1, dtype=torch.int64)
    r_rank = torch.empty_like(r_order)
    r_rank[r_order] = torch.arange(r_order.shape[0])
    original = own[q_order]
    return torch.where(original >= 0, r_rank[original.clamp(min=0)], -1)


def _pair_heaps(state: _State, pool: ThreadPool, blocks: list[tuple[int, int, int, int]], x: torch.Tensor,
                similarity: str, room: int, pairs: _PairPass) -> None:
    """Off-diagonal tiles of a symmetric product with heaps (self-retrieval, ``k > 0``): each tile ``a x b``
    (``b`` after ``a``) computed once into one buffer of ``room`` scores, serving its rows and its columns."""
    buffer = torch.empty(room, dtype=x.dtype)
    for a, (a_lo, a_hi, _, _) in enumerate(blocks):
        rows = slice(a_lo, a_hi)
        for b_lo, b_hi, _, _ in blocks[a + 1 :]:
            cols = slice(b_lo, b_hi)
            pair = buffer[: (a_hi - a_lo) * (b_hi - b_lo)].view(a_hi - a_lo, b_hi - b_lo)

            def product(lo: int, hi: int, pair: torch.Tensor = pair, rows: slice = rows, cols: slice = cols) -> None:
                pairwise(x[rows][lo:hi], x[cols], similarity, prepared=True, out=pair[lo:hi])

            pairs.serve(pair.numpy(), rows, cols, product)


def _pair_counts(state: _State, pool: ThreadPool, blocks: list[tuple[int, int, int, int]],
                 scores_of: Callable[[int, slice, slice], torch.Tensor]) -> None:
    """Off-diagonal tiles of a symmetric product without heaps (``k = 0``): each thread computes its rows of
    every tile and counts for them and, into a ``(P, N)`` accumulator of its own, for the columns; the
    accumulators are added at the end."""
    from rankopt.metrics import _tile_kernels as kernels  # noqa: PLC0415 - numba: slow import

    num_items, width = state.counts.shape
    thresholds_t = state.thresholds.T.contiguous().numpy()
    column_acc = np.zeros((pool.threads, width, num_items), dtype=np.int32)
    npos = [int(state.npos[b_lo:b_hi].max()) if width else 0 for b_lo, b_hi, _, _ in blocks]

    def tiles(t: int) -> None:
        for a, (a_lo, a_hi, _, _) in enumerate(blocks):
            rows = pool.share(t, a_lo, a_hi)
            if rows.stop == rows.start:
                continue
            row_state = state.numpy(rows)
            for b in range(a + 1, len(blocks)):
                b_lo, b_hi = blocks[b][:2]
                scores = scores_of(t, rows, slice(b_lo, b_hi)).numpy()
                kernels.pair_counts(scores, 0, scores.shape[0], row_state[2], row_state[3], row_state[4], thresholds_t,
                                    npos[b],
                                    column_acc[t], b_lo)

    pool.each(tiles)
    state.counts += torch.from_numpy(column_acc.sum(axis=0, dtype=np.int64).T)


class _PairPass:
    """Off-diagonal tiles of a symmetric product: one :func:`pair_pass` over the tile for its rows and
    columns (a row range per thread, each with its own column counts and candidate buffer), then the
    column candidates merged into their heaps by column range (or, if a buffer overflowed, every score
    offered to its column's heap by :func:`column_heaps_pass`)."""

    def __init__(self, state: _State, pool: ThreadPool, tile: int, capacity: int | None) -> None:
        self.state, self.pool = state, pool
        tasks = pool.threads
        self.capacity = capacity if capacity is not None else max(2**16, tile * tile // (8 * tasks))
        dtype = state.heap_values.numpy().dtype
        self.candidates = np.empty((tasks, self.capacity), dtype=dtype)
        self.candidate_rows = np.empty((tasks, self.capacity), dtype=np.int32)  # tile coordinates
        self.candidate_cols = np.empty((tasks, self.capacity), dtype=np.int32)
        self.column_acc = np.empty((tasks, state.counts.shape[1] * tile), dtype=np.int32)  # (P, n) per thread
        self.overflows = 0

    def serve(self, scores: np.ndarray, rows: slice, cols: slice, product: Callable[[int, int], object]) -> None:
        """The tile ``scores`` of ``rows x cols``; ``product(lo, hi)`` computes its rows ``[lo, hi)``."""
        from rankopt.metrics import _tile_kernels as kernels  # noqa: PLC0415 - numba: slow import

        s, n = self.state, scores.shape[1]
        p = int(s.npos[cols].max()) if s.counts.shape[1] else 0
        heap_values, heap_ids = s.heap_values[cols].numpy(), s.heap_ids[cols].numpy()
        floors, roots = kernels.column_floors(heap_values, n)
        thresholds_t = s.thresholds[cols, :p].T.contiguous().numpy()
        acc = self.column_acc[:, : p * n].reshape(self.pool.threads, p, n)
        acc[...] = 0
        row_state = s.numpy(rows)

        def rows_and_columns(t: int, lo: int, hi: int) -> int:
            product(lo, hi)
            return kernels.pair_pass(scores, lo, hi, cols.start, *row_state, roots, floors, thresholds_t, acc[t],
                                     self.candidates[t], self.candidate_rows[t], self.candidate_cols[t])

        found = dict(enumerate(self.pool.run(rows_and_columns, scores.shape[0])))
        s.counts[cols, :p] += torch.from_numpy(acc.sum(axis=0, dtype=np.int64).T)
        if all(f <= self.capacity for f in found.values()):
            def merge(_: int, lo: int, hi: int) -> None:
                for t, f in found.items():
                    kernels.merge_column_candidates(heap_values, heap_ids, self.candidates[t], self.candidate_rows[t],
                                                    self.candidate_cols[t], f, rows.start, lo, hi)
        else:
            self.overflows += 1

            def merge(_: int, lo: int, hi: int) -> None:
                kernels.column_heaps_pass(scores, heap_values, heap_ids, rows.start, lo, hi)

        self.pool.run(merge, n)


def _class_blocks(
    query_fine: torch.Tensor, ref_fine: torch.Tensor, self_retrieval: bool, tile: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[int, int, int, int]]]:
    """Queries sorted by class; references of the queries' classes first, in the same class order, then
    the others. Returns the two orders, each query class's reference range (start, count), the class of
    each sorted query and the :func:`query_blocks` (in self-retrieval: square, on the diagonal)."""
    q_order = query_fine.argsort(stable=True)
    classes, q_counts = torch.unique_consecutive(query_fine[q_order], return_counts=True)
    if self_retrieval:
        r_order, ref_counts = q_order, q_counts
    else:
        slot = torch.searchsorted(classes, ref_fine).clamp(max=classes.numel() - 1)
        key = torch.where(classes[slot] == ref_fine, slot, classes.numel())
        r_order = key.argsort(stable=True)
        ref_counts = torch.bincount(key, minlength=classes.numel() + 1)[:-1]
    ref_starts = ref_counts.cumsum(0) - ref_counts
    if self_retrieval:  # square blocks on the diagonal: a class never split, however small the tile
        tile = limit = max(tile, int(q_counts.max()))
    else:
        limit = max(tile, POSITIVE_RANGE)
    blocks = query_blocks(q_counts.tolist(), ref_starts.tolist(), (ref_starts + ref_counts).tolist(), tile, limit)
    class_of_query = torch.repeat_interleave(torch.arange(classes.numel()), q_counts)
    return q_order, r_order, ref_starts, ref_counts, class_of_query, blocks


def _read_thresholds(state: _State, rows: slice, tile_scores: torch.Tensor, first: torch.Tensor, count: torch.Tensor,
                     own_local: torch.Tensor) -> None:
    """The positives' scores of the block's queries, read from their positive tile, decreasing."""
    span = max(int(count.max()), 1)
    cols = first.unsqueeze(1) + torch.arange(span)
    valid = (torch.arange(span) < count.unsqueeze(1)) & (cols != own_local.unsqueeze(1))
    t = tile_scores.gather(1, cols.clamp(0, tile_scores.shape[1] - 1))
    t = t.masked_fill(~valid, float("-inf")).sort(dim=1, descending=True).values
    npos = valid.sum(dim=1)
    state.thresholds[rows, :span] = torch.where(torch.arange(span) < npos.unsqueeze(1), t, float("inf"))
    state.npos[rows] = npos


def _result(state: _State, q_order: torch.Tensor, r_order: torch.Tensor, own_sorted: torch.Tensor,
            own: torch.Tensor | None,
            width: int) -> TiledSearch:
    """Lists sorted, references and queries back in their original order, ranks = negatives + ``rank+``."""
    values, order = state.heap_values.sort(dim=1, descending=True)
    ids = state.heap_ids.gather(1, order)
    unfilled = ids < 0  # only a query with an excluded reference can leave one slot: that reference, at -inf
    if bool(unfilled.any()):
        if own is None or bool((unfilled & (own_sorted < 0).unsqueeze(1)).any()):
            raise RuntimeError("tiled_search: a top-k list was not filled; k exceeds a retrieval set")
        ids = torch.where(unfilled, own_sorted.unsqueeze(1), ids)
    ids = r_order[ids]
    valid = torch.arange(width) < state.npos.unsqueeze(1)
    t = state.thresholds.masked_fill(~valid, float("-inf"))
    ranks = state.counts + tie_ends(t) + 1  # + rank+ (t decreases, padding -inf last)
    back = torch.empty_like(q_order)
    back[q_order] = torch.arange(q_order.numel())
    return TiledSearch(values[back], ids[back], t[back], valid[back], ranks[back])
