"""Tiny untrained checkpoints: a 16-d built-in CNN saved as rankopt saves a training checkpoint."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from rankopt.config import config_to_dict, load_config
from rankopt.engine.assembly import build_model
from rankopt.engine.checkpoint import save_checkpoint

TINY = ["model.backbone=convnet_tiny", "model.embedding_dim=16", "data.image_size=32"]


def write_checkpoint(path: Path, overrides: Sequence[str] = (), seed: int = 0) -> Path:
    """An untrained tiny model (:data:`TINY`, then ``overrides``) saved as a training checkpoint, its weights drawn
    with ``seed``."""
    cfg = load_config(None, [*TINY, *overrides])
    torch.manual_seed(seed)
    model = build_model(cfg)
    return save_checkpoint(path, {"model": model.state_dict(), "config": config_to_dict(cfg)})
