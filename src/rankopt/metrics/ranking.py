"""Pessimistic ranks from ranked lists, and positive-class bookkeeping.

Tie convention (everywhere in rankopt): an item is ranked after every *other*
item of the retrieval set with an equal or higher score,

    rank(j) = 1 + #{k != j in Omega : s_k >= s_j}.

A ranked list is a row of scores sorted in decreasing order (a full sort, or the
top-``K`` of a row). Inside a group of tied scores every item gets the rank of the
group's last position, so the order of tied items never matters.
"""

from __future__ import annotations

import numpy as np
import torch

BEYOND = 2**62  # rank of an item whose exact rank lies beyond a truncated list


def tie_ends(values: torch.Tensor) -> torch.Tensor:
    """``(Q, K)`` int64: for rows sorted in decreasing order, the last position tied with each position
    (``#{k : s_k >= s_j} - 1``, a binary search in the negated, increasing row)."""
    negated = values.neg()
    return torch.searchsorted(negated, negated, right=True) - 1


def list_ranks(values: torch.Tensor, complete: bool) -> torch.Tensor:
    """Pessimistic 1-based ranks ``(Q, K)`` int64 of the items of ranked lists.

    ``complete=False`` means the lists are the top-``K`` of longer rows: items tied with
    the last item may have equal scores outside the list, so their rank (``>= K``) is
    unknown and set to :data:`BEYOND`. Ask for one more item than the deepest cut-off.
    """
    ranks = tie_ends(values) + 1
    if not complete:
        ranks = ranks.masked_fill(values <= values[:, -1:], BEYOND)
    return ranks


def count_at_least(scores: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """``(Q, P)`` int64: ``#{k : s_k >= t_p}`` per row, without sorting the ``(Q, R)`` scores.

    One vectorised pass over the chunk per threshold column (``P`` is the number of
    positives of the largest class in the chunk; callers switch to a sort when it is large).
    The comparison writes 0/1 floats into one reused buffer (faster on CPU than reducing a bool
    tensor; measured: benchmarks/results/metrics.md); float sums of 0/1 are exact below 2^24 (float32) items.
    """
    dtype = torch.float32 if scores.shape[1] < 2**24 else torch.float64
    buffer = torch.empty(scores.shape, dtype=dtype, device=scores.device)
    out = torch.empty(thresholds.shape, dtype=torch.int64, device=scores.device)
    for p in range(thresholds.shape[1]):
        torch.ge(scores, thresholds[:, p : p + 1], out=buffer)
        out[:, p] = buffer.sum(dim=1).long()
    return out


def sorted_rows(x: torch.Tensor) -> torch.Tensor:
    """Each row of ``(Q, R)`` ``x`` in increasing order, values only (numpy's vectorised sort on CPU,
    faster than ``torch.sort`` there; measured: benchmarks/results/metrics.md)."""
    if x.device.type != "cpu":
        return x.sort(dim=1).values
    return torch.from_numpy(np.sort(x.detach().numpy(), axis=1))


def count_below(ascending: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``(Q, P)`` int64: ``#{k : ascending[q, k] < t[q, p]}`` for rows sorted increasingly."""
    if ascending.device.type != "cpu":
        return torch.searchsorted(ascending, t.contiguous())
    a, v = ascending.numpy(), t.detach().numpy()
    return torch.from_numpy(np.stack([np.searchsorted(a[q], v[q]) for q in range(a.shape[0])]).reshape(v.shape))


class ClassIndex:
    """Members of each finest-level class of the retrieval set, for positives lookups in ``O(Q P)``."""

    def __init__(self, ref_fine: torch.Tensor) -> None:
        sorted_labels, self.order = ref_fine.sort(stable=True)
        self.classes, counts = torch.unique_consecutive(sorted_labels, return_counts=True)
        self.offsets = counts.cumsum(0) - counts
        self.counts = counts
        self.num_refs = ref_fine.numel()

    def class_counts(self, query_fine: torch.Tensor) -> torch.Tensor:
        """Number of references sharing each query's finest label (0 when absent)."""
        pos = torch.searchsorted(self.classes, query_fine.contiguous()).clamp(max=self.classes.numel() - 1)
        found = self.classes[pos] == query_fine
        return torch.where(found, self.counts[pos], 0)

    def members(self, query_fine: torch.Tensor, query_index: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(idx, valid)``, both ``(Q, P)``: the positives' reference indices of each query.

        ``query_index``: ``(Q,)``, each query's own reference (self-retrieval, or its copy in the
        gallery; ``-1``: none), marked as not valid.
        """
        pos = torch.searchsorted(self.classes, query_fine.contiguous()).clamp(max=self.classes.numel() - 1)
        count = self.class_counts(query_fine)
        width = max(int(count.max()), 1)
        slot = torch.arange(width, device=query_fine.device)
        valid = slot < count.unsqueeze(1)
        flat = (self.offsets[pos].unsqueeze(1) + slot).clamp(max=self.num_refs - 1)
        idx = self.order[flat]
        if query_index is not None:
            valid &= idx != query_index.unsqueeze(1)
        return idx, valid
