"""Multi-scale descriptors (rankopt.models.multiscale): scale 1 is the plain model bit for bit, two
scales equal a hand-computed power mean, and a scale-sensitive fixed-filter model retrieves SYNTHETIC
gratings drawn at two scales better with multi-scale descriptors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rankopt.engine.embed_and_score import embed_dataset
from rankopt.models import RetrievalNet, create_model
from rankopt.models.multiscale import DEFAULT_SCALES, MultiScaleNet, check_scales
from rankopt.models.pooling import GeM

from .helpers import mean_ap


@pytest.mark.parametrize("pooling", ["gem", "avg"])
def test_scale_one_is_the_plain_model_bit_for_bit(pooling):
    model = create_model("convnet_tiny", pooling=pooling, layer_norm=True, embedding_dim=8).eval()
    images = torch.rand(3, 3, 40, 36)
    with torch.no_grad():
        assert torch.equal(MultiScaleNet(model, (1.0,))(images), model(images))


def test_two_scales_are_the_power_mean_of_pooled_features():
    model = create_model("convnet_tiny", pooling="gem", gem_p=2.5, layer_norm=True, embedding_dim=8).eval()
    images = torch.rand(2, 3, 48, 48)
    with torch.no_grad():
        full = model.pooling(model.backbone(images)).double()
        small = F.interpolate(images, size=(24, 24), mode="bilinear", align_corners=False, antialias=True)
        half = model.pooling(model.backbone(small)).double()
        mean = ((full.pow(2.5) + half.pow(2.5)) / 2).pow(1 / 2.5)
        expected = F.normalize(model.projection(model.norm(mean.float())), dim=1)
        got = MultiScaleNet(model, (1.0, 0.5))(images)
    assert torch.allclose(got, expected, atol=1e-5)
    assert not torch.allclose(got, model(images), atol=1e-3)


def test_avg_pooling_and_token_backbones_use_a_plain_mean():
    model = create_model("convnet_tiny", pooling="avg", embedding_dim=8).eval()
    images = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        small = F.interpolate(images, size=(16, 16), mode="bilinear", align_corners=False, antialias=True)
        mean = (model.pooling(model.backbone(images)) + model.pooling(model.backbone(small))) / 2
        assert torch.allclose(MultiScaleNet(model, (1.0, 0.5))(images), model.head(mean), atol=1e-6)


def test_default_scales_and_bad_input():
    assert DEFAULT_SCALES == (1.0, 1 / math.sqrt(2), 0.5)
    with pytest.raises(ValueError, match="scales > 0"):
        check_scales([1.0, 0.0])
    with pytest.raises(ValueError, match="scales > 0"):
        check_scales([])
    with pytest.raises(TypeError, match="RetrievalNet"):
        MultiScaleNet(nn.Linear(3, 3))
    model = create_model("convnet_tiny", embedding_dim=8).eval()
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        MultiScaleNet(model)(torch.rand(3, 32, 32))


# --- helps where it must (SYNTHETIC) --------------------------------------------------------------

PERIOD = 4.0
ORIENTATIONS = (0.0, 45.0, 90.0, 135.0)


class GratingFilters(nn.Module):
    """A fixed, scale-sensitive backbone: rectified responses of Gabor filters (period 4 px, the four
    ORIENTATIONS, cosine and sine phase) to the first channel, plus a constant channel."""

    num_features = 2 * len(ORIENTATIONS) + 1

    def __init__(self) -> None:
        super().__init__()
        coords = torch.arange(-6, 7, dtype=torch.float32)
        y, x = torch.meshgrid(coords, coords, indexing="ij")
        envelope = torch.exp(-(x**2 + y**2) / (2 * 3.0**2))
        kernels = []
        for degrees in ORIENTATIONS:
            t = math.radians(degrees)
            phase = 2 * math.pi * (x * math.cos(t) + y * math.sin(t)) / PERIOD
            for wave in (torch.cos(phase), torch.sin(phase)):
                kernel = envelope * wave
                kernels.append((kernel - kernel.mean()) / kernel.abs().sum())
        self.register_buffer("weight", torch.stack(kernels).unsqueeze(1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        responses = F.conv2d(images[:, :1], self.weight, padding=6).abs()
        return torch.cat([responses, torch.full_like(responses[:, :1], 0.02)], dim=1)


class Gratings(torch.utils.data.Dataset):
    """SYNTHETIC images of oriented gratings (class = orientation) of period 4 px or 8 px (the object
    at two scales), random phase, plus Gaussian noise."""

    def __init__(self, per_class: int = 12, size: int = 48, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        coords = torch.arange(size, dtype=torch.float32)
        y, x = torch.meshgrid(coords, coords, indexing="ij")
        images, labels = [], []
        for label, degrees in enumerate(ORIENTATIONS):
            t = math.radians(degrees)
            for i in range(per_class):
                period = PERIOD * (1 if i % 2 else 2)
                phase = 2 * math.pi * float(torch.rand(1, generator=gen))
                wave = torch.cos(2 * math.pi * (x * math.cos(t) + y * math.sin(t)) / period + phase)
                images.append((wave + 0.8 * torch.randn(size, size, generator=gen)).expand(3, size, size))
                labels.append(label)
        self.images = torch.stack(images)
        self.labels = torch.tensor(labels).unsqueeze(1).numpy()
        self.paths = [f"grating{i}" for i in range(len(images))]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict:
        return {"image": self.images[i], "label": torch.tensor(self.labels[i]), "index": i, "path": self.paths[i]}


def test_multiscale_helps_a_scale_sensitive_model_on_objects_at_two_scales():
    model = RetrievalNet(GratingFilters(), GeM(3.0, learnable=False)).eval()
    data = Gratings()
    labels = torch.as_tensor(data.labels)
    single = embed_dataset(model, data, batch_size=16, show_progress=False).embeddings
    multi = embed_dataset(MultiScaleNet(model, (1.0, 0.5)), data, batch_size=16, show_progress=False).embeddings
    batch_of_one = embed_dataset(MultiScaleNet(model, (1.0, 0.5)), data, batch_size=1, show_progress=False).embeddings
    assert torch.allclose(batch_of_one, multi, atol=1e-6)  # images one at a time (sizes may differ) or batched
    before, after = mean_ap(single, labels), mean_ap(multi, labels)
    assert after > before + 0.15 and after > 0.95, (before, after)
