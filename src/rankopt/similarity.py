"""Similarities between query and reference embeddings (higher = more similar)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

SIMILARITIES = ("cosine", "dot", "neg_l2")


def prepare(x: torch.Tensor, kind: str) -> torch.Tensor:
    """Pre-process embeddings once (L2-normalise for cosine) so blocks can use :func:`pairwise`."""
    if kind == "cosine":
        return F.normalize(x, dim=-1)
    if kind in ("dot", "neg_l2"):
        return x
    raise ValueError(f"unknown similarity {kind!r}; use one of {', '.join(SIMILARITIES)}")


def pairwise(
    query: torch.Tensor, ref: torch.Tensor, kind: str = "cosine", prepared: bool = False,
    out: torch.Tensor | None = None
) -> torch.Tensor:
    """``(Q, R)`` similarity matrix.

    ``cosine``: ``<q/|q|, r/|r|>``; ``dot``: ``<q, r>``; ``neg_l2``: ``-||q - r||_2``.
    Pass ``prepared=True`` when both inputs already went through :func:`prepare`; ``out``: a
    contiguous ``(Q, R)`` tensor to write into (reused buffers spare page faults on large tiles).
    """
    if not prepared:
        query, ref = prepare(query, kind), prepare(ref, kind)
    if kind == "neg_l2":
        return torch.neg(torch.cdist(query, ref), out=out)
    return torch.matmul(query, ref.T, out=out)
