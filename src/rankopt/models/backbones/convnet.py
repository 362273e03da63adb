"""Small conv-BN-ReLU networks that train in seconds on a CPU (embedded default, tests)."""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn


def _conv_bn_relu(cin: int, cout: int, kernel: int, stride: int) -> list[nn.Module]:
    conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=(kernel - 1) // 2 if kernel % 2 else 0, bias=False)
    return [conv, nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


class ConvNet(nn.Module):
    """A 4x4/stride-4 "patchify" conv-BN-ReLU stem, then stages of 3x3 conv-BN-ReLU blocks.

    Stage ``s`` has ``depths[s]`` blocks with ``widths[s]`` channels; its first
    block has stride 2. Output: a ``(B, widths[-1], H / 2^(S+2), W / 2^(S+2))``
    feature map (4x4 for 64 px inputs and 2 stages). The patchify stem keeps a
    training step cheap on CPU, where a stride-2 3x3 stem would run at full resolution
    (measured: benchmarks/results/models_engine.md).
    """

    def __init__(self, stem_width: int, widths: Sequence[int], depths: Sequence[int], in_chans: int = 3) -> None:
        super().__init__()
        if len(widths) != len(depths) or not widths or min(depths) < 1:
            raise ValueError(f"widths {list(widths)} and depths {list(depths)} must be non-empty, equally long, depths "
                             ">= 1")
        layers = _conv_bn_relu(in_chans, stem_width, 4, 4)
        cin = stem_width
        for width, depth in zip(widths, depths):
            for block in range(depth):
                layers += _conv_bn_relu(cin, width, 3, 2 if block == 0 else 1)
                cin = width
        self.features = nn.Sequential(*layers)
        self.num_features = cin
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        return self.features(x)


def convnet_tiny(**kwargs: int) -> ConvNet:
    """Stem 16, stages 32/64 of one block each: 64-d features, ~24k parameters."""
    return ConvNet(16, (32, 64), (1, 1), **kwargs)


def convnet_small(**kwargs: int) -> ConvNet:
    """Stem 32, stages 64 (2 blocks) / 128 (1 block): 128-d features, ~131k parameters."""
    return ConvNet(32, (64, 128), (2, 1), **kwargs)
