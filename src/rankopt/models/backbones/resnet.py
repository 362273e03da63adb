"""Pure-torch ResNet (He et al. 2016, "v1.5": stride on the 3x3 conv) with torchvision/timm key names.

The module tree and ``state_dict`` keys (``conv1``, ``bn1``, ``layer1.0.conv1``,
``layer2.0.downsample.0``, ...) are exactly those of ``torchvision.models.resnet*``
and ``timm``'s ``resnet*``, minus the classifier ``fc``, so their weights load
with ``strict=True`` once ``fc.*`` is dropped. The output is the ``(B, C, H/32, W/32)``
feature map before global pooling (C = 512 for ResNet-18/34, 2048 for 50/101).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def _conv1x1(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int, downsample: nn.Module | None) -> None:
        super().__init__()
        self.conv1 = _conv3x3(cin, width, stride)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(width, width)
        self.bn2 = nn.BatchNorm2d(width)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int, downsample: nn.Module | None) -> None:
        super().__init__()
        self.conv1 = _conv1x1(cin, width)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = _conv3x3(width, width, stride)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = _conv1x1(width, width * self.expansion)
        self.bn3 = nn.BatchNorm2d(width * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet(nn.Module):
    """ResNet trunk without its classifier; ``num_features`` channels out."""

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: Sequence[int], in_chans: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_chans, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self._cin = 64
        self.layer1 = self._make_layer(block, 64, layers[0], 1)
        self.layer2 = self._make_layer(block, 128, layers[1], 2)
        self.layer3 = self._make_layer(block, 256, layers[2], 2)
        self.layer4 = self._make_layer(block, 512, layers[3], 2)
        self.num_features = 512 * block.expansion
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, block: type[BasicBlock] | type[Bottleneck], width: int, depth: int,
                    stride: int) -> nn.Sequential:
        downsample = None
        cout = width * block.expansion
        if stride != 1 or self._cin != cout:
            downsample = nn.Sequential(_conv1x1(self._cin, cout, stride), nn.BatchNorm2d(cout))
        blocks = [block(self._cin, width, stride, downsample)]
        blocks += [block(cout, width, 1, None) for _ in range(depth - 1)]
        self._cin = cout
        return nn.Sequential(*blocks)

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer4(self.layer3(self.layer2(self.layer1(x))))

    def stages(self) -> list[nn.Module]:
        """The forward as a sequence of modules sharing these parameters (stem, each residual block):
        ``nn.Sequential(*stages())(x) == forward(x)``."""
        stem = nn.Sequential(self.conv1, self.bn1, self.relu, self.maxpool)
        return [stem, *(b for layer in (self.layer1, self.layer2, self.layer3, self.layer4) for b in layer)]


RESNET_LAYOUTS: dict[str, tuple[type[BasicBlock] | type[Bottleneck], tuple[int, ...]]] = {
    "resnet18": (BasicBlock, (2, 2, 2, 2)),
    "resnet34": (BasicBlock, (3, 4, 6, 3)),
    "resnet50": (Bottleneck, (3, 4, 6, 3)),
    "resnet101": (Bottleneck, (3, 4, 23, 3)),
}


def resnet(name: str, **kwargs: int) -> ResNet:
    """Build ``resnet18|34|50|101`` (randomly initialised)."""
    block, layers = RESNET_LAYOUTS[name]
    return ResNet(block, layers, **kwargs)
