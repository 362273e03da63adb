"""Weights computed from the training images before training: the projection's PCA initialisation
(``model.pca_init_images``) and the loss's class weights from class means (``loss.init=class_means``)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Subset

from rankopt.config import ExperimentConfig
from rankopt.data import build_dataset
from rankopt.engine.embed_and_score import EmbeddedSplit
from rankopt.losses import init_class_means

Embed = Callable[[nn.Module, Any, str], EmbeddedSplit]
"""``embed(module, dataset, desc)``: ``module``'s outputs on ``dataset`` (the trainer's: under DDP every rank
starts from rank 0's weights and shares the computation)."""


class Descriptors(nn.Module):
    """The model's pre-projection descriptors as a module (for :func:`rankopt.engine.embed_and_score.embed_dataset`)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model.descriptors(images)


def init_projection_pca(model: nn.Module, cfg: ExperimentConfig, num_images: int, transform: Any, embed: Embed,
                        device: torch.device) -> None:
    """PCA initialisation of ``model``'s projection from the descriptors of ``num_images`` training images
    (evenly spaced, test ``transform``)."""
    d = cfg.data
    dataset = build_dataset(d.name, d.root, d.train_split, transform=transform, **d.kwargs)
    picked = np.linspace(0, len(dataset) - 1, min(num_images, len(dataset))).round().astype(int)
    subset = Subset(dataset, sorted(set(picked.tolist())))
    subset.labels, subset.paths = dataset.labels[subset.indices], [dataset.paths[i] for i in subset.indices]
    descriptors = embed(Descriptors(model), subset, "PCA descriptors")
    model.init_projection_pca(descriptors.embeddings.to(device))


def init_loss_class_means(model: nn.Module, loss_fn: nn.Module, train_ds: Any, transform: Any, embed: Embed,
                          device: torch.device) -> None:
    """``loss.init=class_means``: the loss's class weights (:func:`rankopt.losses.init_class_means`) from the
    embeddings of every training image by ``model`` before training (test ``transform``)."""
    dataset = copy.copy(train_ds)
    dataset.transform = transform
    split = embed(model, dataset, "class means")
    init_class_means(loss_fn, split.embeddings.to(device), split.labels.to(device))
