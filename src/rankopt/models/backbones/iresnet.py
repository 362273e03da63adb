"""IResNet (ArcFace, Deng et al. 2019) with the key names of insightface's ``arcface_torch`` releases.

Smooth-AP §5.3 fine-tunes ArcFace's ResNet-50 on 112 x 112 crops aligned by 5
landmarks and L2-normalises its 512-d embedding. Key names and shapes are those
of ``arcface_torch/backbones/iresnet.py`` (``backbone.pth`` of its model zoo):
stem ``conv1`` (3x3, stride 1), ``bn1``, ``prelu``; ``layer1..4`` of
``IBasicBlock``s (``bn1``, ``conv1``, ``bn2``, ``prelu``, ``conv2`` carrying the
stride, ``bn3``, and on each stage's first block ``downsample.0`` / ``.1``,
a strided 1x1 conv and its BN); then ``bn2``, ``fc`` (``Linear(512 * 7 * 7, 512)``,
the embedding layer, not a classifier) and ``features`` (``BatchNorm1d(512)``
whose weight is fixed at 1 and not trained). All convs are bias-free, BN eps 1e-5.

A block computes ``bn3(conv2(prelu(bn2(conv1(bn1(x)))))) + shortcut(x)`` (no
activation after the sum); the network ``features(fc(flatten(bn2(layer4(...)))))``,
a ``(B, 512)`` descriptor (the release's dropout has p = 0 and is omitted). Every
stage halves the resolution, so ``fc`` needs 112 x 112 inputs (a 7 x 7 map).

Input convention of the release: RGB, ``(x / 255 - 0.5) / 0.5``, the transform presets
``arcface_train``/``arcface_test`` (:mod:`rankopt.data.transforms`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

IRESNET_INPUT_SIZE = 112
_FINAL_GRID = IRESNET_INPUT_SIZE // 16  # four stride-2 stages


class IBasicBlock(nn.Module):
    """Pre-activation-style basic block: BN -> conv3x3 -> BN -> PReLU -> conv3x3 (stride) -> BN, plus shortcut."""

    def __init__(self, cin: int, width: int, stride: int, downsample: nn.Module | None) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv1 = nn.Conv2d(cin, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.prelu = nn.PReLU(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn3 = nn.BatchNorm2d(width)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn3(self.conv2(self.prelu(self.bn2(self.conv1(self.bn1(x))))))
        return out + (x if self.downsample is None else self.downsample(x))


class IResNet(nn.Module):
    """ArcFace IResNet with ``arcface_torch`` key names; ``(B, 3, 112, 112)`` -> ``(B, num_features)``."""

    def __init__(self, layers: Sequence[int], num_features: int = 512) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.prelu = nn.PReLU(64)
        self._cin = 64
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1])
        self.layer3 = self._make_layer(256, layers[2])
        self.layer4 = self._make_layer(512, layers[3])
        self.bn2 = nn.BatchNorm2d(512)
        self.fc = nn.Linear(512 * _FINAL_GRID * _FINAL_GRID, num_features)
        self.features = nn.BatchNorm1d(num_features)
        self.features.weight.requires_grad_(False)  # fixed at 1, as in arcface_torch
        self.num_features = num_features
        # random init: He-normal convs and a zero last-BN gamma per block (Goyal et al. 2017), so each
        # block starts as its shortcut and outputs stay bounded with BN statistics frozen at (0, 1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, IBasicBlock):
                nn.init.zeros_(m.bn3.weight)

    def _make_layer(self, width: int, depth: int) -> nn.Sequential:
        downsample = nn.Sequential(nn.Conv2d(self._cin, width, 1, stride=2, bias=False), nn.BatchNorm2d(width))
        blocks = [IBasicBlock(self._cin, width, 2, downsample)]
        blocks += [IBasicBlock(width, width, 1, None) for _ in range(depth - 1)]
        self._cin = width
        return nn.Sequential(*blocks)

    def forward(self, images: Tensor) -> Tensor:
        x = self.prelu(self.bn1(self.conv1(images)))
        x = self.bn2(self.layer4(self.layer3(self.layer2(self.layer1(x)))))
        if x.shape[-2:] != (_FINAL_GRID, _FINAL_GRID):
            raise ValueError(
                f"IResNet's fc needs {IRESNET_INPUT_SIZE}x{IRESNET_INPUT_SIZE} inputs (a {_FINAL_GRID}x{_FINAL_GRID} "
                f"final map); got {images.shape[-2]}x{images.shape[-1]} inputs"
            )
        return self.features(self.fc(torch.flatten(x, 1)))


IRESNET_LAYOUTS: dict[str, tuple[int, int, int, int]] = {
    "iresnet50": (3, 4, 14, 3),
    "iresnet100": (3, 13, 30, 3),
}


def iresnet(name: str, **kwargs: int) -> IResNet:
    """Build ``iresnet50|100`` (randomly initialised)."""
    return IResNet(IRESNET_LAYOUTS[name], **kwargs)
