"""Atomic checkpoints that load without executing pickled code.

A training checkpoint is a plain dict of containers, numbers, strings and tensors
(model/optimizer/scheduler/scaler/memory/sampler state dicts, RNG states, the
config as a dict). It is written to a temporary file in the same folder,
flushed and fsynced, then renamed over the target with ``os.replace``, so a
crash never leaves a truncated checkpoint. Loading uses
``torch.load(weights_only=True)``, which refuses arbitrary pickled objects.

A *model* checkpoint (``rankopt convert``: released weights, no training state) is a
safetensors file: the model's tensors, and in its header metadata the run config
(``rankopt_config``, JSON) and where the weights came from (``rankopt_source``).
:func:`load_checkpoint` reads both kinds (recognised by their first bytes) into the
same ``{"model": state_dict, "config": dict, ...}`` shape.
"""

from __future__ import annotations

import json
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

from rankopt.layout import CHECKPOINTS_DIR, LAST_CKPT



MODEL_FORMAT = "rankopt-model-checkpoint/1"


def save_checkpoint(path: str | Path, state: Mapping[str, Any]) -> Path:
    """Write ``state`` atomically to ``path`` (temp file + fsync + ``os.replace``)."""
    return _write_atomically(path, lambda handle: torch.save(dict(state), handle))


def save_model_checkpoint(path: str | Path, model_state: Mapping[str, torch.Tensor], config: Mapping[str, Any],
                          source: Mapping[str, Any] | None = None) -> Path:
    """Write a weights-only model checkpoint (safetensors; config and source in its metadata) atomically."""
    from safetensors.torch import save

    tensors = {k: v.detach().cpu().clone().contiguous() for k, v in model_state.items()}  # no shared storage
    metadata = {"format": MODEL_FORMAT, "rankopt_config": json.dumps(dict(config)),
                "rankopt_source": json.dumps(dict(source or {}))}
    return _write_atomically(path, lambda handle: handle.write(save(tensors, metadata=metadata)))


def _write_atomically(path: str | Path, write: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
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
    if _is_safetensors(path):
        return _load_model_checkpoint(path, map_location)
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise ValueError(_refused_message(path, str(err))) from None
    except (RuntimeError, EOFError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"cannot read checkpoint {str(path)!r}: {first} (truncated, or not written by "
                         "torch.save?)") from None
    if not isinstance(state, dict):
        raise ValueError(f"checkpoint {str(path)!r} holds a {type(state).__name__}, not a dict")
    return state


def _is_safetensors(path: Path) -> bool:
    """A safetensors file starts with its header's length (8 bytes, little endian) and then ``{``."""
    with path.open("rb") as handle:
        head = handle.read(9)
    return len(head) == 9 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < path.stat().st_size


def _load_model_checkpoint(path: Path, map_location: str | torch.device) -> dict[str, Any]:
    """``{"model", "config", "source"}`` of a :func:`save_model_checkpoint` file."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
        model = load_file(str(path), device=str(map_location))
    except Exception as err:  # safetensors raises its own error types
        raise ValueError(f"cannot read model checkpoint {str(path)!r}: {err}") from None
    if metadata.get("format") != MODEL_FORMAT or "rankopt_config" not in metadata:
        raise ValueError(f"{str(path)!r} is a safetensors file but not a rankopt model checkpoint (no "
                         f"format={MODEL_FORMAT!r} metadata): released weights go through `rankopt convert` "
                         "or model.kwargs.pretrained_path")
    try:
        config, source = json.loads(metadata["rankopt_config"]), json.loads(metadata.get("rankopt_source", "{}"))
    except json.JSONDecodeError as err:
        raise ValueError(f"model checkpoint {str(path)!r}: unreadable config metadata ({err})") from None
    return {"model": model, "config": config, "source": source}


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
        last = Path(run_dir) / CHECKPOINTS_DIR / LAST_CKPT
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
