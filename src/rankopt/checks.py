"""Input validation shared by metrics, losses and the engine.

Every check raises ``ValueError`` (or ``TypeError`` for dtypes) with a message
that names the argument and the offending rows, so that bad input never turns
into a silent NaN.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

FINITE_CHECK_ROWS = 65536
"""Rows checked for NaN/Inf at a time (bounded memory on memory-mapped embeddings)."""

_MAX_LISTED = 5


def _rows(idx: torch.Tensor) -> str:
    rows = idx.flatten().tolist()
    shown = ", ".join(str(r) for r in rows[:_MAX_LISTED])
    more = f" and {len(rows) - _MAX_LISTED} more" if len(rows) > _MAX_LISTED else ""
    return f"{shown}{more}"


def check_embeddings(x: torch.Tensor, name: str = "embeddings", min_rows: int = 1) -> torch.Tensor:
    """Check a ``(N, D)`` floating tensor with finite values and at least ``min_rows`` rows."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (N, D), got {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got {x.dtype}")
    if x.shape[0] < min_rows:
        raise ValueError(f"{name} has {x.shape[0]} rows; at least {min_rows} needed")
    if x.shape[1] == 0:
        raise ValueError(f"{name} has 0 dimensions")
    if x.shape[0] <= FINITE_CHECK_ROWS and bool(torch.isfinite(x).all()):
        return x  # the common case in two calls (a served query pays each torch call)
    # row blocks: a memory-mapped set is read block by block, never copied whole
    bad = (torch.cat([~torch.isfinite(x[start : start + FINITE_CHECK_ROWS]).all(dim=1)
                      for start in range(0, x.shape[0], FINITE_CHECK_ROWS)])
           if x.shape[0] else torch.zeros(0, dtype=torch.bool))
    if bool(bad.any()):
        idx = bad.nonzero().flatten()
        raise ValueError(f"{name} has {idx.numel()} row(s) with NaN or Inf values: rows {_rows(idx)}")
    return x


def check_integer(values: torch.Tensor, name: str) -> torch.Tensor:
    """Raise ``TypeError`` unless ``values`` holds integers (not floats, complex numbers or bools)."""
    if values.dtype.is_floating_point or values.dtype.is_complex or values.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {values.dtype}")
    return values


def check_labels(labels: torch.Tensor, num_rows: int, name: str = "labels") -> torch.Tensor:
    """Check 1-D ``(N,)`` or 2-D ``(N, L)`` integer labels with ``N == num_rows``.

    Returns the labels as a ``(N, L)`` int64 matrix (column 0 = finest level,
    last column = coarsest), the convention used throughout rankopt.
    """
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(labels).__name__}")
    check_integer(labels, name)
    if labels.ndim == 1:
        labels = labels.unsqueeze(1)
    elif labels.ndim != 2:
        raise ValueError(f"{name} must have shape (N,) or (N, L), got {tuple(labels.shape)}")
    if labels.shape[0] != num_rows:
        raise ValueError(f"{name} has {labels.shape[0]} rows but the embeddings have {num_rows}")
    if labels.shape[1] == 0:
        raise ValueError(f"{name} has 0 levels")
    return labels.long()


def cpu_embeddings(x: Any, name: str) -> torch.Tensor:
    """``x`` (a tensor or numpy array) checked by :func:`check_embeddings`, as a detached float32 CPU tensor."""
    tensor = check_embeddings(torch.from_numpy(np.asarray(x)) if isinstance(x, np.ndarray) else x, name)
    if tensor.dtype == torch.float32 and tensor.device.type == "cpu" and not tensor.requires_grad:
        return tensor  # already so: three torch calls fewer on a served query's path
    return tensor.detach().float().cpu()


def cpu_labels(labels: Any, rows: int) -> torch.Tensor:
    """``labels`` (a tensor or numpy array) checked by :func:`check_labels` as ``(rows, L)`` int64 on the CPU;
    ``None``: one unknown (-1) label per row."""
    if labels is None:
        return torch.full((rows, 1), -1, dtype=torch.long)
    tensor = torch.from_numpy(np.asarray(labels)) if isinstance(labels, np.ndarray) else labels
    return check_labels(tensor, rows, "labels").cpu()


def check_finite_scalar(value: torch.Tensor, what: str) -> torch.Tensor:
    """Raise if a loss (or any scalar) is NaN or Inf."""
    if not bool(torch.isfinite(value).all()):
        raise FloatingPointError(f"{what} is not finite ({value.detach().flatten()[:4].tolist()})")
    return value


ImageSize = int | str | tuple[int, int] | list[int] | None
"""An output size: ``S``, ``"S"``, ``"HxW"`` or ``(H, W)``; ``None``: the preset's."""


def parse_image_size(size: ImageSize) -> tuple[int, int | None] | None:
    """``(H, W)`` of an :data:`ImageSize` (``W`` None: the preset's aspect), or None; a clear error otherwise."""
    if size is None:
        return None
    if isinstance(size, str):
        parts = size.lower().replace("×", "x").split("x")
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise ValueError(f"image size {size!r}: expected S or HxW in pixels, e.g. 224 or 112x96") from None
    elif isinstance(size, (tuple, list)):
        values = [int(v) for v in size]
    else:
        values = [int(size)]
    if len(values) not in (1, 2) or min(values) < 8:
        raise ValueError(f"image size {size!r}: expected S or HxW with sides >= 8 pixels")
    return values[0], (values[1] if len(values) == 2 else None)


def canonical_image_size(size: ImageSize) -> int | str | None:
    """One spelling per size (for configs and fingerprints): None, ``S`` as an int, or ``"HxW"``."""
    parsed = parse_image_size(size)
    if parsed is None:
        return None
    return parsed[0] if parsed[1] is None else f"{parsed[0]}x{parsed[1]}"
