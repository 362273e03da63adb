"""Loading a checkpoint for inference (``rankopt evaluate``, ``embed``, ``whiten``): the model in eval mode, its
config with the test transform asked for, and the datasets to embed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from rankopt.checks import canonical_image_size
from rankopt.config import ExperimentConfig
from rankopt.engine.assembly import build_datasets, build_transforms, model_from_checkpoint, resolve_device


class Inference(NamedTuple):
    """What :func:`load_for_inference` returns."""

    model: nn.Module
    cfg: ExperimentConfig
    datasets: dict[str, Any]
    device: torch.device
    batch_transform: Any


def load_for_inference(checkpoint: str | Path, splits: list[str] | None, *, device: str = "auto",
                       dataset: str | None = None, root: str | None = None, transform: str | None = None,
                       image_size: str | None = None, batch_size: int | None = None) -> Inference:
    """(model, config, {split: dataset}, device, batch transform or None) of ``checkpoint``, with the test
    ``transform`` and ``image_size`` (default: the checkpoint's) written into the config. ``dataset``/``root``:
    another dataset than the checkpoint's (or another folder of it). ``splits``: ``None`` for the dataset's
    evaluation splits, ``[]`` for none (no dataset is read)."""
    torch_device = resolve_device(device)
    model, cfg = model_from_checkpoint(checkpoint, torch_device)
    data = cfg.data
    if dataset is not None:
        data.eval_name, data.eval_root = dataset, root
        data.batch_transform = data.batch_transform and dataset == data.name  # other images may differ in size
    elif root is not None:
        data.eval_root = root
    data.test_transform = transform or data.test_transform
    data.image_size = canonical_image_size(image_size) or data.image_size
    data.eval_splits = splits
    if batch_size is not None:
        cfg.eval.batch_size = batch_size
    _, datasets = build_datasets(cfg, train=False)
    batch_transform = build_transforms(cfg)[1] if data.batch_transform else None
    return Inference(model, cfg, datasets, torch_device, batch_transform)
