"""The pretrained checkpoint a fit starts from: a release by name (rankopt's cache, fetched once) or a file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rankopt.engine.checkpoint import load_checkpoint
from rankopt.engine.weights import (
    cached_checkpoint,
    checkpoint_from_file,
    pretrained_checkpoint,
)


def _is_rankopt_checkpoint(path: Path) -> bool:
    try:
        state = load_checkpoint(path)
    except (ValueError, OSError, RuntimeError):
        return False
    return isinstance(state, dict) and "model" in state and "config" in state


def resolve_checkpoint(backbone: str, weights: str | None, *, say: Callable[[str], None] = print) -> Path:
    """``weights`` when it is a rankopt checkpoint; a released file of ``backbone`` (sha256 checked, converted
    once); else the release named ``backbone`` from the cache, fetched when absent."""
    if weights is not None:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"weights file {str(path)!r} does not exist")
        return path if _is_rankopt_checkpoint(path) else checkpoint_from_file(backbone, path)
    cached = cached_checkpoint(backbone)
    if cached is None:
        say(f"fetching the {backbone} weights once into rankopt's cache (rankopt weights fetch {backbone})")
        cached = pretrained_checkpoint(backbone)
    return cached
