"""Shared fixtures. Real data (Omniglot) is read from a path outside the project;
tests that need it skip cleanly where it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RANKOPT_RUNTIME", "torch")
"""Frozen forwards run on PyTorch in the suite (inherited by the commands it starts), so a test's tiny model is not
exported to ONNX at each use; tests/export/test_runtimes.py tests ``auto`` and ``onnx`` on purpose."""


def omniglot_root() -> Path | None:
    env = os.environ.get("RANKOPT_OMNIGLOT")
    candidates = [Path(env)] if env else []
    candidates.append(REPO_ROOT.parent / "shared" / "data" / "omniglot")
    for path in candidates:
        if (path / "images_background.zip").exists() or (path / "images_background").is_dir():
            return path
    return None


@pytest.fixture
def omniglot() -> Path:
    root = omniglot_root()
    if root is None:
        pytest.skip("Omniglot not found (set RANKOPT_OMNIGLOT or place it in ../shared/data/omniglot)")
    return root


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.manual_seed(0)
    yield
