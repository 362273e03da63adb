"""Cross-batch memory (XBM, Wang et al. 2020) for every loss that accepts a reference set.

A ring buffer of detached embeddings, their labels and their dataset indices,
stored as registered buffers (so ``state_dict()`` carries it into checkpoints).
The training loss becomes

    ``L = L_batch + weight * L_mem``,

``L_batch = loss(e, y)`` (batch queries against the batch) and
``L_mem = loss(e, y, ref_embeddings=M, ref_labels=y_M)`` (batch queries against the
batch plus the memory ``M``), once the memory is active (``step >= warmup_steps``).
``M`` never holds a stale copy of a current batch item: memory entries whose
dataset index is in the batch are left out of the reference set.

Call order per step: ``loss_with_memory`` (reads the memory), backward, then
``enqueue`` of the batch (research-xbm and PML issue #24 order; ROADMAP/SupRank
enqueue before reading, so their queries meet detached copies of themselves,
anchors §0.1). ``enqueue`` also runs during the warm-up, so the memory is full
when it becomes active (research-xbm starts filling only then).

Under DDP, ``enqueue`` and the index exclusion use the all-gathered global
batch (rank order), so every rank holds the same memory; wrap the loss in
:class:`rankopt.engine.distributed.DistributedLoss` so that the memory term is
also scaled to the one-process value.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from rankopt.checks import check_embeddings, check_labels
from rankopt.engine.distributed import all_gather_uneven
from rankopt.losses import terms

LossFn = Callable[..., Tensor]


class CrossBatchMemory(nn.Module):
    """Ring buffer of ``size`` embeddings ``(size, embedding_dim)``, labels ``(size, num_levels)`` and indices."""

    embeddings: Tensor
    labels: Tensor
    indices: Tensor
    ptr: Tensor
    filled: Tensor

    def __init__(
        self, size: int, embedding_dim: int, num_levels: int = 1, warmup_steps: int = 0, weight: float = 1.0
    ) -> None:
        super().__init__()
        for name, value in (("size", size), ("embedding_dim", embedding_dim), ("num_levels", num_levels)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {warmup_steps}")
        if weight < 0:
            raise ValueError(f"weight must be >= 0, got {weight}")
        self.size, self.warmup_steps, self.weight = size, warmup_steps, weight
        self.register_buffer("embeddings", torch.zeros(size, embedding_dim))
        self.register_buffer("labels", torch.full((size, num_levels), -1, dtype=torch.long))
        self.register_buffer("indices", torch.full((size,), -1, dtype=torch.long))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))
        self.register_buffer("filled", torch.zeros((), dtype=torch.long))

    def __len__(self) -> int:
        return int(self.filled)

    def active(self, step: int) -> bool:
        """Whether the memory term is used at training step ``step`` (``step >= warmup_steps``)."""
        return step >= self.warmup_steps

    def _slots(self) -> Tensor:
        """Occupied slots, oldest first."""
        n = int(self.filled)
        start = int(self.ptr) if n == self.size else 0
        return (start + torch.arange(n, device=self.indices.device)) % self.size

    def contents(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(embeddings, labels, indices)`` of every stored entry, oldest first."""
        slots = self._slots()
        return self.embeddings[slots], self.labels[slots], self.indices[slots]

    def reference_for(self, batch_indices: Tensor) -> tuple[Tensor, Tensor]:
        """Memory entries as a reference set, without the entries holding any of ``batch_indices``."""
        embeddings, labels, indices = self.contents()
        keep = ~torch.isin(indices, batch_indices.to(indices.device))
        return embeddings[keep], labels[keep]

    @torch.no_grad()
    def enqueue(self, embeddings: Tensor, labels: Tensor, indices: Tensor) -> None:
        """Write the (detached) batch into the ring, overwriting the oldest entries.

        Under DDP the global batch is gathered first, so all ranks stay identical.
        When more than ``size`` items arrive, only the last ``size`` are kept.
        """
        check_embeddings(embeddings, "embeddings")
        labels = check_labels(labels, embeddings.shape[0])
        if embeddings.shape[1] != self.embeddings.shape[1] or labels.shape[1] != self.labels.shape[1]:
            raise ValueError(
                f"memory holds {self.embeddings.shape[1]}-d embeddings and {self.labels.shape[1]} label levels; "
                f"got {embeddings.shape[1]}-d and {labels.shape[1]}"
            )
        if indices.shape != (embeddings.shape[0],):
            raise ValueError(f"indices must have shape ({embeddings.shape[0]},), got {tuple(indices.shape)}")
        embeddings, labels, indices = (all_gather_uneven(t)[0][-self.size :] for t in (embeddings, labels, indices))
        n = embeddings.shape[0]
        slots = (int(self.ptr) + torch.arange(n, device=self.indices.device)) % self.size
        self.embeddings[slots] = embeddings.to(self.embeddings)
        self.labels[slots] = labels.to(self.labels.device)
        self.indices[slots] = indices.to(self.indices)
        self.ptr.fill_((int(self.ptr) + n) % self.size)
        self.filled.fill_(min(int(self.filled) + n, self.size))

    def loss_with_memory(
        self, loss_fn: LossFn, embeddings: Tensor, labels: Tensor, indices: Tensor, step: int
    ) -> Tensor:
        """``L_batch + weight * L_mem`` (module docstring); ``L_batch`` alone during the warm-up or while empty.

        The unweighted terms are recorded as ``batch`` and ``memory`` (``rankopt.losses.terms``), a
        composite loss's own terms under ``batch/`` and ``memory/``. Does not enqueue: call
        :meth:`enqueue` after the loss. ``loss_fn`` must have
        ``accepts_reference = True``.
        """
        if not getattr(loss_fn, "accepts_reference", False):
            raise TypeError(
                f"{type(loss_fn).__name__} does not accept a reference set (accepts_reference is False), "
                "so it cannot be used with a cross-batch memory"
            )
        with terms.scope("batch"):
            loss = loss_fn(embeddings, labels)
        terms.record("batch", loss)
        if not self.active(step) or self.weight == 0 or int(self.filled) == 0:
            return loss
        ref_embeddings, ref_labels = self.reference_for(all_gather_uneven(indices)[0])
        if ref_embeddings.shape[0] == 0:
            return loss
        with terms.scope("memory"):
            memory = loss_fn(embeddings, labels, ref_embeddings.to(embeddings.dtype), ref_labels)
        terms.record("memory", memory)
        return loss + self.weight * memory
