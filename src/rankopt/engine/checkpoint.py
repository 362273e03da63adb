"""Atomic checkpoints that load without executing pickled code.

A checkpoint is a plain dict of containers, numbers, strings and tensors
(model/optimizer/scheduler/scaler/memory/sampler state dicts, RNG states, the
config as a dict). It is written to a temporary file in the same folder,
flushed and fsynced, then renamed over the target with ``os.replace``, so a
crash never leaves a truncated checkpoint. Loading uses
``torch.load(weights_only=True)``, which refuses arbitrary pickled objects.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_DIR = "checkpoints"
LAST = "last.ckpt"
BEST = "best.ckpt"


def save_checkpoint(path: str | Path, state: Mapping[str, Any]) -> Path:
    """Write ``state`` atomically to ``path`` (temp file + fsync + ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(dict(state), handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` (no arbitrary code execution)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(_refused_message(path, str(err))) from None
    except (RuntimeError, EOFError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"cannot read checkpoint {str(path)!r}: {first} (truncated, or not written by torch.save?)") from None
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {str(path)!r} holds a {type(state).__name__}, not a dict")
    return state


def _refused_message(path: Path, torch_message: str) -> str:
    """Why a checkpoint with pickled Python objects is refused, and how to convert one the user trusts."""
    found = re.search(r"GLOBAL ([\w.]+)", torch_message)
    what = f" (it refers to {found.group(1)})" if found else ""
    return (
        f"checkpoint {str(path)!r} holds pickled Python objects beyond tensors, numbers, strings and "
        f"containers{what}. rankopt never unpickles checkpoints: it loads them weights-only, so that opening "
        "a file cannot run code. If you trust this file, convert it once to plain values, e.g.\n"
        "  python -c \"import torch; s = torch.load('IN.ckpt', weights_only=False); "
        "m = s['model']; torch.save({'model': m.state_dict() if hasattr(m, 'state_dict') else dict(m), "
        "'config': dict(s['config'])}, 'OUT.ckpt')\"\n"
        "(a rankopt checkpoint holds 'model': a state dict of tensors, and 'config': the run's config as a plain dict)"
    )


def resolve_resume(resume: str, run_dir: str | Path) -> Path | None:
    """``"auto"`` -> ``run_dir/checkpoints/last.ckpt`` if it exists (else ``None``); otherwise the given path."""
    if resume == "auto":
        last = Path(run_dir) / CHECKPOINT_DIR / LAST
        return last if last.is_file() else None
    path = Path(resume)
    if not path.is_file():
        raise FileNotFoundError(f"cannot resume: checkpoint {resume!r} does not exist")
    return path


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA RNG states as weights-only-loadable values."""
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # type: ignore[misc]
    return {
        "python": random.getstate(),
        "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore the states saved by :func:`rng_state`."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"],
                         npy["has_gauss"], npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"].cpu())
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
