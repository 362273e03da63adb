"""The retrieval network: backbone -> pooling -> [LayerNorm] -> [Linear] -> L2 normalisation."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rankopt.checks import check_embeddings
from rankopt.models.backbones import build_backbone
from rankopt.models.batchnorm import freeze_batchnorm_statistics
from rankopt.models.pooling import build_pooling


class RetrievalNet(nn.Module):
    """``e = normalize(W · LN(pool(backbone(x))) + b)``, ``(B, embedding_dim)`` with unit L2 norm.

    * ``backbone``: a module with ``num_features`` returning a ``(B, C, H, W)`` map
      (pooled by ``pooling``) or a ``(B, C)`` descriptor (ViT CLS token, not pooled).
    * ``layer_norm``: LayerNorm over the C channels without affine parameters.
    * ``embedding_dim``: adds a ``Linear(C, embedding_dim)`` projection (None: no projection,
      ``embedding_dim = C``); :meth:`init_projection_pca` initialises it by PCA.
    * ``freeze_bn``: BatchNorm layers stay in eval mode through ``train()`` (see
      :mod:`rankopt.models.batchnorm`); their gamma/beta stay trainable.
    * ``freeze``: parameter-name prefixes (``"backbone.blocks.0"``, matched at dot boundaries) whose
      parameters are not trained (``requires_grad=False``): early stages of a pretrained backbone then
      build no autograd graph, so fine-tuning the rest costs little more than its own forward.
    """

    def __init__(
        self,
        backbone: nn.Module,
        pooling: nn.Module,
        *,
        layer_norm: bool = False,
        embedding_dim: int | None = None,
        freeze_bn: bool = True,
        freeze: Sequence[str] = (),
    ) -> None:
        super().__init__()
        feature_dim = int(backbone.num_features)  # type: ignore[arg-type]
        if embedding_dim is not None and embedding_dim < 1:
            raise ValueError(f"embedding_dim must be a positive int or None, got {embedding_dim}")
        self.backbone = backbone
        self.pooling = pooling
        self.norm = nn.LayerNorm(feature_dim, elementwise_affine=False) if layer_norm else nn.Identity()
        self.projection = nn.Linear(feature_dim, embedding_dim) if embedding_dim is not None else None
        self.feature_dim = feature_dim
        self.embedding_dim = embedding_dim if embedding_dim is not None else feature_dim
        self.freeze_bn = freeze_bn
        self.frozen = freeze_parameters(self, freeze)
        self._frozen_prefixes = tuple(p.rstrip(".") for p in freeze)
        self.train(self.training)

    def train(self, mode: bool = True) -> RetrievalNet:
        """Set train/eval mode; with ``freeze_bn`` every BatchNorm (incl. SyncBatchNorm) stays in eval mode,
        and the modules of frozen prefixes always do."""
        super().train(mode)
        if self.freeze_bn:
            freeze_batchnorm_statistics(self)
        for name, module in self.named_modules():  # frozen stages keep their statistics too
            if any(name == p or name.startswith(p + ".") for p in getattr(self, "_frozen_prefixes", ())):
                module.eval()
        return self

    def backbone_output(self, images: Tensor) -> Tensor:
        """The backbone's ``(B, C, H, W)`` map or ``(B, C)`` descriptor of ``(B, 3, H, W)`` images."""
        if images.ndim != 4:
            raise ValueError(f"images must have shape (B, C, H, W), got {tuple(images.shape)}")
        return self.backbone(images)

    def pool(self, features: Tensor) -> Tensor:
        """``pooling`` of a ``(B, C, H, W)`` map; a ``(B, C)`` backbone output (ViT token) is returned as is."""
        return self.pooling(features) if features.ndim == 4 else features

    def head(self, features: Tensor) -> Tensor:
        """``normalize(W · LN(f) + b)`` of pooled features ``f`` ``(B, feature_dim)``."""
        x = self.norm(features)
        if self.projection is not None:
            x = self.projection(x)
        return F.normalize(x, dim=-1)

    def descriptors(self, images: Tensor) -> Tensor:
        """Pooled (and LayerNormed) backbone descriptors before the projection, ``(B, feature_dim)``."""
        return self.norm(self.pool(self.backbone_output(images)))

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.pool(self.backbone_output(images)))

    def backbone_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters of the backbone (the "backbone" optimizer group)."""
        return self.backbone.parameters()

    def head_parameters(self) -> Iterator[nn.Parameter]:
        """Parameters of the head: the projection and a learnable GeM ``p`` (the "head" group)."""
        yield from self.pooling.parameters()
        if self.projection is not None:
            yield from self.projection.parameters()

    @torch.no_grad()
    def init_projection_pca(self, features: Tensor) -> None:
        """Initialise the projection as PCA of training ``descriptors`` ``features`` (N, feature_dim).

        With ``mu`` the mean and ``V_k`` the top-``k`` right singular vectors of the
        centred features (rows, sign fixed so each row's largest-magnitude entry is
        positive): ``W = V_k``, ``b = -V_k mu``, hence ``W x + b = V_k (x - mu)``, the
        coordinates on the first ``k = embedding_dim`` principal components.
        """
        if self.projection is None:
            raise RuntimeError("init_projection_pca needs a projection layer; create the model with embedding_dim=")
        check_embeddings(features, "features", min_rows=2)
        k = self.embedding_dim
        if features.shape[1] != self.feature_dim:
            raise ValueError(f"features have {features.shape[1]} dimensions; the descriptors have {self.feature_dim}")
        if k > min(features.shape[0] - 1, self.feature_dim):
            raise ValueError(
                f"PCA to embedding_dim={k} needs more than {k} feature rows and feature_dim >= {k}; "
                f"got {features.shape[0]} rows of dimension {self.feature_dim}"
            )
        x = features.double()
        mean = x.mean(dim=0)
        _, _, vh = torch.linalg.svd(x - mean, full_matrices=False)
        components = vh[:k]
        pivot = components.abs().argmax(dim=1, keepdim=True)
        components = components * components.gather(1, pivot).sign()
        self.projection.weight.copy_(components)
        self.projection.bias.copy_(-(components @ mean))


def freeze_parameters(model: nn.Module, prefixes: Sequence[str]) -> list[str]:
    """Set ``requires_grad=False`` on the parameters named ``p`` or ``p.*`` for each prefix ``p``;
    the frozen names. A prefix that matches no parameter is an error naming it."""
    names = [n for n, _ in model.named_parameters()]
    unmatched = [p for p in prefixes if not any(n == p or n.startswith(p.rstrip(".") + ".") for n in names)]
    if unmatched:
        tops = sorted({".".join(n.split(".")[:2]) for n in names})
        raise ValueError(f"model.freeze: {unmatched} match no parameter; names start with e.g. {tops[:12]}")
    frozen = []
    for name, param in model.named_parameters():
        if any(name == p or name.startswith(p.rstrip(".") + ".") for p in prefixes):
            param.requires_grad_(False)
            frozen.append(name)
    return frozen


def create_model(
    backbone: str,
    *,
    pretrained: bool = False,
    pooling: str = "avg",
    gem_p: float = 3.0,
    gem_learnable: bool = True,
    layer_norm: bool = False,
    embedding_dim: int | None = None,
    freeze_bn: bool = True,
    freeze: Sequence[str] = (),
    pretrained_path: str | Path | None = None,
    **backbone_kwargs: Any,
) -> RetrievalNet:
    """Build a :class:`RetrievalNet` from a ``BACKBONES`` name or ``timm:<name>``.

    ``pretrained`` loads timm/torchvision weights (from ``pretrained_path`` when
    given, else through timm); ``backbone_kwargs`` go to the backbone constructor
    (e.g. ``img_size`` for ViTs); ``freeze``: parameter-name prefixes not trained (:class:`RetrievalNet`).
    """
    net = build_backbone(backbone, pretrained=pretrained, pretrained_path=pretrained_path, **backbone_kwargs)
    return RetrievalNet(
        net,
        build_pooling(pooling, gem_p=gem_p, gem_learnable=gem_learnable),
        layer_norm=layer_norm,
        embedding_dim=embedding_dim,
        freeze_bn=freeze_bn,
        freeze=freeze,
    )


__all__ = ["RetrievalNet", "create_model"]
