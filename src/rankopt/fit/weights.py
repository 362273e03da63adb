"""The pretrained checkpoint a fit starts from: a release by name (rankopt's cache, fetched once), a hub backbone
(``timm:NAME``, ``open_clip:MODEL/TAG``: its hub weights or a same-architecture file, converted once) or a file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rankopt.engine.checkpoint import load_checkpoint
from rankopt.engine.weights import (
    cached_checkpoint,
    cached_hub_checkpoint,
    checkpoint_from_file,
    hub_checkpoint,
    pretrained_checkpoint,
)
from rankopt.models.backbones import build_backbone, is_hub_backbone


def _is_rankopt_checkpoint(path: Path) -> bool:
    try:
        state = load_checkpoint(path)
    except (ValueError, OSError, RuntimeError):
        return False
    return isinstance(state, dict) and "model" in state and "config" in state


def resolve_checkpoint(backbone: str, weights: str | None, *, say: Callable[[str], None] = print) -> Path:
    """``weights`` when it is a rankopt checkpoint; for a hub ``backbone``, its checkpoint converted once from
    ``weights`` (a same-architecture file) or the hub's weights; a released file of ``backbone`` (sha256 checked,
    converted once); else the release named ``backbone`` from the cache, fetched when absent."""
    path = None
    if weights is not None:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"weights file {str(path)!r} does not exist")
        if _is_rankopt_checkpoint(path):
            return path
    if is_hub_backbone(backbone):
        return _hub(backbone, path, say)
    if path is not None:
        return checkpoint_from_file(backbone, path)
    cached = cached_checkpoint(backbone)
    if cached is None:
        say(f"fetching the {backbone} weights once into rankopt's cache (rankopt weights fetch {backbone})")
        cached = pretrained_checkpoint(backbone)
    return cached


def _hub(backbone: str, path: Path | None, say: Callable[[str], None]) -> Path:
    """The hub backbone's checkpoint, said in one line (where the weights are cached, their licence); a backbone
    fit cannot cut into stages is refused before its weights are fetched."""
    if cached_hub_checkpoint(backbone, path) is None:
        build_backbone(backbone).stages()  # type: ignore[operator]  # a clear error for a backbone fit cannot cut
    checkpoint, record, converted = hub_checkpoint(backbone, path)
    origin = (f"weights of {record.get('weights')}" if path is not None else
              f"weights from the model hub, cached by {backbone.split(':')[0]} in {record.get('hub_cache')}")
    say(f"{backbone}: {origin}, licence {record.get('licence', 'unknown')}; "
        f"{'converted once into' if converted else 'converted before, in'} rankopt's cache: {checkpoint}")
    return checkpoint
