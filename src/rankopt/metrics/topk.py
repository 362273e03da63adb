"""Exact similarity search in query chunks (torch, CPU or CUDA) and an optional faiss backend.

The full ``Q x R`` score matrix is never materialised: queries are processed in
chunks whose ``chunk x R`` block fits a memory budget. A query's own item (the query
itself when the query set is the gallery, or its copy in a gallery that contains the
queries) is excluded **by index** (its score is set to ``-inf`` in the chunk), never
by dropping the first neighbour. :func:`ref_block_scores` also splits the reference set into
blocks, for reference sets larger than memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from tqdm.auto import tqdm

from rankopt.similarity import pairwise, prepare

CHUNK_BUDGET_BYTES = 256 * 2**20
FAISS_GPU_MAX_K = 2048


def default_chunk_size(num_refs: int, bytes_per_score: int = 4, budget: int = CHUNK_BUDGET_BYTES) -> int:
    """Number of query rows such that ``rows * num_refs * bytes_per_score <= budget`` (at least 1)."""
    return max(1, budget // max(1, num_refs * bytes_per_score))


def exclude_by_index(scores: torch.Tensor, columns: torch.Tensor) -> None:
    """Score ``-inf``, in place, the item ``columns[i]`` of each row ``i`` of ``scores`` ``(Q, C)`` (a
    column outside ``[0, C)``, e.g. ``-1``: nothing to exclude in this row), so it sorts after every real item."""
    columns = columns.to(scores.device)
    rows = ((columns >= 0) & (columns < scores.shape[1])).nonzero().squeeze(1)
    scores[rows, columns[rows]] = float("-inf")


def score_chunks(
    query: torch.Tensor,
    ref: torch.Tensor | None,
    *,
    similarity: str = "cosine",
    chunk_size: int,
    progress: bool = False,
    exclude: torch.Tensor | None = None,
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(start, scores)`` for consecutive query chunks; ``scores`` is ``(chunk, R)``.

    ``exclude``: ``(Q,)`` int64, the reference excluded from each query's results (``-1``:
    none); its score is ``-inf``, so it sorts after every real item. ``ref=None`` means the
    query set is the gallery, and ``exclude`` defaults to each query itself (``arange(Q)``).
    The reference set is prepared (L2-normalised for cosine) once; a separate query set is read and
    prepared chunk by chunk, so a memory-mapped ``query`` is never held whole in memory.
    """
    scores_of = chunk_scorer(query, ref, similarity=similarity, exclude=exclude)
    starts = range(0, query.shape[0], chunk_size)
    for start in tqdm(starts, disable=not progress, desc="evaluating", unit="chunk", leave=False):
        yield start, scores_of(start, start + chunk_size)


def chunk_scorer(
    query: torch.Tensor, ref: torch.Tensor | None, *, similarity: str = "cosine", exclude: torch.Tensor | None = None
) -> Callable[[int, int], torch.Tensor]:
    """``scores_of(start, stop)``: the ``(chunk, R)`` scores of the query rows ``[start, stop)``, as
    :func:`score_chunks` yields them (same ``ref=None`` and ``exclude``); safe to call from several threads."""
    r = prepare(query if ref is None else ref, similarity)
    if exclude is None and ref is None:
        exclude = torch.arange(r.shape[0], device=r.device)

    def scores_of(start: int, stop: int) -> torch.Tensor:
        block = r[start:stop] if ref is None else prepare(query[start:stop], similarity)
        scores = pairwise(block, r, similarity, prepared=True)
        if exclude is not None:
            exclude_by_index(scores, exclude[start:stop])
        return scores

    return scores_of


def ref_block_scores(
    query: torch.Tensor, ref: torch.Tensor, *, similarity: str, block_size: int, exclude: torch.Tensor | None = None
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(start, scores)`` for consecutive blocks of ``block_size`` reference rows; ``scores`` is ``(Q, block)``.

    ``query`` is already prepared; each block of ``ref`` (e.g. a memory-mapped tensor) is read,
    moved to ``query``'s device and dtype and prepared on its own, so the reference set is never
    held whole. ``exclude``: ``(Q,)`` int64, the reference excluded from each query's results
    (``-1``: none), scored ``-inf`` inside its block.
    """
    for start in range(0, ref.shape[0], block_size):
        block = prepare(ref[start : start + block_size].to(query.device, query.dtype), similarity)
        scores = pairwise(query, block, similarity, prepared=True)
        if exclude is not None:
            exclude_by_index(scores, exclude.to(scores.device) - start)
        yield start, scores


def merge_topk(
    values: torch.Tensor, indices: torch.Tensor, new_values: torch.Tensor, new_indices: torch.Tensor,
    k: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` of the union of two candidate lists (``k``: by default the width of ``values``; at most the
    union's)."""
    both_values = torch.cat([values, new_values], dim=1)
    best, pos = both_values.topk(min(k or values.shape[1], both_values.shape[1]), dim=1)
    return best, torch.cat([indices, new_indices], dim=1).gather(1, pos)


def chunked_topk(
    query: torch.Tensor,
    ref: torch.Tensor | None,
    k: int,
    *,
    similarity: str = "cosine",
    chunk_size: int | None = None,
    exclude: torch.Tensor | None = None,
    progress: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-``k`` ``(scores, indices)`` of each query among ``ref``, rows sorted by decreasing score.

    :func:`score_chunks` (bounded memory: ``chunk_size`` query rows at a time, by default as many
    as fit :data:`CHUNK_BUDGET_BYTES`) followed by a per-chunk ``topk``. ``ref=None`` and
    ``exclude`` are as in :func:`score_chunks`. ``k`` is at most ``R - 1`` when every query has an
    excluded item, so none is returned; otherwise at most ``R``, and a query's excluded item can only
    appear when ``k = R``, last, at ``-inf``. Ties keep ``torch.topk``'s order.
    """
    num_refs = query.shape[0] if ref is None else ref.shape[0]
    if exclude is None and ref is None:
        exclude = torch.arange(query.shape[0], device=query.device)
    every_query_excludes = exclude is not None and bool((exclude >= 0).all())
    k = min(k, num_refs - int(every_query_excludes))
    if k < 1:
        raise ValueError(f"top-k search needs k >= 1 and a non-empty gallery (k={k}, gallery of {num_refs})")
    dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    size = chunk_size or default_chunk_size(num_refs)
    if query.shape[0] <= size and query.dtype == dtype and (ref is None or ref.dtype == dtype):
        scores = chunk_scorer(query, ref, similarity=similarity, exclude=exclude)(0, query.shape[0])
        return scores.topk(k, dim=1)  # one chunk: no copy into preallocated rows
    values = torch.empty((query.shape[0], k), dtype=dtype, device=query.device)
    indices = torch.empty((query.shape[0], k), dtype=torch.long, device=query.device)
    for start, scores in score_chunks(query, ref, similarity=similarity, chunk_size=size, progress=progress,
                                      exclude=exclude):
        top, pos = scores.topk(k, dim=1)
        values[start : start + top.shape[0]], indices[start : start + top.shape[0]] = top, pos
    return values, indices


def self_topk(
    x: torch.Tensor, k: int, *, similarity: str = "cosine", block_size: int = 4096, progress: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-``k`` ``(scores, indices)`` of every row of the self-similarity matrix, self excluded by index.

    The matrix is symmetric, so each ``block x block`` tile of the upper triangle is computed
    once and serves the rows of both its blocks (half the work of :func:`score_chunks`).
    Rows are sorted by decreasing score; ``k`` is at most ``N - 1``.
    """
    x = prepare(x, similarity)
    num = x.shape[0]
    k = min(k, num - 1)
    values = torch.full((num, k), float("-inf"), dtype=x.dtype, device=x.device)
    indices = torch.zeros((num, k), dtype=torch.long, device=x.device)
    starts = list(range(0, num, block_size))
    for i, a in enumerate(tqdm(starts, disable=not progress, desc="evaluating", unit="block", leave=False)):
        rows = slice(a, min(a + block_size, num))
        for b in starts[i:]:
            cols = slice(b, min(b + block_size, num))
            tile = pairwise(x[rows], x[cols], similarity, prepared=True)
            if a == b:
                tile.fill_diagonal_(float("-inf"))
            col_ids = torch.arange(cols.start, cols.stop, device=x.device)
            top, pos = tile.topk(min(k, tile.shape[1]), dim=1)
            values[rows], indices[rows] = merge_topk(values[rows], indices[rows], top, col_ids[pos])
            if a != b:
                row_ids = torch.arange(rows.start, rows.stop, device=x.device)
                top, pos = tile.T.topk(min(k, tile.shape[0]), dim=1)
                values[cols], indices[cols] = merge_topk(values[cols], indices[cols], top, row_ids[pos])
    return values, indices


def faiss_input(x: torch.Tensor, similarity: str) -> np.ndarray:
    """The contiguous float32 CPU array faiss compares: :func:`rankopt.similarity.prepare` of ``x``
    (unit rows for cosine); searched with inner product, or L2 for ``neg_l2``."""
    return prepare(x.detach().float().cpu(), similarity).contiguous().numpy()


def faiss_scores(distances: np.ndarray, similarity: str) -> torch.Tensor:
    """rankopt scores from a faiss result: the inner products as they are; for ``neg_l2`` faiss's
    squared L2 distances ``d`` become ``-sqrt(d)``."""
    scores = torch.from_numpy(distances)
    return -scores.clamp(min=0).sqrt() if similarity == "neg_l2" else scores


def faiss_topk(
    query: torch.Tensor,
    ref: torch.Tensor | None,
    k: int,
    *,
    similarity: str = "cosine",
    use_gpu: bool = False,
    exclude: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-``k`` ``(scores, indices)`` with a faiss flat index, rows sorted by decreasing score.

    ``exclude``: ``(Q,)`` int64, the reference excluded from each query's results (``-1``:
    none); ``ref=None``: self-retrieval, each query excluded (``exclude = arange(Q)``). With
    an exclusion, ``k + 1`` neighbours are fetched, the excluded one is scored ``-inf`` and
    ``min(k, R - 1)`` columns are kept when every query has one, else ``min(k, R)``; a kept
    excluded neighbour (only when all ``R`` are fetched) is then last in its row, at ``-inf``.
    ``use_gpu`` (with a GPU build of faiss): faiss supports ``k <= 2048`` there; larger ``k``
    is refused with a clear error (the exact chunked torch search has no such limit).
    """
    try:
        import faiss  # noqa: PLC0415 - optional dependency, imported lazily
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("backend='faiss' needs faiss: pip install faiss-cpu (or faiss-gpu)") from err
    q = faiss_input(query, similarity)
    r = q if ref is None else faiss_input(ref, similarity)
    if exclude is None and ref is None:
        exclude = torch.arange(q.shape[0])
    fetch = min(k + (exclude is not None), r.shape[0])
    index = faiss.IndexFlatL2(r.shape[1]) if similarity == "neg_l2" else faiss.IndexFlatIP(r.shape[1])
    if use_gpu and hasattr(faiss, "index_cpu_to_all_gpus"):  # a GPU build of faiss
        if fetch > FAISS_GPU_MAX_K:
            raise ValueError(
                f"faiss on GPU supports k <= {FAISS_GPU_MAX_K}, but {fetch} neighbours are needed; "
                "use backend='torch' (exact, chunked) for this metric"
            )
        index = faiss.index_cpu_to_all_gpus(index)
    index.add(r)
    dist, idx = index.search(q, fetch)
    scores, indices = faiss_scores(dist, similarity), torch.from_numpy(idx).long()
    if exclude is not None:
        exclude = exclude.cpu()
        scores = scores.masked_fill(indices == exclude.unsqueeze(1), float("-inf"))
        scores, order = scores.topk(min(k, r.shape[0] - int(bool((exclude >= 0).all()))), dim=1)
        indices = indices.gather(1, order)
    return scores.to(query.device), indices.to(query.device)
