"""SYNTHETIC vectors for the tests: 'images' that are 4-d points (:class:`Points`), and clustered embeddings
(:func:`clustered`)."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset


class Points(Dataset):
    """SYNTHETIC: 'images' are 4-d vectors; the model is a linear map."""

    def __init__(self, n: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 4, generator=gen)
        self.labels = np.arange(n).reshape(-1, 1) % 5
        self.paths = [f"p{i}" for i in range(n)]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"image": self.x[i], "label": torch.tensor(self.labels[i]), "index": i, "path": self.paths[i]}


def clustered(n_classes: int, per_class: int, dim: int, spread: float, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """``n_classes`` random unit centres, ``per_class`` points around each (``spread``), normalised; their labels."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(n_classes, dim, generator=g)
    labels = np.repeat(np.arange(n_classes), per_class)
    x = centres[torch.as_tensor(labels)] + spread * torch.randn(len(labels), dim, generator=g)
    return torch.nn.functional.normalize(x, dim=1), labels
