"""VGGFace2 and IJB-C on tiny copies in their native layouts (real file names, headers and line
formats), and the 5-point face alignment: crops and their clipping, media ids, the identity filter,
templates and pairs, landmark alignment, every malformed input named by file:line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rankopt.cli.datasets import dataset_report
from rankopt.data import BadImageError, DatasetProblems, LabelFileError, build_dataset, dataset_spec, evaluation_splits
from rankopt.data.face_alignment import ARCFACE_TEMPLATE_112, align_face, extend_box, similarity_transform
from rankopt.metrics.verification import template_embeddings, verification_metrics


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def coded_image(path: Path, size: tuple[int, int] = (40, 30)) -> Path:
    """Pixel (x, y) holds (x, y, 77), so a crop's position can be read off its pixels (PNG content:
    lossless whatever the file's extension; Pillow reads the content)."""
    width, height = size
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    pixels[..., 0], pixels[..., 1], pixels[..., 2] = np.arange(width)[None, :], np.arange(height)[:, None], 77
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, format="PNG")
    return path


def snapshot(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in root.rglob("*")}


def rotation(angle: float) -> np.ndarray:
    return np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])


def blobs(points: np.ndarray, size: int, sigma: float) -> Image.Image:
    """Gaussian dots centred exactly (sub-pixel) on ``points``, pixel centres at integer coordinates."""
    ys, xs = np.mgrid[0:size, 0:size]
    dots = sum(np.exp(-((xs - x) ** 2 + (ys - y) ** 2) / (2 * sigma**2)) for x, y in points)
    return Image.fromarray(np.round(dots / dots.max() * 255).astype(np.uint8)).convert("RGB")


def dot_centres(image: Image.Image, near: np.ndarray, radius: float = 6.0) -> np.ndarray:
    """Intensity centroid of the image around each point of ``near``."""
    values = np.asarray(image, dtype=np.float64)[..., 0]
    ys, xs = np.mgrid[0 : values.shape[0], 0 : values.shape[1]]
    out = []
    for x, y in near:
        weight = values * ((xs - x) ** 2 + (ys - y) ** 2 < radius**2)
        out.append(((weight * xs).sum() / weight.sum(), (weight * ys).sum() / weight.sum()))
    return np.array(out)


def problems_of(call) -> list[str]:
    with pytest.raises(DatasetProblems) as info:
        call()
    return info.value.problems


def assert_named(problems: list[str], expected: list[tuple[str, str]]) -> None:
    """Each ``(file:line, words)`` is one problem's start and part of its text, and nothing else is."""
    for where, words in expected:
        assert any(p.split(": ", 1)[0].endswith(where) and words in p for p in problems), (where, words, problems)
    assert len(problems) == len(expected), problems


# ============================================================================ alignment
def test_similarity_transform_recovers_a_similarity_exactly():
    rng = np.random.default_rng(0)
    for _ in range(20):
        src = rng.uniform(-50, 50, size=(int(rng.integers(2, 9)), 2))
        scale, angle, shift = rng.uniform(0.2, 5), rng.uniform(-np.pi, np.pi), rng.uniform(-100, 100, size=2)
        linear = scale * rotation(angle)
        matrix = similarity_transform(src, src @ linear.T + shift)
        np.testing.assert_allclose(matrix, np.hstack([linear, shift[:, None]]), atol=1e-9)


def test_similarity_transform_is_the_least_squares_optimum():
    """Oracle: a similarity without reflection is dst = [[a, -b], [b, a]] src + t, linear in (a, b, t),
    so the least-squares one is numpy's lstsq solution of that linear system."""
    rng = np.random.default_rng(1)
    for _ in range(20):
        src = rng.uniform(-50, 50, size=(5, 2))
        dst = src @ (rng.uniform(0.5, 3) * rotation(rng.uniform(-3, 3))).T + rng.uniform(-20, 20, 2) + rng.normal(0, 4, (5, 2))
        x, y = src[:, 0], src[:, 1]
        one, zero = np.ones(5), np.zeros(5)
        system = np.concatenate([np.stack([x, -y, one, zero], 1), np.stack([y, x, zero, one], 1)])
        (a, b, tx, ty), *_ = np.linalg.lstsq(system, np.concatenate([dst[:, 0], dst[:, 1]]), rcond=None)
        np.testing.assert_allclose(similarity_transform(src, dst), [[a, -b, tx], [b, a, ty]], atol=1e-9)


def test_similarity_transform_excludes_reflections_and_bad_input():
    src = np.array([[0.0, 0.0], [10.0, 0.0], [0.0, 5.0], [3.0, 7.0]])
    mirrored = src * [-1.0, 1.0]
    matrix = similarity_transform(src, mirrored)
    assert np.linalg.det(matrix[:, :2]) > 0  # the best rotation, not the exact mirror
    error = ((src @ matrix[:, :2].T + matrix[:, 2] - mirrored) ** 2).sum()
    angles = np.linspace(-np.pi, np.pi, 3601)  # brute force over rotations (scale, shift optimal per angle)
    centred_src, centred_dst = src - src.mean(0), mirrored - mirrored.mean(0)
    best = min(np.sum((centred_src @ (s * rotation(t)).T - centred_dst) ** 2)
               for t in angles for s in np.linspace(0.0, 1.5, 61))
    assert error <= best + 1e-9
    with pytest.raises(ValueError, match="coincide"):
        similarity_transform([[1, 1], [1, 1]], [[0, 0], [1, 1]])
    with pytest.raises(ValueError, match="shape"):
        similarity_transform(src, src[:3])


@pytest.mark.parametrize("size", [112, 56])
def test_align_face_puts_the_landmarks_on_the_template(size):
    """Dots drawn at a rotated, scaled, shifted template land on the template: within 0.15 px (a
    half-pixel convention error would be 0.5 (1 - 1/3) = 0.33 px here)."""
    landmarks = ARCFACE_TEMPLATE_112 @ (3.0 * rotation(0.5)).T + [120.0, 20.0]
    image = blobs(landmarks, 420, sigma=4.0)
    aligned = align_face(image, landmarks, size)
    target = ARCFACE_TEMPLATE_112 * size / 112
    assert aligned.size == (size, size)
    np.testing.assert_allclose(dot_centres(aligned, target, radius=6.0 * size / 112), target, atol=0.15)
    with pytest.raises(ValueError, match=r"\(5, 2\)"):
        align_face(image, landmarks[:4])


def test_extend_box():
    assert extend_box(10, 5, 20, 40, 0.3) == pytest.approx((7, -1, 33, 51))
    assert extend_box(10, 5, 20, 40, 0.0) == (10, 5, 30, 45)
    with pytest.raises(ValueError):
        extend_box(0, 0, 1, 1, -0.1)


# ============================================================================ VGGFace2
VGG = {  # NAME_ID -> loose box (X, Y, W, H) in a 40 x 30 image
    "train": {"n000001/0001_01": (10, 5, 20, 20), "n000001/0002_01": (30, 20, 20, 20), "n000001/0003_01": (-4, 0, 8, 6),
              "n000002/0001_01": (0, 0, 40, 30)},
    "test": {"n000010/0001_01": (1, 1, 10, 10), "n000010/0002_01": (2, 2, 10, 10)},
}


def make_vggface2(root: Path, meta: bool = False) -> Path:
    where = root / "meta" if meta else root
    for split, boxes in VGG.items():
        for name in boxes:
            coded_image(root / split / f"{name}.jpg")
        write(where / f"{split}_list.txt", "".join(f"{name}.jpg\n" for name in boxes))
        write(where / "bb_landmark" / f"loose_bb_{split}.csv",
              "NAME_ID,X,Y,W,H\n" + "".join(f'"{n}",{x},{y},{w},{h}\n' for n, (x, y, w, h) in boxes.items()))
    return root


def test_vggface2_splits_labels_and_loose_crops(tmp_path):
    root = make_vggface2(tmp_path)
    before = snapshot(root)
    train = build_dataset("vggface2", root, "train")
    assert [Path(p).relative_to(root).as_posix() for p in train.paths] == [f"train/{n}.jpg" for n in VGG["train"]]
    assert train.labels[:, 0].tolist() == [0, 0, 0, 1] and train.level_names == ("identity",)
    assert train.metadata["label_names"] == [["n000001", "n000002"]]
    assert train.sources[1].endswith("train_list.txt:2")
    assert evaluation_splits("vggface2") == ("test",) and len(build_dataset("vggface2", root, "test")) == 2
    # the box (X, Y, W, H) grown by 0.3 W and 0.3 H, half on each side: (10, 5, 20, 20) -> (7, 2, 33, 28)
    assert train.boxes[0] == pytest.approx((7, 2, 33, 28))
    crop = np.asarray(train.load(0))
    assert crop.shape == (26, 26, 3) and crop[0, 0].tolist() == [7, 2, 77] and crop[-1, -1].tolist() == [32, 27, 77]
    # (30, 20, 20, 20) -> (27, 17, 53, 43), cut at the 40 x 30 image: no black padding
    crop = np.asarray(train.load(1))
    assert crop.shape == (13, 13, 3) and crop[0, 0].tolist() == [27, 17, 77] and crop[-1, -1].tolist() == [39, 29, 77]
    # negative X: (-4, 0, 8, 6) -> (-5.2, -0.9, 5.2, 6.9) -> pixels [0, 5) x [0, 7)
    assert np.asarray(train.load(2)).shape == (7, 5, 3) and np.asarray(train.load(2))[0, 0].tolist() == [0, 0, 77]
    assert train[0]["image"].shape == (3, 26, 26)
    whole = build_dataset("vggface2", root, "train", crop=None)
    assert whole.boxes == {} and whole.load(0).size == (40, 30)
    exact = build_dataset("vggface2", root, "train", box_extension=0.0)
    assert np.asarray(exact.load(0))[0, 0].tolist() == [10, 5, 77] and exact.load(0).size == (20, 20)
    assert snapshot(root) == before  # nothing written into the dataset folder


def test_vggface2_meta_folder_layout(tmp_path):
    root = make_vggface2(tmp_path, meta=True)
    test = build_dataset("vggface2", root, "test")
    assert len(test) == 2 and test.boxes[1] == pytest.approx((0.5, 0.5, 13.5, 13.5))


def test_vggface2_problems_name_file_and_line(tmp_path):
    root = make_vggface2(tmp_path)
    write(root / "train_list.txt", "n000001/0001_01.jpg\nn000001 0002_01.jpg\nn000001/0001_01.jpg\n"
                    "justaname.jpg\nn000002/0001_01.jpg\nn000001/0003_01.png\n")
    write(root / "bb_landmark" / "loose_bb_train.csv",
          'NAME_ID,X,Y,W,H\n"n000001/0001_01",10,5,20,20\n"n000001/0001_01",10,5,20,20\n"n000009/0001_01",1,1,5,5\n'
          '"n000002/0001_01",10,5,0,20\n"n000002/0001_01",10,5,abc,20\n"n000002/0001_01",10,5,20\n')
    problems = problems_of(lambda: build_dataset("vggface2", root, "train"))
    assert_named(problems, [
        ("train_list.txt:2", "expected '<identity>/<file>.jpg'"), ("train_list.txt:3", "also listed at line 1"),
        ("train_list.txt:4", "expected '<identity>/<file>.jpg'"), ("train_list.txt:6", "expected '<identity>/<file>.jpg'"),
        ("loose_bb_train.csv:3", "second box"), ("loose_bb_train.csv:4", "does not list"),
        ("loose_bb_train.csv:5", "W, H > 0"), ("loose_bb_train.csv:6", "must be numbers"),
        ("loose_bb_train.csv:7", "expected 5 fields"), ("train_list.txt:5", "no box for 'n000002/0001_01'"),
    ])
    # dataset-info goes on with the usable rows and lists every problem
    report = dataset_report("vggface2", str(root), ["train"], {}, False)
    assert report["splits"]["train"]["found"] == {"images": 1, "identity": 1} and not report["ok"]
    assert len(report["problems"]) == len(problems)
    write(root / "bb_landmark" / "loose_bb_train.csv", "NAME,X,Y,W,H\n")
    with pytest.raises(LabelFileError, match=r"loose_bb_train.csv:1: expected the header"):
        build_dataset("vggface2", root, "train")
    (root / "bb_landmark" / "loose_bb_train.csv").unlink()
    with pytest.raises(FileNotFoundError, match="crop=None"):
        build_dataset("vggface2", root, "train")


def test_vggface2_missing_image_and_published_counts(tmp_path):
    root = make_vggface2(tmp_path)
    (root / "train" / "n000001" / "0002_01.jpg").unlink()
    with pytest.raises(BadImageError, match=r"train_list.txt:2"):
        build_dataset("vggface2", root, "train")
    with pytest.warns(UserWarning, match="skipped 1 bad image"):
        assert len(build_dataset("vggface2", root, "train", on_bad_image="skip")) == 3
    with pytest.warns(UserWarning, match="skipped 1 bad image"):  # train: the missing image
        report = dataset_report("vggface2", str(root), None, {}, False)
    assert report["splits"]["test"]["found"] == {"images": 2, "identity": 1}
    assert report["splits"]["test"]["mismatches"] == {"images": {"found": 2, "published": 169396},
                                                      "identity": {"found": 1, "published": 500}}
    assert dataset_spec("vggface2").published["train"] == {"images": 3141890, "identity": 8631}


# ============================================================================ IJB-C, insightface package
PROTOCOL_HEADER = "TEMPLATE_ID,SUBJECT_ID,FILENAME,SIGHTING_ID,FACE_X,FACE_Y,FACE_WIDTH,FACE_HEIGHT\n"
TEMPLATE_SUBJECT = {"ijbc_1N_gallery_G1.csv": {1: 101, 2: 102}, "ijbc_1N_gallery_G2.csv": {3: 103},
                    "ijbc_1N_probe_mixed.csv": {11: 101, 12: 102, 13: 103}}
# crop -> (template, media). Subject 101: stills 1, 2, 3 (3: a group photo with 103), videos 4, 5, and
# still 1 cropped again for probe template 11: 5 media. 102: 4 media (filtered out). 103: 5 media.
CROPS = {"1.jpg": (1, 1), "2.jpg": (1, 2), "3.jpg": (11, 1), "4.jpg": (11, 4), "5.jpg": (11, 4), "6.jpg": (11, 5),
         "7.jpg": (11, 5), "8.jpg": (11, 3), "9.jpg": (2, 10), "10.jpg": (12, 11), "11.jpg": (12, 12),
         "12.jpg": (12, 13), "13.jpg": (3, 20), "14.jpg": (13, 21), "15.jpg": (13, 22), "16.jpg": (13, 23),
         "17.jpg": (13, 3)}
SUBJECT = {t: s for table in TEMPLATE_SUBJECT.values() for t, s in table.items()}
PAIRS = [(1, 11, 1), (1, 13, 0), (2, 12, 1), (3, 13, 1), (2, 13, 0)]
DOT_LANDMARKS = ARCFACE_TEMPLATE_112 @ (3.0 * rotation(-0.3)).T + [40.0, 90.0]  # crop 1.jpg, 420 x 420


def small_landmarks(k: int) -> np.ndarray:
    return ARCFACE_TEMPLATE_112 * 0.2 + k % 3


def write_protocol(folder: Path, rows: dict[str, list[str]] | None = None) -> None:
    for name, table in TEMPLATE_SUBJECT.items():
        lines = (rows or {}).get(name) or [f"{t},{s},img/{t}.jpg,{t},1,1,5,5" for t, s in table.items()]
        write(folder / name, PROTOCOL_HEADER + "".join(line + "\n" for line in lines))


def make_ijbc_package(root: Path) -> Path:
    write_protocol(root / "meta")
    write(root / "meta" / "ijbc_face_tid_mid.txt", "".join(f"{n} {t} {m}\n" for n, (t, m) in CROPS.items()))
    marks = []
    (root / "loose_crop").mkdir()
    for k, name in enumerate(CROPS):
        if name == "1.jpg":
            blobs(DOT_LANDMARKS, 420, sigma=4.0).save(root / "loose_crop" / name, format="PNG")
            points = DOT_LANDMARKS
        else:
            coded_image(root / "loose_crop" / name, (24, 24))
            points = small_landmarks(k)
        marks.append(f"{name} " + " ".join(f"{v:.4f}" for v in points.reshape(-1)) + " 0.99\n")
    write(root / "meta" / "ijbc_name_5pts_score.txt", "".join(marks))
    write(root / "meta" / "ijbc_template_pair_label.txt", "".join(f"{a} {b} {c}\n" for a, b, c in PAIRS))
    return root


def assert_same_partition(ids: np.ndarray, keys: list) -> None:
    """Items share an id exactly when they share a key."""
    ids = np.asarray(ids)
    for i in range(len(keys)):
        for j in range(len(keys)):
            assert (ids[i] == ids[j]) == (keys[i] == keys[j]), (i, j, keys[i], keys[j])


def test_ijbc_package_media_templates_pairs_and_identity_filter(tmp_path):
    root = make_ijbc_package(tmp_path)
    before = snapshot(root)
    ds = build_dataset("ijbc", root, "test")
    names = [Path(p).name for p in ds.paths]
    kept = [n for n, (t, _) in CROPS.items() if SUBJECT[t] != 102]  # 102 has 4 media: removed
    assert names == kept and ds.level_names == ("subject",) and evaluation_splits("ijbc") == ("test",)
    assert ds.labels[:, 0].tolist() == [0 if SUBJECT[CROPS[n][0]] == 101 else 1 for n in names]
    assert ds.sources[2].endswith("ijbc_face_tid_mid.txt:3")
    media = ds.metadata["media"]
    assert media.dtype == np.int64 and media.shape == (len(ds),)
    assert_same_partition(media, [(SUBJECT[CROPS[n][0]], CROPS[n][1]) for n in names])
    assert media[names.index("8.jpg")] != media[names.index("17.jpg")]  # one photo, two subjects: two media
    templates = ds.metadata["templates"]
    assert templates.dtype == np.int64 and templates.shape == (len(ds), 2)
    assert {(int(t), names[i]) for t, i in templates} == {(CROPS[n][0], n) for n in kept}
    assert ds.metadata["template_pairs"].tolist() == [[1, 11, 1], [1, 13, 0], [3, 13, 1]]
    assert any("1 of 3 subject(s) have fewer than 5 media" in note for note in ds.metadata["notes"])
    everyone = build_dataset("ijbc", root, "test", min_instances=4)
    assert len(everyone) == len(CROPS) and everyone.metadata["template_pairs"].tolist() == [list(p) for p in PAIRS]
    assert len(build_dataset("ijbc", root, "test", min_instances=5)) == len(kept)
    # the metadata are what the verification protocol reads: with one-hot subject embeddings each
    # template's feature is its subject's axis, so every pair scores its label
    embeddings = torch.nn.functional.one_hot(torch.from_numpy(ds.labels[:, 0])).double()
    features, template_ids = template_embeddings(embeddings, media, templates)
    assert template_ids.tolist() == [1, 3, 11, 13]
    row = {int(t): i for i, t in enumerate(template_ids)}
    pairs = ds.metadata["template_pairs"]
    scores = [float(features[row[a]] @ features[row[b]]) for a, b, _ in pairs.tolist()]
    assert scores == pytest.approx(pairs[:, 2].tolist())
    assert verification_metrics(embeddings, media, templates, pairs, fars=(1.0,)) == {"tar@far=1e+00": 1.0}
    assert snapshot(root) == before


def test_ijbc_package_landmark_alignment(tmp_path):
    root = make_ijbc_package(tmp_path)
    ds = build_dataset("ijbc", root, "test")
    aligned = ds.load(0)  # 1.jpg, dots at a rotated, scaled, shifted template
    assert aligned.size == (112, 112) and ds[0]["image"].shape == (3, 112, 112)
    np.testing.assert_allclose(dot_centres(aligned, ARCFACE_TEMPLATE_112), ARCFACE_TEMPLATE_112, atol=0.15)
    np.testing.assert_allclose(ds.landmarks[0], DOT_LANDMARKS, atol=1e-4)
    half = build_dataset("ijbc", root, "test", align_size=56)
    np.testing.assert_allclose(dot_centres(half.load(0), ARCFACE_TEMPLATE_112 / 2, 3.0), ARCFACE_TEMPLATE_112 / 2, atol=0.15)
    plain = build_dataset("ijbc", root, "test", align=False)
    assert plain.landmarks == {} and plain.load(0).size == (420, 420)
    (root / "meta" / "ijbc_name_5pts_score.txt").unlink()
    assert build_dataset("ijbc", root, "test").load(0).size == (420, 420)  # no landmark file: crops as they are
    with pytest.raises(FileNotFoundError, match="landmark"):
        build_dataset("ijbc", root, "test", align=True)


def test_ijbc_bad_images_skipped_keep_templates_and_media_aligned(tmp_path):
    root = make_ijbc_package(tmp_path)
    (root / "loose_crop" / "2.jpg").unlink()
    (root / "loose_crop" / "14.jpg").unlink()
    with pytest.raises(BadImageError, match=r"ijbc_face_tid_mid.txt:2"):
        build_dataset("ijbc", root, "test")
    with pytest.warns(UserWarning, match="skipped 2 bad image"):
        ds = build_dataset("ijbc", root, "test", on_bad_image="skip")
    names = [Path(p).name for p in ds.paths]
    assert "2.jpg" not in names and len(names) == 11
    assert {(int(t), names[i]) for t, i in ds.metadata["templates"]} == {
        (CROPS[n][0], n) for n in names}
    assert_same_partition(ds.metadata["media"], [(SUBJECT[CROPS[n][0]], CROPS[n][1]) for n in names])
    np.testing.assert_allclose(ds.landmarks[names.index("15.jpg")], small_landmarks(list(CROPS).index("15.jpg")), atol=1e-4)


def test_ijbc_package_problems_name_file_and_line(tmp_path):
    root = make_ijbc_package(tmp_path)
    meta = root / "meta"
    write_protocol(meta, {"ijbc_1N_probe_mixed.csv": ["11,101,img/1.jpg,1,1,1,5,5", "abc,101,img/1.jpg,1,1,1,5,5",
                                                      "1,105,img/9.jpg,9,1,1,5,5", "12,102,img/2.jpg,2,1,1,5,5",
                                                      "13,103,img/3.jpg,3,1,1,5,5"]})
    tid_mid = (meta / "ijbc_face_tid_mid.txt").read_text()
    write(meta / "ijbc_face_tid_mid.txt", tid_mid + "x.jpg 1\ny.jpg a 3\n1.jpg 1 1\nz.jpg 99 7\n")
    marks = (meta / "ijbc_name_5pts_score.txt").read_text().splitlines(keepends=True)
    write(meta / "ijbc_name_5pts_score.txt", "".join(line for line in marks if not line.startswith("4.jpg"))
          + "1.jpg 1 2 3\nq.jpg " + "1 " * 10 + "0.9\n2.jpg " + "1 " * 9 + "nan 0.9\n")
    write(meta / "ijbc_template_pair_label.txt", "1 11 1\n1 11 2\n1 99 0\n1 13 1\n")
    lines = len(CROPS)
    problems = problems_of(lambda: build_dataset("ijbc", root, "test"))
    assert_named(problems, [
        ("ijbc_1N_probe_mixed.csv:3", "must be integers"), ("ijbc_1N_probe_mixed.csv:4", "has subject 105 here and 101"),
        (f"ijbc_face_tid_mid.txt:{lines + 1}", "expected '<image> <template_id> <media_id>'"),
        (f"ijbc_face_tid_mid.txt:{lines + 2}", "must be integers"),
        (f"ijbc_face_tid_mid.txt:{lines + 3}", "also listed at"), (f"ijbc_face_tid_mid.txt:{lines + 4}", "template 99"),
        (f"ijbc_name_5pts_score.txt:{lines}", "12 fields"), (f"ijbc_name_5pts_score.txt:{lines + 1}", "does not list"),
        (f"ijbc_name_5pts_score.txt:{lines + 2}", "must be finite"),
        ("ijbc_face_tid_mid.txt:4", "no landmarks for '4.jpg'"),
        ("ijbc_template_pair_label.txt:3", "template 99"), ("ijbc_template_pair_label.txt:2", "0 or 1, got 2"),
        ("ijbc_template_pair_label.txt:4", "label 1, but templates 1 and 13 are of different subjects"),
    ])
    report = dataset_report("ijbc", str(root), None, {}, False)
    assert report["splits"]["test"]["found"]["images"] == 12 and len(report["problems"]) == len(problems)
    write(meta / "ijbc_template_pair_label.txt", "1 11 1\n1 11\n")
    write(meta / "ijbc_name_5pts_score.txt", "".join(marks))
    write(meta / "ijbc_face_tid_mid.txt", tid_mid)
    write_protocol(meta)
    assert_named(problems_of(lambda: build_dataset("ijbc", root, "test")),
                 [("ijbc_template_pair_label.txt:2", "expected 3 fields, got 2")])
    write(meta / "ijbc_1N_gallery_G2.csv", "TEMPLATE_ID,FILENAME\n3,img/3.jpg\n")
    with pytest.raises(LabelFileError, match=r"ijbc_1N_gallery_G2.csv:1: missing column\(s\) \['SUBJECT_ID'\]"):
        build_dataset("ijbc", root, "test")


# ============================================================================ IJB-C, NIST release
def make_ijbc_release(root: Path, sighting: bool = True) -> Path:
    """Subject 101: img/1.jpg (a photo shared with 103), img/2.jpg, a video (frames 100, 101);
    103: img/1.jpg and frame 200; 102: img/5.jpg only (1 media)."""
    for name in ("img/1.jpg", "img/2.jpg", "img/5.jpg"):
        coded_image(root / "images" / name, (60, 50))
    for name in ("frames/100.png", "frames/101.png", "frames/200.png"):
        coded_image(root / "images" / name, (60, 50))
    rows = {
        "ijbc_1N_gallery_G1.csv": ["1,101,img/1.jpg,1,5,5,10,10", "1,101,img/2.jpg,2,1,1,8,8", "2,102,img/5.jpg,20,1,1,8,8"],
        "ijbc_1N_gallery_G2.csv": ["3,103,img/1.jpg,9,30,20,12,12"],
        "ijbc_1N_probe_mixed.csv": ["11,101,img/1.jpg,1,5,5,10,10", "11,101,frames/100.png,3,2,2,9,9",
                                    "11,101,frames/101.png,3,3,3,9,9", "13,103,frames/200.png,10,4,4,9,9"],
    }
    folder = root / "protocols" / "archive"
    for name, lines in rows.items():
        header = PROTOCOL_HEADER if sighting else PROTOCOL_HEADER.replace("SIGHTING_ID,", "")
        if not sighting:
            lines = [",".join(line.split(",")[:3] + line.split(",")[4:]) for line in lines]
        write(folder / name, header + "".join(line + "\n" for line in lines))
    write(folder / "ijbc_11_G1_G2_matches.csv", "1,11\n1,13\n3,13\n2,11\n")
    return root


RELEASE = [("img/1.jpg", 101), ("img/2.jpg", 101), ("img/1.jpg", 103), ("frames/100.png", 101),
           ("frames/101.png", 101), ("frames/200.png", 103)]


def test_ijbc_release_faces_boxes_media_and_pairs(tmp_path):
    root = make_ijbc_release(tmp_path)
    before = snapshot(root)
    ds = build_dataset("ijbc", root, "test", min_instances=2)
    faces = [(Path(p).relative_to(root / "images").as_posix(), s) for p, s in
             zip(ds.paths, np.array([101, 103])[ds.labels[:, 0]])]
    assert faces == RELEASE and ds.metadata["source"] == "release"
    assert ds.sources[3].endswith("ijbc_1N_probe_mixed.csv:3")
    assert_same_partition(ds.metadata["media"], [1, 2, 9, 3, 3, 10])  # their SIGHTING_IDs
    assert {(int(t), i) for t, i in ds.metadata["templates"]} == {(1, 0), (1, 1), (3, 2), (11, 0), (11, 3), (11, 4), (13, 5)}
    assert ds.metadata["template_pairs"].tolist() == [[1, 11, 1], [1, 13, 0], [3, 13, 1]]  # labels from the subjects
    first, second = np.asarray(ds.load(0)), np.asarray(ds.load(2))  # two faces of img/1.jpg
    assert first.shape == (10, 10, 3) and first[0, 0].tolist() == [5, 5, 77]
    assert second.shape == (12, 12, 3) and second[0, 0].tolist() == [30, 20, 77]
    wide = build_dataset("ijbc", root, "test", min_instances=2, box_extension=0.4)
    assert np.asarray(wide.load(0)).shape == (14, 14, 3) and np.asarray(wide.load(0))[0, 0].tolist() == [3, 3, 77]
    assert len(build_dataset("ijbc", root, "test", min_instances=1)) == 7  # with 102's one face
    assert len(build_dataset("ijbc", root, "test", min_instances=3)) == 4  # 103 has 2 media
    with pytest.raises(ValueError, match="align=True needs the loose crops"):
        build_dataset("ijbc", root, "test", align=True)
    assert snapshot(root) == before


def test_ijbc_release_without_sighting_ids_and_repeated_faces(tmp_path):
    root = make_ijbc_release(tmp_path, sighting=False)
    ds = build_dataset("ijbc", root, "test", min_instances=2)
    assert_same_partition(ds.metadata["media"], list(range(6)))  # each file its own media
    assert any("without SIGHTING_ID" in note for note in ds.metadata["notes"])
    probe = root / "protocols" / "archive" / "ijbc_1N_probe_mixed.csv"
    probe.write_text(probe.read_text().replace("11,101,img/1.jpg,5,5,10,10", "11,101,img/1.jpg,6,6,10,10"))
    ds = build_dataset("ijbc", root, "test", min_instances=2)
    assert any("1 protocol row(s) repeat a face" in note for note in ds.metadata["notes"])
    assert np.asarray(ds.load(0))[0, 0].tolist() == [5, 5, 77]  # the first row's box
    probe.write_text(PROTOCOL_HEADER.replace("SIGHTING_ID,", "") + "11,101,img/8.jpg,1,1,0,8\n11,101,img/9.jpg,x,1,5,5\n")
    assert_named(problems_of(lambda: build_dataset("ijbc", root, "test")),
                 [("ijbc_1N_probe_mixed.csv:2", "FACE_HEIGHT > 0"), ("ijbc_1N_probe_mixed.csv:3", "must be numbers"),
                  ("ijbc_11_G1_G2_matches.csv:2", "template 13 is in none"),  # 13 was only in the probe file
                  ("ijbc_11_G1_G2_matches.csv:3", "template 13 is in none")])
