"""Checks of :func:`rankopt.metrics.evaluate`'s arguments: each bad input raises an error naming it."""

from __future__ import annotations

import torch

from rankopt import kernels
from rankopt.checks import check_embeddings, check_labels
from rankopt.rank.relevance_input import Relevance


def check_inputs(
    query_embeddings: torch.Tensor, query_labels: torch.Tensor, ref_embeddings: torch.Tensor | None,
    ref_labels: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(query, query_labels (Q, L), ref, ref_labels (R, L))`` checked; ``ref_embeddings=None``: the query set
    twice."""
    query = check_embeddings(query_embeddings, "query_embeddings")
    q_labels = check_labels(query_labels, query.shape[0], "query_labels")
    if ref_embeddings is None:
        if ref_labels is not None:
            raise ValueError("ref_labels given without ref_embeddings")
        if query.shape[0] < 2:
            raise ValueError("query_embeddings has 1 row: with the query set as gallery, each query needs another item")
        return query, q_labels, query, q_labels
    if ref_labels is None:
        raise ValueError("ref_embeddings given without ref_labels")
    ref = check_embeddings(ref_embeddings, "ref_embeddings")
    r_labels = check_labels(ref_labels, ref.shape[0], "ref_labels")
    if ref.shape[1] != query.shape[1]:
        raise ValueError(f"query_embeddings have {query.shape[1]} dimensions but ref_embeddings have {ref.shape[1]}")
    if r_labels.shape[1] != q_labels.shape[1]:
        raise ValueError(f"query_labels have {q_labels.shape[1]} levels but ref_labels have {r_labels.shape[1]}")
    return query, q_labels, ref, r_labels


def check_query_ref_index(index: object, num_queries: int, num_refs: int, self_retrieval: bool) -> torch.Tensor:
    """``query_ref_index`` as ``(Q,)`` int64, checked: shape, integer dtype, values in ``[-1, R)``."""
    if self_retrieval:
        raise ValueError("query_ref_index needs ref_embeddings: with ref_embeddings=None each query is already "
                         "excluded from its own results")
    if not isinstance(index, torch.Tensor):
        raise TypeError(f"query_ref_index must be a torch.Tensor, got {type(index).__name__}")
    if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
        raise TypeError(f"query_ref_index must be an integer tensor (int64), got {index.dtype}")
    if tuple(index.shape) != (num_queries,):
        raise ValueError(f"query_ref_index must have shape ({num_queries},) (one entry per query), got "
                         f"{tuple(index.shape)}")
    index = index.long()
    bad = ((index < -1) | (index >= num_refs)).nonzero().squeeze(1)
    if bad.numel():
        rows = ", ".join(str(i) for i in bad[:5].tolist()) + (", ..." if bad.numel() > 5 else "")
        raise ValueError(
            f"query_ref_index must lie in [-1, {num_refs - 1}] (-1: no copy in the gallery); {bad.numel()} entries do "
            f"not, at queries {rows}"
        )
    if num_refs == 1 and bool((index >= 0).any()):
        raise ValueError("the gallery has 1 item and query_ref_index excludes it: some queries would have no item to "
                         "retrieve")
    return index


def check_groups(groups: object, num_items: int, name: str) -> torch.Tensor:
    """``groups`` as ``(N,)`` int64, checked: a tensor of integers, one per item (negative: no group)."""
    if not isinstance(groups, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(groups).__name__}")
    if groups.dtype.is_floating_point or groups.dtype.is_complex or groups.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor (int64), got {groups.dtype}")
    if tuple(groups.shape) != (num_items,):
        raise ValueError(f"{name} must have shape ({num_items},) (one group id per item, -1: none), got "
                         f"{tuple(groups.shape)}")
    return groups.long()


def check_exclusion_groups(
    query_groups: object, ref_groups: object, num_queries: int, num_refs: int, self_retrieval: bool
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(query_groups, ref_groups)`` checked (self-retrieval: the query groups twice), or ``None``."""
    if query_groups is None and ref_groups is None:
        return None
    if self_retrieval:
        if ref_groups is not None:
            raise ValueError("ref_groups needs ref_embeddings: with ref_embeddings=None, query_groups are the items' "
                             "groups")
        groups = check_groups(query_groups, num_queries, "query_groups")
        return groups, groups
    if query_groups is None or ref_groups is None:
        raise ValueError("with ref_embeddings, give query_groups and ref_groups together (one group id per query and "
                         "per reference)")
    return check_groups(query_groups, num_queries, "query_groups"), check_groups(ref_groups, num_refs, "ref_groups")


def check_ref_block_size(ref_block_size: int, hierarchical: list[str], backend: str) -> None:
    """``ref_block_size`` serves the torch backend's top-k metrics, ``map`` and ``mrr`` (``hierarchical``: the names of
    the requested hierarchical metrics, refused)."""
    if ref_block_size < 1:
        raise ValueError(f"ref_block_size must be >= 1, got {ref_block_size}")
    if backend != "torch":
        raise ValueError("ref_block_size needs backend='torch' (faiss holds the whole gallery in its index)")
    if hierarchical:
        raise ValueError(f"metrics {hierarchical} need whole rows; evaluate without ref_block_size (--ref-block-size)")


def check_relevance_inputs(
    query_embeddings: torch.Tensor, query_labels: object, ref_embeddings: torch.Tensor | None, ref_labels: object,
    relevance: object, *, method: str, backend: str, ref_block_size: int | None,
) -> tuple[torch.Tensor, torch.Tensor, Relevance]:
    """``(query, ref, relevance)`` checked for ``evaluate(..., relevance=...)``: no labels beside it, a
    :class:`Relevance` of ``Q x R`` (``Q x Q`` in self-retrieval), the chunked torch path only."""
    if not isinstance(relevance, Relevance):
        raise TypeError(f"relevance must be a rankopt.rank.Relevance (Relevance.multilabel, .matrix, .function, "
                        f".labels), got {type(relevance).__name__}")
    if query_labels is not None or ref_labels is not None:
        raise ValueError("give either labels or relevance=...: pass query_labels=None (and no ref_labels) with it")
    query = check_embeddings(query_embeddings, "query_embeddings")
    ref = query if ref_embeddings is None else check_embeddings(ref_embeddings, "ref_embeddings")
    if ref.shape[1] != query.shape[1]:
        raise ValueError(f"query_embeddings have {query.shape[1]} dimensions but ref_embeddings have {ref.shape[1]}")
    if ref_embeddings is None and query.shape[0] < 2:
        raise ValueError("query_embeddings has 1 row: with the query set as gallery, each query needs another item")
    relevance.check_shape(query.shape[0], ref.shape[0], "the queries x the gallery (query_embeddings x "
                          + ("query_embeddings)" if ref_embeddings is None else "ref_embeddings)"))
    refused = [why for bad, why in ((kernels.check(method) == "compiled", f"method={method!r} (use 'auto' or 'reference')"),
                                    (backend != "torch", f"backend={backend!r}"),
                                    (ref_block_size is not None, "ref_block_size")) if bad]
    if refused:
        raise ValueError(f"relevance=... is evaluated by the exact chunked torch path only; remove {', '.join(refused)}")
    return query, ref, relevance
