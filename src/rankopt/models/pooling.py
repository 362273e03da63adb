"""Global pooling of a ``(B, C, H, W)`` feature map into ``(B, C)`` descriptors."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

POOLINGS = ("avg", "max", "gem")


class GeM(nn.Module):
    """Generalised-mean pooling (Radenović et al.): ``f_c = (mean_hw clamp(x, eps)^p)^(1/p)``.

    ``p = 1`` is average pooling and ``p -> inf`` tends to max pooling. ``p`` is a
    learnable scalar (``learnable=True``) or a fixed buffer; it is clamped to
    ``p >= 1`` in the forward pass (below 1 the mean is no longer a pooling of
    the strongest activations and the gradient explodes near ``eps``).
    """

    def __init__(self, p: float = 3.0, learnable: bool = True, eps: float = 1e-6) -> None:
        super().__init__()
        if p < 1:
            raise ValueError(f"gem_p must be >= 1, got {p}")
        if eps <= 0:
            raise ValueError(f"eps must be > 0, got {eps}")
        value = torch.tensor(float(p))
        if learnable:
            self.p = nn.Parameter(value)
        else:
            self.register_buffer("p", value)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # at least float32: under fp16 autocast eps^p underflows to 0 and 0^(1/p) has an infinite gradient
        dtype = torch.promote_types(x.dtype, torch.float32)
        p = self.p.clamp(min=1.0).to(dtype)
        return x.to(dtype).clamp(min=self.eps).pow(p).mean(dim=(-2, -1)).pow(1.0 / p)

    def extra_repr(self) -> str:
        return f"p={float(self.p):.4g}, learnable={isinstance(self.p, nn.Parameter)}, eps={self.eps}"


class _GlobalPool(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "avg":
            return x.mean(dim=(-2, -1))
        return F.adaptive_max_pool2d(x, 1).flatten(1)

    def extra_repr(self) -> str:
        return self.kind


def build_pooling(name: str, gem_p: float = 3.0, gem_learnable: bool = True) -> nn.Module:
    """``avg`` | ``max`` | ``gem`` pooling module."""
    if name == "gem":
        return GeM(gem_p, learnable=gem_learnable)
    if name in ("avg", "max"):
        return _GlobalPool(name)
    raise ValueError(f"unknown pooling {name!r}; use one of {', '.join(POOLINGS)}")
