"""Fixtures of the search tests: a tiny class tree of PNGs and tiny untrained checkpoints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from report.conftest import render_page, screenshot_stats  # noqa: F401 - the screenshot fixture, shared

from rankopt.config import config_to_dict, load_config
from rankopt.engine.assembly import build_model
from rankopt.engine.checkpoint import save_checkpoint

CLASSES = {"alpha/one": (110, 70, 190), "alpha/two": (170, 140, 230), "beta/three": (30, 140, 150), "beta/four": (120, 210, 220)}
IMAGES_PER_CLASS = 3
TINY = ["model.backbone=convnet_tiny", "model.embedding_dim=16", "data.image_size=32"]


def draw(path: Path, colour: tuple[int, int, int], seed: int, size: int = 40) -> Path:
    """A small PNG: ``colour`` with a random darker square, so images of a class differ a little."""
    rng = np.random.default_rng(seed)
    pixels = np.empty((size, size, 3), dtype=np.uint8)
    pixels[:] = colour
    x, y = rng.integers(0, size // 2, 2)
    pixels[y : y + size // 2, x : x + size // 2] //= 2
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)
    return path


def make_tree(root: Path, seed: int = 0) -> Path:
    """``root/<letter>/<class>/img{i}.png``: 4 classes under 2 letters, 3 images each."""
    for c, (name, colour) in enumerate(CLASSES.items()):
        for i in range(IMAGES_PER_CLASS):
            draw(root / name / f"img{i}.png", colour, seed * 1000 + c * 10 + i)
    return root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "gallery")


@pytest.fixture
def queries(tmp_path: Path) -> Path:
    """Query images in folders named like two of the gallery's classes, and one in an unknown folder."""
    root = tmp_path / "queries"
    draw(root / "alpha" / "one" / "q.png", CLASSES["alpha/one"], 99)
    draw(root / "beta" / "four" / "q.png", CLASSES["beta/four"], 98)
    draw(root / "elsewhere" / "q.png", (128, 128, 128), 97)
    return root


def write_checkpoint(path: Path, overrides: list[str] = (), seed: int = 0) -> Path:
    """An untrained tiny model saved as a training checkpoint (weights drawn with ``seed``)."""
    cfg = load_config(None, [*TINY, *overrides])
    torch.manual_seed(seed)
    model = build_model(cfg)
    return save_checkpoint(path, {"model": model.state_dict(), "config": config_to_dict(cfg)})


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "model.ckpt")
