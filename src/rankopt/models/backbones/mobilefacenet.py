"""MobileFaceNet (Chen et al. 2018) with the key names of the ``Xiaoccer/MobileFaceNet_Pytorch`` release.

The release (``model/best/068.ckpt``: ``{"epoch", "net_state_dict"}``, trained on CASIA-WebFace with
ArcFace, 99.3 % on LFW) follows the paper's Table 1 on 112 x 96 (H x W) faces: ``conv1`` (3x3, stride 2,
64), ``dw_conv1`` (depthwise 3x3, 64), ``blocks.0..14`` bottlenecks (expansion t, channels c, repeats n,
stride s) = (2, 64, 5, 2), (4, 128, 1, 2), (2, 128, 6, 1), (4, 128, 1, 2), (2, 128, 2, 1), ``conv2`` (1x1,
512), ``linear7`` (the global depthwise conv: 7x6, no padding, BN without activation) and ``linear1``
(1x1 to 128, BN without activation). ``conv1``, ``dw_conv1``, ``conv2`` are conv -> BN -> PReLU
(``.conv``, ``.bn``, ``.prelu``). A bottleneck's ``conv`` is the sequence 1x1 conv to t·C_in, BN, PReLU,
depthwise 3x3 conv (stride s on a stage's first block), BN, PReLU, 1x1 conv to c, BN (indices 0..7),
plus its input when the stride is 1 and the channels are kept. Convs have no bias; BN eps 1e-5.

The output is the ``(B, 128)`` descriptor ``flatten(linear1(linear7(...)))``; ``linear7`` needs the 7 x 6
final map of a 112 x 96 input (four stride-2 layers). Input convention of the release (its LFW and
CASIA loaders): RGB, ``(x - 127.5) / 128`` for x in 0..255 (mean 0.5, std 0.502 on 0..1 values), faces
aligned to 112 x 96 by 5 landmarks as in SphereFace.
"""

from __future__ import annotations

from torch import Tensor, nn

MOBILEFACENET_INPUT_SIZE = (112, 96)
_FINAL_GRID = (7, 6)  # four stride-2 layers
# (expansion t, output channels c, repeats n, stride s), paper Table 1
MOBILEFACENET_STAGES = ((2, 64, 5, 2), (4, 128, 1, 2), (2, 128, 6, 1), (4, 128, 1, 2), (2, 128, 2, 1))
EMBEDDING_DIM = 128


class ConvBlock(nn.Module):
    """``prelu(bn(conv(x)))``, or ``bn(conv(x))`` when ``linear``; ``depthwise`` groups by channel."""

    def __init__(self, cin: int, cout: int, kernel: int | tuple[int, int], stride: int = 1, padding: int = 0,
                 depthwise: bool = False, linear: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride, padding, groups=cin if depthwise else 1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.prelu = None if linear else nn.PReLU(cout)

    def forward(self, x: Tensor) -> Tensor:
        x = self.bn(self.conv(x))
        return x if self.prelu is None else self.prelu(x)


class PReLUInvertedResidual(nn.Module):
    """Inverted residual with PReLU: 1x1 expand, depthwise 3x3 (stride), 1x1 linear projection (+ x)."""

    def __init__(self, cin: int, cout: int, stride: int, expansion: int) -> None:
        super().__init__()
        mid = cin * expansion
        self.conv = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.PReLU(mid),
            nn.Conv2d(mid, mid, 3, stride, 1, groups=mid, bias=False), nn.BatchNorm2d(mid), nn.PReLU(mid),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout),
        )
        self.residual = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileFaceNet(nn.Module):
    """MobileFaceNet with the release's key names; ``(B, 3, 112, 96)`` -> ``(B, 128)``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = ConvBlock(3, 64, 3, stride=2, padding=1)
        self.dw_conv1 = ConvBlock(64, 64, 3, padding=1, depthwise=True)
        blocks, cin = [], 64
        for expansion, cout, repeats, stride in MOBILEFACENET_STAGES:
            for index in range(repeats):
                blocks.append(PReLUInvertedResidual(cin, cout, stride if index == 0 else 1, expansion))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.conv2 = ConvBlock(cin, 512, 1)
        self.linear7 = ConvBlock(512, 512, _FINAL_GRID, depthwise=True, linear=True)
        self.linear1 = ConvBlock(512, EMBEDDING_DIM, 1, linear=True)
        self.num_features = EMBEDDING_DIM
        self.fixed_input_size = MOBILEFACENET_INPUT_SIZE  # linear7 fixes the input size: no multi-scale
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, images: Tensor) -> Tensor:
        x = self.conv2(self.blocks(self.dw_conv1(self.conv1(images))))
        if x.shape[-2:] != _FINAL_GRID:
            (h, w), (gh, gw) = MOBILEFACENET_INPUT_SIZE, _FINAL_GRID
            raise ValueError(
                f"MobileFaceNet's linear7 (a {gh}x{gw} global depthwise conv) needs {h}x{w} (HxW) inputs "
                f"(a {gh}x{gw} final map); got {images.shape[-2]}x{images.shape[-1]} inputs"
            )
        return self.linear1(self.linear7(x)).flatten(1)

    def stages(self) -> list[nn.Module]:
        """The forward as a sequence of modules sharing these parameters (``conv1``, ``dw_conv1``, each
        bottleneck, ``conv2``, then ``linear7`` -> ``linear1`` -> flatten): ``nn.Sequential(*stages())(x) ==
        forward(x)`` for 112 x 96 inputs."""
        return [self.conv1, self.dw_conv1, *self.blocks, self.conv2,
                nn.Sequential(self.linear7, self.linear1, nn.Flatten(1))]


def mobilefacenet() -> MobileFaceNet:
    """Build MobileFaceNet (randomly initialised; weights from ``pretrained_path=``)."""
    return MobileFaceNet()
