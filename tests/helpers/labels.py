"""Label matrices with a consistent hierarchy, drawn at random."""

from __future__ import annotations

import numpy as np
import torch


def random_hierarchy(n: int, rng: np.random.Generator, fine: int = 6, per_coarse: int = 2) -> torch.Tensor:
    """(N, 3) consistent labels: fine -> middle (fine // per_coarse) -> coarse (middle // per_coarse)."""
    f = rng.integers(0, fine, size=n)
    m = f // per_coarse
    c = m // per_coarse
    return torch.as_tensor(np.stack([f, m, c], axis=1))
