"""Multistaged backpropagation (Revaud et al., ICCV 2019, §3.3 and Fig. 2): rank losses on batches larger than memory.

1. Embed every sub-batch without an autograd graph (saving the RNG state first).
2. Compute the loss on the full ``(B, D)`` embedding matrix and back-propagate it
   to the embeddings only (and to the loss's own parameters, e.g. proxies).
3. Re-embed each sub-batch WITH a graph, on the same augmented image tensors and
   with the RNG state replayed (dropout, stochastic depth draw the same masks), and
   call ``backward(dL/de[sub-batch])``, accumulating the parameter gradients.

Since the backbone is a per-sample function, ``dL/dθ = sum_b (de_b/dθ)^T dL/de_b``
is exactly the gradient of the plain large-batch step. This requires that the
forward of a sample does not depend on the rest of its batch: frozen BatchNorm
(every reference config) keeps the two passes consistent, whereas BatchNorm in
train mode normalises with sub-batch statistics (and updates its running
statistics twice), which breaks the equivalence.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch import Tensor, nn

LossFn = Callable[..., Tensor]


def _rng_state(device: torch.device) -> tuple[Tensor, Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple[Tensor, Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _no_sync(model: nn.Module, last: bool) -> contextlib.AbstractContextManager[None]:
    """DDP: all-reduce the gradients only on the last sub-batch's backward."""
    if not last and isinstance(model, nn.parallel.DistributedDataParallel):
        return model.no_sync()
    return contextlib.nullcontext()


def _autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[None]:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def multistage_step(
    model: nn.Module,
    images: Tensor,
    labels: Tensor,
    loss_fn: LossFn,
    sub_batch_size: int,
    *,
    ref_embeddings: Tensor | None = None,
    ref_labels: Tensor | None = None,
    autocast_dtype: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> tuple[Tensor, Tensor]:
    """One multistaged forward/backward (module docstring); gradients accumulate in ``.grad``.

    ``loss_fn(embeddings, labels[, ref_embeddings, ref_labels])`` sees the full
    batch. Under ``autocast_dtype`` the embeddings are cast to float32 before the
    loss. With ``scaler`` (fp16), the loss is scaled before its backward, so the
    parameter gradients come out scaled as with ``scaler.scale(loss).backward()``.
    The optimizer step is left to the caller. Returns the detached loss and the
    detached ``(B, D)`` embeddings (e.g. for a cross-batch memory).
    """
    if sub_batch_size < 1:
        raise ValueError(f"sub_batch_size must be >= 1, got {sub_batch_size}")
    if images.shape[0] == 0:
        raise ValueError("images is an empty batch")
    device, chunks = images.device, images.split(sub_batch_size)
    states, parts = [], []
    with torch.no_grad():
        for chunk in chunks:
            states.append(_rng_state(device))
            with _autocast(device, autocast_dtype):
                parts.append(model(chunk))
    embeddings = torch.cat(parts)
    if autocast_dtype is not None:
        embeddings = embeddings.float()
    embeddings.requires_grad_(True)
    if ref_embeddings is None:
        loss = loss_fn(embeddings, labels)
    else:
        loss = loss_fn(embeddings, labels, ref_embeddings, ref_labels)
    (scaler.scale(loss) if scaler is not None else loss).backward()
    after_loss = _rng_state(device)
    grad = embeddings.grad
    if grad is None:
        raise RuntimeError("the loss does not depend on the embeddings")
    grads = grad.split(sub_batch_size)
    for i, (chunk, state) in enumerate(zip(chunks, states)):
        _set_rng_state(state, device)
        with _no_sync(model, last=i == len(states) - 1):
            with _autocast(device, autocast_dtype):
                out = model(chunk)
            out.backward(grads[i].to(out.dtype))
    _set_rng_state(after_loss, device)
    return loss.detach(), embeddings.detach()
