"""α-weighted query expansion (αQE) and database-side augmentation (DBA).

Both replace a vector by the normalised, similarity-weighted sum of itself and its top-``k``
neighbours (Radenović et al., TPAMI 2018, "α-weighted query expansion"; the α-weighted DBA, ADBA,
of Revaud et al.'s dirtorch evaluation), found by the exact chunked search :func:`rankopt.metrics.topk.chunked_topk`
(bounded memory):

* αQE: ``q' = normalize(q + Σ_{i≤k} max(s_i, 0)^α g_i)`` over the query's top-``k`` gallery items
  ``g_i`` with similarities ``s_i``; a query's own item in the gallery (``exclude``) is never one.
* DBA: ``g' = normalize(g + Σ_{i≤k} max(s_i, 0)^α g_i)`` over the top-``k`` *other* gallery items
  (the item itself excluded by index).

Revaud et al. (ICCV 2019, §5 "Comparison with the state of the art") use αQE with ``α = 2`` and
``k = 10``: the defaults here. ``k = 0`` is the identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from rankopt.checks import check_embeddings
from rankopt.metrics.topk import chunked_topk
from rankopt.similarity import prepare

PAPER_K = 10
PAPER_ALPHA = 2.0
EXPANSION_SIMILARITIES = ("cosine", "dot")
SUM_CHUNK_ROWS = 4096


@dataclass(frozen=True)
class Expansion:
    """``k`` neighbours weighted by ``max(s, 0)^alpha``."""

    k: int = PAPER_K
    alpha: float = PAPER_ALPHA

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"expansion k must be >= 0, got {self.k}")
        if not self.alpha >= 0.0:
            raise ValueError(f"expansion alpha must be >= 0, got {self.alpha}")


def expand(vectors: torch.Tensor, candidates: torch.Tensor | None, expansion: Expansion, *,
           exclude: torch.Tensor | None = None, similarity: str = "cosine",
           chunk_size: int | None = None) -> torch.Tensor:
    """``normalize(v + Σ_{i≤k} max(s_i, 0)^α c_i)`` for each row ``v`` of ``vectors`` ``(Q, D)`` over its
    top-``k`` rows ``c_i`` of ``candidates`` ``(R, D)`` (``None``: ``vectors`` themselves, each row
    excluded from its own neighbours). ``exclude``: ``(Q,)`` int64, a candidate never used by each row
    (-1: none), as in :func:`chunked_topk`. Vectors are used as :func:`rankopt.similarity.prepare` gives
    them (unit norm for cosine); ``k = 0`` returns ``vectors`` unchanged."""
    if similarity not in EXPANSION_SIMILARITIES:
        raise ValueError(f"query expansion / DBA weight neighbours by max(s, 0)^alpha and need similarity "
                         f"{' or '.join(EXPANSION_SIMILARITIES)}, got {similarity!r}")
    check_embeddings(vectors, "embeddings to expand")
    if candidates is not None:
        check_embeddings(candidates, "expansion gallery")
        if candidates.shape[1] != vectors.shape[1]:
            raise ValueError(f"embeddings to expand have {vectors.shape[1]} dimensions, the gallery "
                             f"{candidates.shape[1]}")
    if expansion.k == 0:
        return vectors
    scores, neighbours = chunked_topk(vectors, candidates, expansion.k, similarity=similarity,
                                      chunk_size=chunk_size, exclude=exclude)
    weights = scores.clamp(min=0.0).pow(expansion.alpha).masked_fill(scores == float("-inf"), 0.0)
    base = prepare(vectors, similarity)
    pool = base if candidates is None else prepare(candidates, similarity)
    out = torch.empty_like(base)
    for start in range(0, base.shape[0], SUM_CHUNK_ROWS):
        rows = slice(start, start + SUM_CHUNK_ROWS)
        neighbour_sum = (weights[rows].unsqueeze(-1).to(base.dtype) * pool[neighbours[rows]]).sum(dim=1)
        out[rows] = F.normalize(base[rows] + neighbour_sum, dim=1)
    return out


def alpha_query_expansion(queries: torch.Tensor, gallery: torch.Tensor | None, expansion: Expansion, *,
                          exclude: torch.Tensor | None = None, similarity: str = "cosine",
                          chunk_size: int | None = None) -> torch.Tensor:
    """αQE: ``q' = normalize(q + Σ_{i≤k} max(s_i, 0)^α g_i)`` over the query's top-``k`` gallery items
    (``gallery=None``: the queries are the gallery and each is excluded from its own expansion)."""
    return expand(queries, gallery, expansion, exclude=exclude, similarity=similarity, chunk_size=chunk_size)


def database_augmentation(gallery: torch.Tensor, expansion: Expansion, *, similarity: str = "cosine",
                          chunk_size: int | None = None) -> torch.Tensor:
    """DBA: ``g' = normalize(g + Σ_{i≤k} max(s_i, 0)^α g_i)`` over the top-``k`` other gallery items."""
    return expand(gallery, None, expansion, similarity=similarity, chunk_size=chunk_size)


__all__ = ["PAPER_ALPHA", "PAPER_K", "Expansion", "alpha_query_expansion", "database_augmentation", "expand"]
