"""torchrun-launched DDP: process-group setup, gathers with and without gradients, the global-batch loss.

Rank losses are listwise, so each rank's queries must be ranked against the
GLOBAL batch. :class:`DistributedLoss` all-gathers embeddings (with gradients
flowing back to their owners, :func:`all_gather_with_grad`) and labels, and ranks
the local queries against the local batch plus the other ranks' items.
:func:`gather_for_evaluation` collects uneven per-rank evaluation outputs so that
every item is seen exactly once.

Every function is the identity / a no-op when torch.distributed is not initialised
(one process), so the same code runs on one CPU and on many GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rankopt.checks import check_labels
from rankopt.labels import relevance_levels, same_class, self_mask

QUERY_COUNTING = ("finest", "any_level", "all")


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: ``rank`` of ``world_size``, ``local_rank`` on its node, ``backend`` (None: one
    process)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def is_initialized() -> bool:
    """Whether a torch.distributed process group is up."""
    return dist.is_available() and dist.is_initialized()


def world_size() -> int:
    return dist.get_world_size() if is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if is_initialized() else 0


def is_main_process() -> bool:
    return rank() == 0


def barrier() -> None:
    """Wait for every rank (no-op in one process)."""
    if is_initialized():
        dist.barrier()


def init_distributed(backend: str | None = None) -> DistInfo:
    """Initialise the process group from torchrun's ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_*`` variables.

    ``backend`` defaults to ``nccl`` when CUDA is available (the process then uses
    ``cuda:LOCAL_RANK``) and ``gloo`` otherwise. Without those variables, or with
    ``WORLD_SIZE=1``, nothing is initialised and a one-process ``DistInfo`` is returned.
    Calling it again returns the existing group's info.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, str(dist.get_backend()))
    size = int(os.environ.get("WORLD_SIZE", 1))
    if size <= 1 or "RANK" not in os.environ:
        return DistInfo()
    missing = [k for k in ("MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"WORLD_SIZE={size} but {', '.join(missing)} is not set; launch with torchrun")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend=backend, init_method="env://")
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, backend)


def all_gather_uneven(x: Tensor) -> tuple[Tensor, list[int]]:
    """Concatenate ``x`` (``(n_r, ...)``, ``n_r`` may differ per rank) from all ranks in rank order; no gradient.

    Pads every rank's tensor to the largest ``n_r`` for the collective and strips
    the padding afterwards. Returns the ``(sum_r n_r, ...)`` tensor and the sizes.
    """
    if not is_initialized():
        return x.detach(), [x.shape[0]]
    x = x.detach().contiguous()
    size = torch.tensor([x.shape[0]], device=x.device, dtype=torch.long)
    sizes_t = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes_t, size)
    sizes = [int(s) for s in sizes_t]
    padded = x.new_zeros((max(sizes), *x.shape[1:]))
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([part[:n] for part, n in zip(parts, sizes)]), sizes


class _AllGatherWithGrad(torch.autograd.Function):
    """Forward: uneven all-gather. Backward: all-reduce (sum) the output gradient and keep this rank's slice.

    Rank ``s``'s slice receives ``sum_r dL_r / dx_s`` — the gradient of every rank's
    loss w.r.t. the items it owns. gloo has no reduce-scatter, so a sum all-reduce
    of the (small, ``(N, D)``) gradient is used on every backend.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:  # type: ignore[override]
        gathered, sizes = all_gather_uneven(x)
        ctx.start = sum(sizes[: dist.get_rank()])
        ctx.size = x.shape[0]
        return gathered

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:  # type: ignore[override]
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.start : ctx.start + ctx.size]


def all_gather_with_grad(x: Tensor) -> Tensor:
    """All-gather ``(n_r, D)`` tensors of possibly different ``n_r`` with gradients back to their owners.

    A custom autograd function rather than ``torch.distributed.nn.functional.all_gather``:
    the latter needs equal sizes on every rank, and samplers/last batches do not
    guarantee that. Identity in one process.
    """
    if not is_initialized():
        return x
    return _AllGatherWithGrad.apply(x)


def reduce_mean(value: Tensor) -> Tensor:
    """Mean of a (detached) tensor over ranks, e.g. :class:`DistributedLoss` values for logging."""
    value = value.detach().clone()
    if is_initialized():
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= dist.get_world_size()
    return value


def average_gradients(parameters: Iterable[nn.Parameter]) -> None:
    """All-reduce-mean the ``.grad`` of parameters that DDP does not manage (a loss's proxies).

    With :class:`DistributedLoss` scaling, the mean over ranks of these local
    gradients is the one-process gradient, as DDP does for the model.
    """
    if not is_initialized():
        return
    size = dist.get_world_size()
    for p in parameters:
        if p.grad is None:  # every rank must join every all-reduce
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
        p.grad /= size


def _counted_queries(labels: Tensor, retrieval_labels: Tensor, counting: str) -> int:
    """How many queries (item ``i`` of the retrieval set ``retrieval_labels``) enter the loss's mean."""
    if counting == "all":
        return labels.shape[0]
    relevant = (same_class(labels, retrieval_labels) if counting == "finest"
                else relevance_levels(labels, retrieval_labels) > 0)
    relevant &= ~self_mask(labels.shape[0], retrieval_labels.shape[0], device=labels.device)
    return int(relevant.any(dim=1).sum())


class DistributedLoss(nn.Module):
    """Local queries against the global batch, scaled so that DDP reproduces the one-process loss and gradients.

    On rank ``r`` with ``n_r`` local items, the wrapped loss receives the local batch
    as ``embeddings`` and, as ``ref_embeddings``, the other ranks' items (gathered
    with gradients) followed by any extra reference set (a memory bank). Its value,
    the mean of the per-query terms of the ``q_r`` local queries that count, is
    returned multiplied by ``W q_r / Q`` (``W`` ranks, ``Q = sum_r q_r``). Hence
    ``sum_r loss_r = W L`` and, since DDP averages gradients over ranks and the
    gather's backward sums every rank's gradient into the owner, the parameter
    gradients equal those of ``L``, the loss of one process on the global batch;
    :func:`reduce_mean` of the returned value equals ``L``.

    Exact equality holds when (1) the loss is a mean over queries of per-query terms
    that depend only on that query's scores against its retrieval set (every
    listwise rank loss; not losses averaged over pairs or batch statistics), and is
    invariant to the order of the retrieval set (true for pessimistic tie handling);
    (2) ``counting`` names the queries the loss averages over: ``"finest"``
    (another item of the same finest class: binary AP/recall losses), ``"any_level"``
    (another item sharing any level: H-AP, NDCG), ``"all"`` (every query: proxy
    losses); by default ``"any_level"`` for losses with ``hierarchical = True``, else
    ``"finest"`` (the rule of :class:`rankopt.losses.RankLoss`); (3) the model has no cross-sample batch statistics
    (frozen BN). Losses with ``accepts_reference = False`` (proxies) are computed on the local
    batch only and scaled with ``counting="all"``. The loss's own parameters are
    not managed by DDP: call :func:`average_gradients` on them after backward.
    """

    def __init__(self, loss: nn.Module, counting: str | None = None) -> None:
        super().__init__()
        if counting is None:
            counting = "any_level" if getattr(loss, "hierarchical", False) else "finest"
        if counting not in QUERY_COUNTING:
            raise ValueError(f"unknown counting {counting!r}; use one of {', '.join(QUERY_COUNTING)}")
        self.loss = loss
        self.counting = counting
        self.accepts_reference = bool(getattr(loss, "accepts_reference", False))

    def forward(
        self, embeddings: Tensor, labels: Tensor, ref_embeddings: Tensor | None = None, ref_labels: Tensor | None = None
    ) -> Tensor:
        if not is_initialized() or dist.get_world_size() == 1:
            return self._call(embeddings, labels, ref_embeddings, ref_labels)
        labels = check_labels(labels, embeddings.shape[0])
        if not self.accepts_reference:
            if ref_embeddings is not None:
                raise TypeError(f"{type(self.loss).__name__} does not accept a reference set (accepts_reference is "
                                "False)")
            local, zero = self.loss(embeddings, labels), embeddings.sum() * 0
            q_local = labels.shape[0]
        else:
            gathered = all_gather_with_grad(embeddings)
            all_labels, sizes = all_gather_uneven(labels)
            start, end = sum(sizes[: dist.get_rank()]), sum(sizes[: dist.get_rank() + 1])
            others = torch.cat([gathered[:start], gathered[end:]])
            other_labels = torch.cat([all_labels[:start], all_labels[end:]])
            if ref_embeddings is not None:
                if ref_labels is None:
                    raise ValueError("ref_labels must be given with ref_embeddings")
                others = torch.cat([others, ref_embeddings.to(others.dtype)])
                other_labels = torch.cat([other_labels,
                                          check_labels(ref_labels, ref_embeddings.shape[0], "ref_labels")])
            local = self._call(embeddings, labels, others,
                               other_labels) if others.shape[0] else self._call(embeddings, labels)
            zero = gathered.sum() * 0  # keeps every rank on the gather's backward (a collective)
            q_local = _counted_queries(labels, torch.cat([labels, other_labels]), self.counting)
        q_total = torch.tensor(float(q_local), device=embeddings.device)
        dist.all_reduce(q_total, op=dist.ReduceOp.SUM)
        if q_local == 0:
            return zero
        return local * (dist.get_world_size() * q_local / float(q_total)) + zero

    def _call(self, embeddings: Tensor, labels: Tensor, ref_embeddings: Tensor | None,
              ref_labels: Tensor | None = None) -> Tensor:
        if ref_embeddings is None:
            return self.loss(embeddings, labels)
        return self.loss(embeddings, labels, ref_embeddings, ref_labels)


def gather_for_evaluation(tensor: Tensor, indices: Tensor | None = None) -> Tensor:
    """Every rank's evaluation outputs, each item exactly once.

    ``tensor`` is ``(n_r, ...)`` on rank ``r`` (sizes may differ). Without
    ``indices`` the result is the rank-order concatenation. With ``indices``
    (``(n_r,)`` dataset indices of the rows), the rows are returned in dataset
    order and items that a padding sampler gave to several ranks appear once.
    """
    gathered, _ = all_gather_uneven(tensor)
    if indices is None:
        return gathered
    if indices.shape[0] != tensor.shape[0]:
        raise ValueError(f"indices has {indices.shape[0]} entries but tensor has {tensor.shape[0]} rows")
    all_indices, _ = all_gather_uneven(indices.to(tensor.device))
    order = torch.argsort(all_indices, stable=True)
    sorted_idx = all_indices[order]
    first = torch.ones_like(sorted_idx, dtype=torch.bool)
    first[1:] = sorted_idx[1:] != sorted_idx[:-1]
    return gathered[order[first]]
