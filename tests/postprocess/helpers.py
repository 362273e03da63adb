"""SYNTHETIC embeddings for the post-processing tests (all generated with fixed seeds)."""

from __future__ import annotations

import torch

from rankopt.metrics import evaluate


def mean_ap(query: torch.Tensor, labels: torch.Tensor, gallery: torch.Tensor | None = None,
            gallery_labels: torch.Tensor | None = None, **kwargs) -> float:
    """mAP with rankopt's exact metrics (self-retrieval when ``gallery`` is None)."""
    return evaluate(query, labels, gallery, gallery_labels, metrics=["map"], **kwargs).metrics["map"]


def clustered(classes: int, per_class: int, dim: int, *, spread: float, seed: int,
              centres: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SYNTHETIC: ``(x, labels, centres)``, unit class centres plus Gaussian noise of std ``spread``."""
    gen = torch.Generator().manual_seed(seed)
    if centres is None:
        centres = torch.nn.functional.normalize(torch.randn(classes, dim, generator=gen), dim=1)
    labels = torch.arange(classes).repeat_interleave(per_class)
    x = centres[labels] + spread * torch.randn(len(labels), dim, generator=gen)
    return x, labels, centres
