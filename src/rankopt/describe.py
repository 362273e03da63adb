"""Plain-dict descriptions recorded beside results (run folders, indexes, ONNX exports, benchmark tables):
the machine that computed them and the model that embedded them."""

from __future__ import annotations

import os
import platform
import sys
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


def model_info(model: torch.nn.Module, backbone: str) -> dict[str, Any]:
    """``{"backbone", "embedding_dim", "parameters"}`` of an embedding model."""
    return {"backbone": backbone, "embedding_dim": int(getattr(model, "embedding_dim", 0)),
            "parameters": int(sum(p.numel() for p in model.parameters()))}
