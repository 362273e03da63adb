"""A messy photo folder (truncated, empty, not-an-image and odd-but-valid files) through ``rankopt index``,
``index-add`` and the decode check they share (:mod:`rankopt.data.readable`): the unreadable files are left out and
listed, or refused all at once with ``--strict``; nothing is written into the photos' folder."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from helpers.images import class_tree
from PIL import Image

from rankopt.cli import main
from rankopt.data import DatasetProblems
from rankopt.data.image_files import decode_problem
from rankopt.data.readable import readable_images
from rankopt.search import Index


def jpeg_bytes(size: int = 128, mode: str = "RGB") -> bytes:
    """A noisy JPEG (its scan long enough that a cut one is truncated, not headless)."""
    noise = np.random.default_rng(size).integers(0, 255, (size, size, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(noise).convert(mode).save(buffer, format="JPEG")
    return buffer.getvalue()


def messy(root: Path) -> dict[str, Path]:
    """A class tree of 12 readable PNGs, plus in ``alpha/one``: a truncated JPEG, an empty file, a text file
    named .jpg, and readable oddities (a CMYK JPEG, a 16-bit grey PNG, an RGBA PNG, a PNG named .JPG)."""
    class_tree(root)
    folder = root / "alpha" / "one"
    bad = {"cut": folder / "cut.jpg", "empty": folder / "empty.jpg", "text": folder / "notes.jpg"}
    bad["cut"].write_bytes(jpeg_bytes()[:-400])
    bad["empty"].write_bytes(b"")
    bad["text"].write_text("not a photo")
    (folder / "cmyk.jpg").write_bytes(jpeg_bytes(64, "CMYK"))
    Image.fromarray(np.full((20, 20), 40000, dtype=np.uint16)).save(folder / "grey16.png")
    Image.new("RGBA", (20, 20), (10, 200, 30, 128)).save(folder / "alpha.png")
    Image.new("RGB", (20, 20), (1, 2, 3)).save(folder / "upper.JPG", format="PNG")
    return bad


def test_the_check_decodes_each_file_and_names_what_is_wrong(tmp_path):
    bad = messy(tmp_path / "photos")
    assert "truncated" in decode_problem(str(bad["cut"])).lower()
    assert decode_problem(str(bad["empty"])) == "empty file (0 bytes)"
    assert decode_problem(str(bad["text"])) == "not an image file Pillow can read"
    assert decode_problem(str(tmp_path / "gone.jpg")).startswith("cannot be read")
    for name in ("cmyk.jpg", "grey16.png", "alpha.png", "upper.JPG"):
        assert decode_problem(str(tmp_path / "photos" / "alpha" / "one" / name)) is None
    dataset, skipped = readable_images(tmp_path / "photos")
    assert len(dataset) == 12 + 4 and [line.split(":")[0] for line in skipped] == sorted(str(p) for p in bad.values())
    assert all(str(p) not in dataset.paths for p in bad.values())
    with pytest.raises(DatasetProblems) as refused:
        readable_images(tmp_path / "photos", strict=True)
    assert all(p.name in str(refused.value) for p in bad.values())  # every bad file named at once


def test_index_leaves_unreadable_photos_out_and_lists_them(tmp_path, checkpoint, capsys):
    photos = tmp_path / "photos"
    bad = messy(photos)
    before = sorted(p.name for p in photos.rglob("*"))
    out = tmp_path / "idx"
    assert main(["index", str(checkpoint), "--images", str(photos), "--out", str(out), "--device", "cpu",
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f"left out 3 unreadable image(s), listed in {out / 'skipped.txt'}" in printed
    listed = (out / "skipped.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in listed] == sorted(str(p) for p in bad.values())
    index = Index.load(out)
    assert len(index) == 16 and not set(map(str, bad.values())) & set(index.paths)
    assert sorted(p.name for p in photos.rglob("*")) == before  # nothing written into the photos' folder
    # --strict refuses, naming every bad file, and writes no index
    assert main(["index", str(checkpoint), "--images", str(photos), "--out", str(tmp_path / "strict"), "--strict",
                 "--device", "cpu", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert all(p.name in err for p in bad.values()) and not (tmp_path / "strict").exists()


def test_index_add_appends_what_it_left_out(tmp_path, checkpoint, tree, capsys):
    out = tmp_path / "idx"
    assert main(["index", str(checkpoint), "--images", str(tree), "--out", str(out), "--no-progress"]) == 0
    assert not (out / "skipped.txt").exists()
    more = tmp_path / "more"
    class_tree(more, seed=1)
    (more / "beta" / "four" / "cut.jpg").write_bytes(jpeg_bytes()[:-400])
    capsys.readouterr()
    assert main(["index-add", str(out), "--images", str(more), "--no-progress"]) == 0
    assert "left out 1 unreadable image(s)" in capsys.readouterr().out
    assert len(Index.load(out)) == 24
    assert (out / "skipped.txt").read_text().count("cut.jpg") == 1
