"""Label conventions and relevance levels.

Labels are ``(N, L)`` integer matrices: column 0 is the finest level (e.g. the
product or the species), the last column the coarsest (e.g. the super-class).
1-D labels are the one-level case ``L = 1``.

The *relevance level* of a retrieved item ``j`` for a query ``i`` is the number
of hierarchy levels they share, ``l_ij in {0, ..., L}``: ``L`` for the same fine
class, ``0`` for a negative. This is the ``l`` of TPAMI Eq. 20 (the set
``Omega^(l)``) and of the NDCG gains ``2^l - 1`` (TPAMI Eq. 23).
"""

from __future__ import annotations

import torch


def as_label_matrix(labels: torch.Tensor) -> torch.Tensor:
    """View 1-D labels as ``(N, 1)``; 2-D labels are returned as int64."""
    if labels.ndim == 1:
        labels = labels.unsqueeze(1)
    if labels.ndim != 2:
        raise ValueError(f"labels must have shape (N,) or (N, L), got {tuple(labels.shape)}")
    return labels.long()


def relevance_levels(query_labels: torch.Tensor, ref_labels: torch.Tensor) -> torch.Tensor:
    """Number of shared hierarchy levels, ``(Q, R)`` int64 in ``[0, L]``.

    For a consistent hierarchy (sharing a fine class implies sharing every
    coarser one) this is the level ``l`` of TPAMI Eq. 20.
    """
    q = as_label_matrix(query_labels)
    r = as_label_matrix(ref_labels)
    if q.shape[1] != r.shape[1]:
        raise ValueError(f"query labels have {q.shape[1]} levels but reference labels have {r.shape[1]}")
    return (q[:, None, :] == r[None, :, :]).sum(dim=2)


def same_class(query_labels: torch.Tensor, ref_labels: torch.Tensor) -> torch.Tensor:
    """Binary relevance at the finest level, ``(Q, R)`` bool."""
    q = as_label_matrix(query_labels)[:, 0]
    r = as_label_matrix(ref_labels)[:, 0]
    return q[:, None] == r[None, :]


def self_mask(num_queries: int, num_refs: int, query_offset: int = 0,
              device: torch.device | None = None) -> torch.Tensor:
    """``(Q, R)`` bool, True where reference ``j`` is query ``i`` itself.

    Query ``i`` is reference ``query_offset + i`` (the batch occupies a slice of
    the retrieval set). Self-exclusion is always by index, never by dropping the
    first neighbour, which breaks with duplicates and ties.
    """
    rows = torch.arange(num_queries, device=device)
    cols = rows + query_offset
    mask = torch.zeros(num_queries, num_refs, dtype=torch.bool, device=device)
    valid = cols < num_refs
    mask[rows[valid], cols[valid]] = True
    return mask
