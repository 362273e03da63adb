"""Fixtures for the data tests: one generated copy of the SYNTHETIC default per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from rankopt.data import RetrievalDataset, build_dataset


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder holding the default synthetic dataset (generated once, ~10-20 s)."""
    root = tmp_path_factory.mktemp("rankopt_cache")
    build_dataset("synthetic", root, "train")
    return root


@pytest.fixture(scope="session")
def synthetic_train(synthetic_root: Path) -> RetrievalDataset:
    return build_dataset("synthetic", synthetic_root, "train")


@pytest.fixture(scope="session")
def synthetic_test(synthetic_root: Path) -> RetrievalDataset:
    return build_dataset("synthetic", synthetic_root, "test")


SOP_TRAIN = [(1, 1, "bicycle_final/111085122871_0.JPG"), (1, 1, "bicycle_final/111085122871_1.JPG"),
             (7, 1, "bicycle_final/121_0.JPG"), (3, 12, "toaster_final/9_0.JPG"), (3, 12, "toaster_final/9_1.JPG")]


@pytest.fixture
def sop_root(tmp_path: Path) -> tuple[Path, list[tuple[int, int, str]]]:
    """A fake Stanford Online Products copy: ``Ebay_train.txt`` (real header) + tiny JPEGs."""
    lines = ["image_id class_id super_class_id path"]
    for i, (c, s, rel) in enumerate(SOP_TRAIN):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (12, 9), (200, 10, 10)).save(tmp_path / rel)
        lines.append(f"{i + 1} {c} {s} {rel}")
    (tmp_path / "Ebay_train.txt").write_text("\n".join(lines) + "\n")
    return tmp_path, SOP_TRAIN
