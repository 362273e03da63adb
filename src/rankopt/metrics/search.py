"""Exact similarity search in query chunks (torch, CPU or CUDA) and an optional faiss backend.

The full ``Q x R`` score matrix is never materialised: queries are processed in
chunks whose ``chunk x R`` block fits a memory budget. When the query set is the
gallery, each query's own item is excluded **by index** (its score is set to
``-inf`` in the chunk), never by dropping the first neighbour.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from tqdm.auto import tqdm

from rankopt.similarity import pairwise, prepare

CHUNK_BUDGET_BYTES = 256 * 2**20
FAISS_GPU_MAX_K = 2048


def default_chunk_size(num_refs: int, bytes_per_score: int = 4, budget: int = CHUNK_BUDGET_BYTES) -> int:
    """Number of query rows such that ``rows * num_refs * bytes_per_score <= budget`` (at least 1)."""
    return max(1, budget // max(1, num_refs * bytes_per_score))


def score_chunks(
    query: torch.Tensor,
    ref: torch.Tensor | None,
    *,
    similarity: str = "cosine",
    chunk_size: int,
    progress: bool = False,
) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(start, scores)`` for consecutive query chunks; ``scores`` is ``(chunk, R)``.

    ``ref=None`` means the query set is the gallery: the score of query ``start + i``
    with itself (reference ``start + i``) is ``-inf``, so it sorts after every real item.
    """
    q = prepare(query, similarity)
    r = q if ref is None else prepare(ref, similarity)
    starts = range(0, q.shape[0], chunk_size)
    for start in tqdm(starts, disable=not progress, desc="evaluating", unit="chunk", leave=False):
        scores = pairwise(q[start : start + chunk_size], r, similarity, prepared=True)
        if ref is None:
            scores.diagonal(offset=start).fill_(float("-inf"))
        yield start, scores


def _merge_topk(values: torch.Tensor, indices: torch.Tensor, new_values: torch.Tensor, new_indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-``k`` of the union of two candidate lists (``k`` = the width of ``values``)."""
    k = values.shape[1]
    both_values = torch.cat([values, new_values], dim=1)
    best, pos = both_values.topk(k, dim=1)
    return best, torch.cat([indices, new_indices], dim=1).gather(1, pos)


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
            values[rows], indices[rows] = _merge_topk(values[rows], indices[rows], top, col_ids[pos])
            if a != b:
                row_ids = torch.arange(rows.start, rows.stop, device=x.device)
                top, pos = tile.T.topk(min(k, tile.shape[0]), dim=1)
                values[cols], indices[cols] = _merge_topk(values[cols], indices[cols], top, row_ids[pos])
    return values, indices


def faiss_topk(
    query: torch.Tensor,
    ref: torch.Tensor | None,
    k: int,
    *,
    similarity: str = "cosine",
    use_gpu: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-``k`` ``(scores, indices)`` with a faiss flat index, rows sorted by decreasing score.

    ``ref=None``: self-retrieval; ``k + 1`` neighbours are fetched and the query's own
    index is removed (or the last neighbour when the query is not among them).
    ``use_gpu`` (with a GPU build of faiss): faiss supports ``k <= 2048`` there; larger ``k``
    is refused with a clear error (the exact chunked torch search has no such limit).
    """
    try:
        import faiss  # noqa: PLC0415 - optional dependency, imported lazily
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("backend='faiss' needs faiss: pip install faiss-cpu (or faiss-gpu)") from err
    q = prepare(query, similarity).detach().float().cpu().contiguous()
    r = q if ref is None else prepare(ref, similarity).detach().float().cpu().contiguous()
    fetch = min(k + (ref is None), r.shape[0])
    index = faiss.IndexFlatL2(r.shape[1]) if similarity == "neg_l2" else faiss.IndexFlatIP(r.shape[1])
    if use_gpu and hasattr(faiss, "index_cpu_to_all_gpus"):  # a GPU build of faiss
        if fetch > FAISS_GPU_MAX_K:
            raise ValueError(
                f"faiss on GPU supports k <= {FAISS_GPU_MAX_K}, but {fetch} neighbours are needed; "
                "use backend='torch' (exact, chunked) for this metric"
            )
        index = faiss.index_cpu_to_all_gpus(index)
    index.add(r.numpy())
    dist, idx = index.search(q.numpy(), fetch)
    scores = torch.from_numpy(dist)
    scores = -scores.clamp(min=0).sqrt() if similarity == "neg_l2" else scores
    indices = torch.from_numpy(idx).long()
    if ref is None:
        own = indices == torch.arange(q.shape[0]).unsqueeze(1)
        scores = scores.masked_fill(own, float("-inf"))
        scores, order = scores.topk(fetch - 1, dim=1)
        indices = indices.gather(1, order)
    return scores.to(query.device), indices.to(query.device)
