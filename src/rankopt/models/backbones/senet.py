"""SENet-50 of the VGGFace2 authors (Cao et al. 2018; SE blocks: Hu et al. 2018) with their PyTorch port's key names.

Smooth-AP §5.3 fine-tunes this network on 224 x 224 VGGFace2 crops and
L2-normalises its 256-d embedding. The Oxford PyTorch port (``senet50_256.pth``,
converted from MatConvNet) keeps the Caffe layer names as flat module names,
so its ``state_dict`` keys are ``conv1_7x7_s2.weight``, ``conv1_7x7_s2_bn.*``,
then per block ``conv{stage}_{block}_`` + ``1x1_reduce``, ``3x3``,
``1x1_increase`` (each followed by a ``_bn``), the SE pair ``1x1_down`` /
``1x1_up`` (1x1 convs with biases, reduction 16), on the first block of a
stage ``1x1_proj`` / ``1x1_proj_bn``, and finally ``feat_extract`` (a 1x1
conv 2048 -> 256 without bias). Other convs have no bias; BN eps is 1e-5.

Layout (Caffe SE-ResNet-50): 7x7/2 conv, 3x3/2 max pool (ceil mode), stages
conv2..conv5 of 3, 4, 6, 3 bottlenecks of widths 64..512 (4x expansion), the
stride-2 of conv3..conv5 on the first 1x1 conv and on the projection. A block
computes ``relu(sigmoid(up(relu(down(mean_hw(r))))) * r + shortcut)`` with
``r`` the ``1x1_increase_bn`` output.

Variants: ``senet50_256`` returns the ``(B, 256)`` descriptor
``feat_extract(mean_hw(conv5_3))`` (the release's 7x7 average pool is the
global mean on 224 x 224 inputs); ``senet50_2048`` has no ``feat_extract`` and
returns the ``(B, 2048, H/32, W/32)`` map for the retrieval head's pooling
(the ``senet50_ft`` release, whose ``classifier.*`` keys are dropped on load).

Input convention of the release: RGB in 0-255 minus the VGGFace2 mean face, no scaling (the
port's ``meta``: mean [131.0912, 103.8827, 91.4953], std 1), the transform presets
``vggface2_train``/``vggface2_test`` (:mod:`rankopt.data.transforms`). (The original Caffe model
takes the same values in BGR order.)
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

SE_REDUCTION = 16
# (stage, blocks, bottleneck width); a stage's output has 4 * width channels
SENET50_STAGES = ((2, 3, 64), (3, 4, 128), (4, 6, 256), (5, 3, 512))


class SENet50(nn.Module):
    """SE-ResNet-50 with the VGGFace2 release's flat module names; ``num_features`` = descriptor_dim or 2048."""

    def __init__(self, descriptor_dim: int | None = 256) -> None:
        super().__init__()
        if descriptor_dim is not None and descriptor_dim < 1:
            raise ValueError(f"descriptor_dim must be a positive int or None, got {descriptor_dim}")
        self.conv1_7x7_s2 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.conv1_7x7_s2_bn = nn.BatchNorm2d(64)
        self.pool1_3x3_s2 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        blocks: list[tuple[str, bool]] = []
        cin = 64
        for stage, depth, width in SENET50_STAGES:
            for index in range(1, depth + 1):
                name, project = f"conv{stage}_{index}", index == 1
                self._add_block(name, cin, width, stride=2 if project and stage > 2 else 1, project=project)
                blocks.append((name, project))
                cin = 4 * width
        self.block_layout = tuple(blocks)  # (name prefix, has a projection shortcut)
        self.feat_extract = nn.Conv2d(cin, descriptor_dim, 1, bias=False) if descriptor_dim is not None else None
        self.num_features = descriptor_dim if descriptor_dim is not None else cin
        for m in self.modules():
            if isinstance(m, nn.Conv2d) and m.bias is None:
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _add_block(self, name: str, cin: int, width: int, stride: int, project: bool) -> None:
        cout = 4 * width
        layers: dict[str, nn.Module] = {
            "1x1_reduce": nn.Conv2d(cin, width, 1, stride=stride, bias=False),
            "1x1_reduce_bn": nn.BatchNorm2d(width),
            "3x3": nn.Conv2d(width, width, 3, padding=1, bias=False),
            "3x3_bn": nn.BatchNorm2d(width),
            "1x1_increase": nn.Conv2d(width, cout, 1, bias=False),
            "1x1_increase_bn": nn.BatchNorm2d(cout),
            "1x1_down": nn.Conv2d(cout, cout // SE_REDUCTION, 1),
            "1x1_up": nn.Conv2d(cout // SE_REDUCTION, cout, 1),
        }
        if project:
            layers["1x1_proj"] = nn.Conv2d(cin, cout, 1, stride=stride, bias=False)
            layers["1x1_proj_bn"] = nn.BatchNorm2d(cout)
        for suffix, layer in layers.items():
            self.add_module(f"{name}_{suffix}", layer)

    def _block(self, name: str, project: bool, x: Tensor) -> Tensor:
        def layer(suffix: str) -> nn.Module:
            return getattr(self, f"{name}_{suffix}")

        out = F.relu(layer("1x1_reduce_bn")(layer("1x1_reduce")(x)))
        out = F.relu(layer("3x3_bn")(layer("3x3")(out)))
        out = layer("1x1_increase_bn")(layer("1x1_increase")(out))
        gate = layer("1x1_up")(F.relu(layer("1x1_down")(out.mean(dim=(2, 3), keepdim=True))))
        shortcut = layer("1x1_proj_bn")(layer("1x1_proj")(x)) if project else x
        return F.relu(gate.sigmoid() * out + shortcut)

    def forward(self, x: Tensor) -> Tensor:
        x = self.pool1_3x3_s2(F.relu(self.conv1_7x7_s2_bn(self.conv1_7x7_s2(x))))
        for name, project in self.block_layout:
            x = self._block(name, project, x)
        if self.feat_extract is None:
            return x
        return self.feat_extract(x.mean(dim=(2, 3), keepdim=True)).flatten(1)


SENET_LAYOUTS: dict[str, int | None] = {"senet50_256": 256, "senet50_2048": None}


def senet(name: str) -> SENet50:
    """Build ``senet50_256`` (256-d descriptor) or ``senet50_2048`` (feature map), randomly initialised."""
    return SENet50(SENET_LAYOUTS[name])
