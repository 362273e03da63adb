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
from rankopt.data.image_folder import folder_dataset
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


@pytest.mark.parametrize("workers", [0, 1], ids=["threads-reading-ahead", "dataloader-worker"])
def test_the_embedding_pass_finds_unreadable_images_decoding_each_photo_once(tmp_path, checkpoint, monkeypatch,
                                                                             workers):
    """The default path: no decode check before the pass (decode_problem runs only for the items that failed), the
    same items, labels and embeddings as the checked path, and a class whose every photo is unreadable is gone."""
    from rankopt.data import image_files, readable
    from rankopt.search.embedder import Embedder

    photos = tmp_path / "photos"
    bad = messy(photos)
    (photos / "beta" / "gone").mkdir(parents=True)
    bad["lone"] = photos / "beta" / "gone" / "lone.jpg"
    bad["lone"].write_bytes(jpeg_bytes()[:-400])
    embedder = Embedder.from_checkpoint(checkpoint, progress=False, num_workers=workers)
    checked, _ = readable_images(photos)
    expected = embedder.embed(checked)
    calls = []
    monkeypatch.setattr(readable, "decode_problem", lambda path: calls.append(path) or image_files.decode_problem(path))
    skipped = ["earlier line"]
    dataset, split = embedder.embed_images(photos, skipped=skipped)
    if not workers:  # a worker process records its calls in its own copy of the list
        assert sorted(calls) == sorted(str(p) for p in bad.values())  # only the failures were checked
    assert skipped[0] == "earlier line"
    assert [line.split(":")[0] for line in skipped[1:]] == sorted(map(str, bad.values()))
    assert split.paths == dataset.paths == checked.paths
    assert np.array_equal(split.labels.numpy(), checked.labels) and np.array_equal(dataset.labels, checked.labels)
    names = dataset.metadata["label_names"]
    assert names == checked.metadata["label_names"] and "gone" not in str(names)
    assert "gone" in str(folder_dataset(photos).metadata["label_names"])  # the class of unreadable photos only
    assert np.allclose(split.embeddings.numpy(), expected.embeddings.numpy(), atol=1e-6)


def test_a_readable_photo_that_fails_raises_instead_of_being_left_out(tmp_path, checkpoint, tree):
    """Only an image decode_problem calls unreadable is left out: a failure in the transform of a good photo (a bug,
    not bad input) raises as it would without skipping."""
    from rankopt.search.embedder import Embedder

    embedder = Embedder.from_checkpoint(checkpoint, progress=False)

    def broken(image):
        raise RuntimeError("a transform bug")

    embedder.transform = broken
    with pytest.raises(RuntimeError, match="a transform bug"):
        embedder.embed_images(tree, skipped=[])


def test_skipping_needs_one_process_and_no_output_file_and_at_least_one_readable_photo(tmp_path, checkpoint):
    from rankopt.engine.embed_and_score import embed_dataset
    from rankopt.search.embedder import Embedder

    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "a.jpg").write_bytes(b"")
    (photos / "b.jpg").write_text("text")
    embedder = Embedder.from_checkpoint(checkpoint, progress=False)
    with pytest.raises(ValueError, match="none of the 2 image"):
        embedder.embed_images(photos, skipped=[])
    with pytest.raises(ValueError, match="unreadable= needs one process and no out="):
        embed_dataset(embedder.network, [], out=tmp_path / "x.npy", unreadable={})
