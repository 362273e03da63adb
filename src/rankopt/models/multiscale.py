"""Multi-scale descriptors (Radenović et al., TPAMI 2018; SupRank's landmark evaluation).

The image batch is resized by each scale ``s`` (bilinear, antialiased), the pooled backbone
features ``f_s`` are combined by the power mean over the ``S`` scales::

    f = ((1/S) Σ_s f_s^p)^(1/p)

with ``p`` the model's GeM power (``p = 1``, a plain mean, for avg/max pooling and for
``(B, C)`` backbone outputs such as ViT tokens), and the rest of the head (LayerNorm,
projection, L2 normalisation) runs once on ``f``. The wrapper takes any ``(B, 3, H, W)``
batch, so it serves datasets of equal-size images (batched) and of varied sizes (batches of one)
alike. Resizing commutes with the per-channel normalisation of the test transforms (both are
affine and the interpolation weights sum to 1), so it acts on the transformed batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn

from rankopt.models.pooling import GeM
from rankopt.models.retrieval_net import RetrievalNet

DEFAULT_SCALES = (1.0, 1.0 / math.sqrt(2.0), 0.5)


def check_scales(scales: Sequence[float]) -> tuple[float, ...]:
    """``scales`` as a tuple of finite positive floats (at least one)."""
    values = tuple(float(s) for s in scales)
    if not values or not all(math.isfinite(s) and s > 0 for s in values):
        raise ValueError(f"multi-scale needs one or more finite scales > 0, got {list(scales)}")
    return values


def resize_batch(images: Tensor, scale: float) -> Tensor:
    """``images`` ``(B, C, H, W)`` resized by ``scale`` (bilinear, antialiased; at least 1 px a side)."""
    if scale == 1.0:
        return images
    size = (max(1, round(images.shape[-2] * scale)), max(1, round(images.shape[-1] * scale)))
    return F.interpolate(images, size=size, mode="bilinear", align_corners=False, antialias=True)


def pooling_power(model: RetrievalNet, backbone_output: Tensor) -> Tensor | None:
    """The power ``p`` of the scale mean: the GeM ``p`` (clamped to >= 1 as in :class:`GeM`; a tensor, so the
    graph exports without reading it) for a pooled ``(B, C, H, W)`` map, else ``None`` (``p = 1``)."""
    if backbone_output.ndim == 4 and isinstance(model.pooling, GeM):
        return model.pooling.p.detach().clamp(min=1.0)
    return None


class MultiScaleNet(nn.Module):
    """``head(((1/S) Σ_s pool(backbone(resize(x, s)))^p)^(1/p))`` over ``scales`` (see the module doc).

    ``scales=(1,)`` is the wrapped model itself, bit for bit.
    """

    def __init__(self, model: RetrievalNet, scales: Sequence[float] = DEFAULT_SCALES) -> None:
        super().__init__()
        if not isinstance(model, RetrievalNet):
            raise TypeError(f"multi-scale needs a RetrievalNet (pooled features + head), got {type(model).__name__}")
        self.model = model
        self.scales = check_scales(scales)
        self.embedding_dim = model.embedding_dim

    def pooled_features(self, images: Tensor) -> Tensor:
        """The power mean ``f`` ``(B, feature_dim)`` of the pooled features over the scales."""
        if len(self.scales) == 1:
            return self.model.pool(self.model.backbone_output(resize_batch(images, self.scales[0])))
        total: Tensor | None = None
        power: Tensor | None = None
        for scale in self.scales:
            output = self.model.backbone_output(resize_batch(images, scale))
            power = pooling_power(self.model, output)
            term = self.model.pool(output).float()
            term = term if power is None else term.pow(power)
            total = term if total is None else total + term
        assert total is not None
        mean = total / len(self.scales)
        return mean if power is None else mean.pow(1.0 / power)

    def forward(self, images: Tensor) -> Tensor:
        return self.model.head(self.pooled_features(images))

    def extra_repr(self) -> str:
        return f"scales={[round(s, 4) for s in self.scales]}"


def multiscale(model: nn.Module, scales: Sequence[float] | None) -> nn.Module:
    """``model`` wrapped in :class:`MultiScaleNet` for ``scales``; ``model`` itself when ``scales`` is None."""
    return model if scales is None else MultiScaleNet(model, scales)  # type: ignore[arg-type]


__all__ = ["DEFAULT_SCALES", "MultiScaleNet", "check_scales", "multiscale", "pooling_power", "resize_batch"]
