"""Fixtures of the search tests: a tiny class tree of PNGs and tiny untrained checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.checkpoints import write_checkpoint
from helpers.images import CLASSES, class_tree, draw
from helpers.pages import render_page  # noqa: F401 - the screenshot fixture, shared


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return class_tree(tmp_path / "gallery")


@pytest.fixture
def queries(tmp_path: Path) -> Path:
    """Query images in folders named like two of the gallery's classes, and one in an unknown folder."""
    root = tmp_path / "queries"
    draw(root / "alpha" / "one" / "q.png", CLASSES["alpha/one"], 99)
    draw(root / "beta" / "four" / "q.png", CLASSES["beta/four"], 98)
    draw(root / "elsewhere" / "q.png", (128, 128, 128), 97)
    return root


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "model.ckpt")
