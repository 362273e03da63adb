"""Caltech-101 and Extended Yale B (cropped) on tiny copies in their native layouts (real folder and
file names, stray files, excluded folders and images, a corrupt image), and on the real copies
named by RANKOPT_CALTECH101 / RANKOPT_YALEB when set (skipped otherwise)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rankopt.cli.datasets import dataset_report
from rankopt.data import BadImageError, DatasetProblems, build_dataset, evaluation_splits
from rankopt.data.splits import carve_validation

# --------------------------------------------------------------------------- Caltech-101
CALTECH_IMAGES = {  # class folder -> number of images, as the release names them (image_0001.jpg, ...)
    "BACKGROUND_Google": 2, "Faces": 3, "Faces_easy": 3, "Leopards": 1, "accordion": 2, "helicopter": 1,
    "ibis": 2, "yin_yang": 1,
}
CALTECH_TRAIN = ["Faces", "Leopards", "accordion", "helicopter"]  # sorted() order: capitals first
CALTECH_TEST = ["ibis", "yin_yang"]


def jpeg(path: Path, shade: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (12, 9), (shade, 10, 200)).save(path, format="JPEG")


@pytest.fixture
def caltech(tmp_path: Path) -> Path:
    """``tmp/101_ObjectCategories`` with the classes of :data:`CALTECH_IMAGES` and stray files."""
    root = tmp_path / "101_ObjectCategories"
    for shade, (folder, count) in enumerate(CALTECH_IMAGES.items()):
        for i in range(1, count + 1):
            jpeg(root / folder / f"image_{i:04d}.jpg", 20 * shade)
    (root / "BACKGROUND_Google" / "tmp").write_bytes(b"stray")
    (root / "accordion" / "Thumbs.db").write_bytes(b"stray")
    (root / "accordion" / ".DS_Store").write_bytes(b"hidden")
    return root


def class_of(path: str) -> str:
    return Path(path).parent.name


def test_caltech_class_disjoint_split_in_sorted_order(caltech):
    for split, classes in (("train", CALTECH_TRAIN), ("test", CALTECH_TEST)):
        ds = build_dataset("caltech101", caltech, split)
        expected = [str(caltech / c / f"image_{i:04d}.jpg") for c in classes for i in range(1, CALTECH_IMAGES[c] + 1)]
        assert ds.paths == expected  # BACKGROUND_Google, Faces_easy, stray and hidden files left out
        assert ds.level_names == ("category",) and ds.metadata["label_names"] == [classes]
        assert [classes[k] for k in ds.labels[:, 0]] == [class_of(p) for p in ds.paths]
    assert evaluation_splits("caltech101") == ("test",)


def test_caltech_root_may_be_the_parent_and_notes_name_the_left_out(caltech):
    ds = build_dataset("caltech101", caltech.parent, "train")
    assert ds.paths == build_dataset("caltech101", caltech, "train").paths
    notes = "\n".join(ds.metadata["notes"])
    assert "BACKGROUND_Google: left out (clutter" in notes and "Faces_easy: left out" in notes
    assert "Thumbs.db: not a .jpg file" in notes and ".DS_Store" not in notes


def test_caltech_missing_folder_keeps_the_other_classes_on_their_side(caltech):
    shutil.rmtree(caltech / "accordion")
    assert build_dataset("caltech101", caltech, "train").metadata["label_names"] == [["Faces", "Leopards", "helicopter"]]
    assert build_dataset("caltech101", caltech, "test").metadata["label_names"] == [CALTECH_TEST]


def test_caltech_problems_and_errors(caltech, tmp_path):
    (caltech / "ibis_empty").mkdir()
    with pytest.raises(DatasetProblems, match="ibis_empty: class folder without any .jpg image"):
        build_dataset("caltech101", caltech, "test")
    report = dataset_report("caltech101", str(caltech), None, {}, verify=False)
    assert not report["ok"] and any("ibis_empty" in line for line in report["problems"])
    assert report["splits"]["test"]["found"] == {"images": 3, "category": 2}  # the others counted anyway
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_dataset("caltech101", tmp_path / "nowhere", "train")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no class folder with .jpg images"):
        build_dataset("caltech101", tmp_path / "empty", "train")


def test_caltech_corrupt_image(caltech):
    (caltech / "ibis" / "image_0002.jpg").write_bytes(b"not a jpeg")
    ds = build_dataset("caltech101", caltech, "test")
    with pytest.raises(BadImageError, match=r"ibis/image_0002\.jpg"):
        ds[1]
    with pytest.warns(UserWarning, match="skipped 1 bad image"):
        skipped = build_dataset("caltech101", caltech, "test", on_bad_image="skip")
    assert [Path(p).name for p in skipped.paths] == ["image_0001.jpg", "image_0001.jpg"]
    assert skipped.metadata["num_bad_images"] == 1 and "ibis/image_0002.jpg" in skipped.metadata["bad_images"][0]
    assert skipped[0]["image"].shape == (3, 9, 12)


# --------------------------------------------------------------------------- Extended Yale B
YALE_FACES = {  # subject folder -> (azimuth, elevation) of its faces
    "yaleB01": [(0, 0), (-35, 40), (110, -20)],
    "yaleB20": [(-130, 20), (5, -10)],
    "yaleB21": [(0, 90), (-5, -10), (95, 0)],
    "yaleB39": [(120, 0), (-70, -35)],
}
YALE_TRAIN, YALE_TEST = ["yaleB01", "yaleB20"], ["yaleB21", "yaleB39"]


def face_name(subject: str, azimuth: int, elevation: int) -> str:
    return f"{subject}_P00A{azimuth:+04d}E{elevation:+03d}.pgm"


def pgm(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("L", (7, 8), value).save(path, format="PPM")  # binary PGM (P5) for mode L


@pytest.fixture
def yale(tmp_path: Path) -> Path:
    """``tmp/CroppedYale`` with the faces of :data:`YALE_FACES`, an ambient image per subject and
    the release's stray files (``.info``, ``WS_FTP.LOG``, ``DEADJOE``, a ``.pgm.bad``)."""
    root = tmp_path / "CroppedYale"
    for k, (subject, faces) in enumerate(YALE_FACES.items()):
        for j, (azimuth, elevation) in enumerate(faces):
            pgm(root / subject / face_name(subject, azimuth, elevation), 10 * k + j)
        pgm(root / subject / f"{subject}_P00_Ambient.pgm", 255)
        (root / subject / f"{subject}_P00.info").write_text(f"{subject}_P00A+000E+00.pgm\n")
        (root / subject / "WS_FTP.LOG").write_text("log\n")
    (root / "yaleB01" / "DEADJOE").write_text("*** JOE was aborted\n")
    pgm(root / "yaleB21" / "yaleB21_P00A+050E-40.pgm.bad", 0)
    return root


def angles_of(path: str) -> tuple[int, int]:
    """Azimuth and elevation read back from a face name (the test's own parser)."""
    azimuth, elevation = re.search(r"A([+-]\d+)E([+-]\d+)\.pgm$", path).groups()
    return int(azimuth), int(elevation)


def assert_metadata_aligned(ds) -> None:
    assert ds.metadata["azimuth"].dtype == np.int64 and len(ds.metadata["azimuth"]) == len(ds)
    assert [angles_of(p) for p in ds.paths] == list(zip(ds.metadata["azimuth"].tolist(), ds.metadata["elevation"].tolist()))
    assert ds.metadata["pose"].tolist() == [0] * len(ds)


def test_yaleb_identity_disjoint_split_and_signed_angles(yale):
    for split, subjects in (("train", YALE_TRAIN), ("test", YALE_TEST)):
        ds = build_dataset("yaleb", yale, split)
        expected = sorted(str(yale / s / face_name(s, a, e)) for s in subjects for a, e in YALE_FACES[s])
        assert ds.paths == expected  # ambient, .info, WS_FTP.LOG, DEADJOE and .pgm.bad left out
        assert ds.level_names == ("subject",) and ds.metadata["label_names"] == [subjects]
        assert [subjects[k] for k in ds.labels[:, 0]] == [class_of(p) for p in ds.paths]
        assert_metadata_aligned(ds)
        assert sorted(zip(ds.metadata["azimuth"].tolist(), ds.metadata["elevation"].tolist())) == sorted(
            angle for s in subjects for angle in YALE_FACES[s])
    assert evaluation_splits("yaleb") == ("test",)
    assert "1 *.pgm.bad file(s)" in build_dataset("yaleb", yale, "test").metadata["notes"][0]


def test_yaleb_grayscale_decoded_as_rgb(yale):
    ds = build_dataset("yaleb", yale, "train")
    for i, path in enumerate(ds.paths):
        subject = class_of(path)
        value = 10 * list(YALE_FACES).index(subject) + YALE_FACES[subject].index(angles_of(path))  # as written
        image = ds[i]["image"]
        assert image.shape == (3, 8, 7) and np.allclose(image.numpy(), value / 255, atol=1e-6), path


def test_yaleb_metadata_follows_skips_and_carved_splits(yale):
    (yale / "yaleB01" / face_name("yaleB01", -35, 40)).write_bytes(b"P5 not a pgm")
    with pytest.warns(UserWarning, match="skipped 1 bad image"):
        skipped = build_dataset("yaleb", yale, "train", on_bad_image="skip")
    assert len(skipped) == 4 and skipped.metadata["num_bad_images"] == 1
    assert_metadata_aligned(skipped)
    full = build_dataset("yaleb", yale, "train")
    train, validation = carve_validation(full, 0.5, level=0, seed=0)
    for part in (train, validation):
        assert_metadata_aligned(part)
    assert {class_of(p) for p in train.paths}.isdisjoint({class_of(p) for p in validation.paths})
    assert sorted(train.paths + validation.paths) == full.paths


@pytest.mark.parametrize(("name", "problem"), [
    ("yaleB01_P00A+00E+00.pgm", "yaleB01_P00A+00E+00.pgm: not a face file name"),
    ("yaleB01_P00A+000E+00.PGM.pgm", "not a face file name"),
    ("yaleB20_P00A+000E+00.pgm", "a face of yaleB20 in the folder of yaleB01"),
])
def test_yaleb_bad_names_are_problems(yale, name, problem):
    pgm(yale / "yaleB01" / name, 3)
    with pytest.raises(DatasetProblems, match=re.escape(problem)):
        build_dataset("yaleb", yale, "train")
    report = dataset_report("yaleb", str(yale), None, {}, verify=False)
    assert not report["ok"] and any(problem in line for line in report["problems"])
    assert report["splits"]["train"]["found"] == {"images": 5, "subject": 2}  # the bad file left out


def test_yaleb_folder_problems_and_errors(yale, tmp_path):
    (yale / "extras").mkdir()
    for stray in (yale / "yaleB39").glob("*_P00A*.pgm"):
        stray.unlink()
    with pytest.raises(DatasetProblems) as err:
        build_dataset("yaleb", yale, "test")
    assert any("extras: not a subject folder" in line for line in err.value.problems)
    assert any("yaleB39: subject folder without any face image" in line for line in err.value.problems)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_dataset("yaleb", tmp_path / "nowhere", "train")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no yaleBNN folder with faces"):
        build_dataset("yaleb", tmp_path / "empty", "train")


# --------------------------------------------------------------------------- the real copies
def real_root(variable: str) -> Path:
    value = os.environ.get(variable)
    if not value or not Path(value).is_dir():
        pytest.skip(f"set {variable} to the real copy to run this test")
    return Path(value)


def test_real_caltech101_published_counts():
    root = real_root("RANKOPT_CALTECH101")
    report = dataset_report("caltech101", str(root), None, {}, verify=False)
    assert report["ok"], report
    assert {s: e["found"] for s, e in report["splits"].items()} == {s: e["published"] for s, e in report["splits"].items()}
    folder = root / "101_ObjectCategories" if (root / "101_ObjectCategories").is_dir() else root
    classes = sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name not in ("BACKGROUND_Google", "Faces_easy"))
    assert len(classes) == 100
    assert build_dataset("caltech101", root, "train").metadata["label_names"] == [classes[:50]]
    assert sum(1 for _ in folder.rglob("*.jpg")) == 9144


def test_real_yaleb_published_counts():
    root = real_root("RANKOPT_YALEB")
    report = dataset_report("yaleb", str(root), None, {}, verify=False)
    assert report["ok"], report
    assert {s: e["found"] for s, e in report["splits"].items()} == {s: e["published"] for s, e in report["splits"].items()}
    train, test = build_dataset("yaleb", root, "train"), build_dataset("yaleb", root, "test")
    assert len(train) + len(test) == 2414 and len(list(root.glob("*/*.pgm"))) == 2452
    for ds in (train, test):
        assert_metadata_aligned(ds)
        assert -130 <= ds.metadata["azimuth"].min() and ds.metadata["azimuth"].max() <= 130
