"""Small real images and class folders of them, written by the tests (no data set needed)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = {"alpha/one": (110, 70, 190), "alpha/two": (170, 140, 230), "beta/three": (30, 140, 150),
           "beta/four": (120, 210, 220)}
"""The classes of :func:`class_tree` (two levels: a letter, then the class) and their colours."""
IMAGES_PER_CLASS = 3


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


def class_tree(root: Path, seed: int = 0) -> Path:
    """``root/<letter>/<class>/img{i}.png``: the 4 :data:`CLASSES` under 2 letters, 3 images each."""
    for c, (name, colour) in enumerate(CLASSES.items()):
        for i in range(IMAGES_PER_CLASS):
            draw(root / name / f"img{i}.png", colour, seed * 1000 + c * 10 + i)
    return root


def counted_tree(root: Path, classes: dict[str, int], suffix: str = ".png") -> Path:
    """``{class path: number of images}`` -> tiny images ``root/<class path>/<i><suffix>``."""
    for cls, count in classes.items():
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            Image.new("RGB", (8, 6), (30 * i % 256, 90, 10)).save(root / cls / f"{i}{suffix}")
    return root


def photo_tree(root: Path, classes: int = 4, per_class: int = 3) -> Path:
    """``root/c<k>/<i>.jpg``: one label level, Pillow-written JPEGs."""
    for c in range(classes):
        (root / f"c{c}").mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", (20, 16), (60 * c % 256, 40 * i % 256, 90)).save(root / f"c{c}" / f"{i}.jpg")
    return root


def image_bytes(colour: tuple[int, int, int], fmt: str = "PNG", size: int = 40) -> bytes:
    """A small image of one ``colour`` in format ``fmt``."""
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, format=fmt)
    return buffer.getvalue()


FIT_CLASSES, FIT_PER_CLASS = 6, 8
"""The classes and photos a class of :func:`photo_folder` (a whole fit in the fit tests)."""


def photo_folder(root: Path, classes: int = FIT_CLASSES, per_class: int = FIT_PER_CLASS) -> Path:
    """SYNTHETIC photos: one colour per class with a random darker square, 48 px JPEGs."""
    rng = np.random.default_rng(0)
    for c in range(classes):
        colour = rng.integers(40, 230, 3)
        for i in range(per_class):
            pixels = np.tile(colour, (48, 48, 1)).astype(np.uint8)
            x, y = rng.integers(0, 24, 2)
            pixels[y:y + 24, x:x + 24] //= 2
            (root / f"class{c}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(root / f"class{c}" / f"p{i}.jpg")
    return root
