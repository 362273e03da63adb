"""EfficientNet-Lite2 against the model code its release was published with (``efficientnet-lite-pytorch`` 0.1.0,
ml-illustrated's EfficientNet: static TF SAME padding), with that package's own seeded init and, when
RANKOPT_WEIGHTS_LITE2 names it, the real release file ``efficientnet-lite2-9656183e.pth``."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from rankopt.models import build_backbone


def _env_path(variable: str) -> Path:
    value = os.environ.get(variable)
    if not value or not Path(value).exists():
        pytest.skip(f"{variable} is not set or does not exist")
    return Path(value)


@pytest.mark.parametrize("size", [(260, 260), (75, 101)])  # Lite2's native size; odd sides
@pytest.mark.parametrize("weights", ["seeded", "release"])
def test_lite2_forward_equals_the_packages_extract_features(tmp_path, weights: str, size: tuple[int, int]) -> None:
    """ml-illustrated's EfficientNet (efficientnet-lite-pytorch 0.1.0; static TF SAME padding built for ``size``)
    with its own seeded init and BN statistics off the identity, or with the real release file."""
    path = _env_path("RANKOPT_WEIGHTS_LITE2") if weights == "release" else tmp_path / "efficientnet-lite2.pth"
    lite = pytest.importorskip("efficientnet_lite_pytorch")
    torch.manual_seed(0)
    package = lite.EfficientNet.from_name("efficientnet-lite2", image_size=list(size))
    if weights == "release":
        package.load_state_dict(torch.load(path, weights_only=True))
    else:
        for bn in (m for m in package.modules() if isinstance(m, nn.BatchNorm2d)):
            for tensor, low in ((bn.weight, 0.5), (bn.bias, -0.5), (bn.running_mean, -0.5), (bn.running_var, 0.5)):
                tensor.data.uniform_(low, low + 1)
        torch.save(package.state_dict(), path)
    ours = build_backbone("efficientnet_lite2", pretrained=True, pretrained_path=path).double().eval()
    package = package.double().eval()
    images = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        out, expected = ours(images), package.extract_features(images)
    assert out.shape == (2, 1280, *(math.ceil(side / 32) for side in size))
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9 * expected.abs().max().item())
    assert 0.05 < (expected > 0).double().mean() < 0.95 and not torch.allclose(out[0], out[1])
