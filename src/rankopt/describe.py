"""Plain-dict descriptions recorded beside results (run folders, indexes, ONNX exports, benchmark tables):
the machine that computed them and the model that embedded them."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch


def machine_info(device: torch.device | str) -> dict[str, Any]:
    """Platform, CPU count, Python, torch version and threads, and the compute device (with the GPU's name)."""
    device = torch.device(device)
    info = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


@functools.cache
def source_commit() -> str | None:
    """The git commit of the rankopt source that runs (``+dirty`` with uncommitted changes), when it runs from a
    git checkout (an editable install); ``None`` for an installed release (its version says what it is)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "src"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def model_info(model: torch.nn.Module, backbone: str) -> dict[str, Any]:
    """``{"backbone", "embedding_dim", "parameters"}`` of an embedding model."""
    return {"backbone": backbone, "embedding_dim": int(getattr(model, "embedding_dim", 0)),
            "parameters": int(sum(p.numel() for p in model.parameters()))}
