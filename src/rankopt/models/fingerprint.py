"""A model's fingerprint: what must match for two embeddings to be comparable.

``fingerprint = sha256(state dict (names, dtypes, shapes and bytes, in name order) + JSON(preprocessing))``,
first 16 hex digits. ``preprocessing`` holds every setting that changes an embedding besides the
weights (test transform, image size, multi-scale scales, whitening, ...), so an index built with
one pipeline refuses queries embedded by another.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

FINGERPRINT_DIGITS = 16


def tensor_digest(tensors: Mapping[str, torch.Tensor]) -> Any:
    """sha256 over named tensors in name order: name, dtype, shape and the raw bytes (on CPU)."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        value = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{value.dtype}|{tuple(value.shape)}|".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes() if value.numel() else b"")
    return digest


def model_fingerprint(model: nn.Module, preprocessing: Mapping[str, Any] | None = None) -> str:
    """The fingerprint of ``model``'s weights and buffers together with ``preprocessing`` (JSON-able)."""
    digest = tensor_digest(model.state_dict())
    digest.update(json.dumps(dict(preprocessing or {}), sort_keys=True, default=str).encode())
    return digest.hexdigest()[:FINGERPRINT_DIGITS]
