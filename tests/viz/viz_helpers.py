"""Shared helpers of the viz tests. All data here is synthetic (labelled Gaussian clusters)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from rankopt.viz._common import DPI


def png_size(path: Path) -> tuple[int, int]:
    """Open with Pillow, check it is a complete PNG and return its (width, height)."""
    with Image.open(path) as img:
        assert img.format == "PNG"
        img.load()
        return img.size


def expected_pixels(width_in: float, height_in: float) -> tuple[int, int]:
    return round(width_in * DPI), round(height_in * DPI)


def png_pixels(path: Path) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


def clusters(num_classes: int, per_class: int, dim: int = 16, noise: float = 0.6, seed: int = 0, coarse: int | None = None):
    """Synthetic embeddings around one random centre per class; labels (N,) or (N, 2) with ``coarse`` super-classes."""
    gen = torch.Generator().manual_seed(seed)
    fine = torch.arange(num_classes).repeat_interleave(per_class)
    x = torch.randn(num_classes, dim, generator=gen)[fine] + noise * torch.randn(fine.numel(), dim, generator=gen)
    labels = fine if coarse is None else torch.stack([fine, fine % coarse], dim=1)
    return x, labels


def synthetic_hier():
    """12 classes x 6 items, 2 levels (class, class % 3)."""
    return clusters(12, 6, coarse=3, seed=1)
