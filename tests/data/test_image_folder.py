"""``image_folder``: a user's class tree (levels, splits, class lists, problems), the image helpers
used by ``embed``/``search``, ``dataset-info`` on a folder, and training on a generated tree."""

from __future__ import annotations

import argparse
import json
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
from helpers.images import counted_tree
from PIL import Image

from rankopt.cli.datasets import register
from rankopt.data import (
    BadImageError,
    DatasetProblems,
    build_dataset,
    evaluation_splits,
)
from rankopt.data.image_folder import (
    folder_dataset,
    image_files,
    images_dataset,
    read_class_list,
)
from rankopt.engine.run_writer import write_class_split


TWO_LEVELS = {f"{top}/{c}": 3 for top in ("a", "b") for c in ("1", "2", "3")}


def snapshot(root: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))} | {"#": len(list(root.rglob("*")))}


def dataset_info(argv: list[str], capsys) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="rankopt")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["dataset-info", *argv])
    code = args.func(args)
    return code, capsys.readouterr().out


# ----------------------------------------------------------------------------- levels and classes
def test_tree_levels_classes_by_path_and_level_names(tmp_path):
    root = counted_tree(tmp_path, TWO_LEVELS)
    everything = build_dataset("image_folder", root, "all")
    assert len(everything) == 18 and everything.level_names == ("class", "level1")
    assert everything.num_classes(0) == 6 and everything.num_classes(1) == 2  # a/1 and b/1 differ
    i, j = everything.paths.index(str(root / "a/1/0.png")), everything.paths.index(str(root / "b/1/0.png"))
    assert everything.labels[i, 0] != everything.labels[j, 0] and everything.labels[i, 1] != everything.labels[j, 1]
    assert everything.paths == sorted(everything.paths)
    named = build_dataset("image_folder", root, "all", level_names=["product", "category"])
    assert named.level_names == ("product", "category")
    with pytest.raises(ValueError, match="level_names has 1 name"):
        build_dataset("image_folder", root, "all", level_names=["product"])


def test_suffixes_hidden_and_other_files(tmp_path):
    root = counted_tree(tmp_path, {"x": 2, "y": 2})
    Image.new("L", (5, 5)).save(root / "x" / "UPPER.PPM")
    Image.new("RGB", (5, 5)).save(root / "y" / "photo.JPG", format="JPEG")
    (root / "x" / ".hidden.png").write_bytes(b"not an image")
    (root / ".cache").mkdir()
    (root / ".cache" / "z.png").write_bytes(b"")
    (root / "y" / "notes.txt").write_text("hello")
    ds = build_dataset("image_folder", root, "all")
    assert sorted(Path(p).name for p in ds.paths) == ["0.png", "0.png", "1.png", "1.png", "UPPER.PPM", "photo.JPG"]
    assert ds.metadata["notes"] == [f"1 non-image file(s) ignored, e.g. {str(root / 'y' / 'notes.txt')!r}"]


# ----------------------------------------------------------------------------- class-disjoint split
def test_drawn_split_is_class_disjoint_deterministic_and_reusable(tmp_path):
    root = counted_tree(tmp_path / "data", TWO_LEVELS)
    train, test = build_dataset("image_folder", root, "train"), build_dataset("image_folder", root, "test")
    assert evaluation_splits("image_folder", root) == ("test",)
    split = train.metadata["class_split"]
    assert len(split["train"]) == 3 and len(split["test"]) == 3 and not set(split["train"]) & set(split["test"])
    assert split["how"] == "test_fraction=0.5 split_level=0 split_seed=0"
    assert {Path(p).parent.relative_to(root).as_posix() for p in test.paths} == set(split["test"])
    assert build_dataset("image_folder", root, "train").metadata["class_split"] == split  # deterministic
    other = build_dataset("image_folder", root, "train", split_seed=3, test_fraction=0.34).metadata["class_split"]
    assert len(other["test"]) == 2
    # the run folder's classes/*.txt give the same split back
    files = write_class_split(tmp_path / "run", train)
    assert [f.name for f in files] == ["train.txt", "test.txt"]
    assert [c for _, c in read_class_list(files[0])] == split["train"]
    kwargs = {"train_classes": str(files[0]), "test_classes": str(files[1])}
    again_train, again_test = (build_dataset("image_folder", root, s, **kwargs) for s in ("train", "test"))
    assert again_train.paths == train.paths and again_test.paths == test.paths
    np.testing.assert_array_equal(again_test.labels, test.labels)


def test_split_level_holds_out_whole_top_folders(tmp_path):
    root = counted_tree(tmp_path, {f"{top}/{c}": 2 for top in "abcd" for c in "12"})
    test = build_dataset("image_folder", root, "test", split_level=-1)
    train = build_dataset("image_folder", root, "train", split_level=-1)
    test_tops, train_tops = ({Path(p).parent.parent.name for p in ds.paths} for ds in (test, train))
    assert len(test_tops) == 2 and not test_tops & train_tops
    with pytest.raises(ValueError, match="split_level must be in"):
        build_dataset("image_folder", root, "train", split_level=2)
    with pytest.raises(ValueError, match="test_fraction must be in"):
        build_dataset("image_folder", root, "train", test_fraction=1.0)


def test_class_lists(tmp_path):
    root = counted_tree(tmp_path / "data", TWO_LEVELS)
    train_list = tmp_path / "train.txt"
    train_list.write_text("# my split\na\n\nb/1\n")
    test_list = tmp_path / "test.txt"
    test_list.write_text("b/2\n")
    test = build_dataset("image_folder", root, "test", train_classes=str(train_list), test_classes=str(test_list))
    assert test.metadata["class_split"]["train"] == ["a/1", "a/2", "a/3", "b/1"]  # "a": every class under a/
    assert test.metadata["class_split"]["left_out"] == 1 and "1 class(es) in neither class list" in test.metadata["notes"][0]
    only_train = build_dataset("image_folder", root, "test", train_classes=str(train_list))
    assert only_train.metadata["class_split"]["test"] == ["b/2", "b/3"]  # the rest
    test_list.write_text("b/2\nb/9\na/3\n")
    with pytest.raises(DatasetProblems) as err:
        build_dataset("image_folder", root, "train", train_classes=str(train_list), test_classes=str(test_list))
    assert err.value.problems == [
        f"{test_list}:2: no class folder 'b/9' under {str(root)!r}",
        f"class 'a/3' is listed for train ({train_list}:2) and for test ({test_list}:3)",
    ]
    with pytest.raises(FileNotFoundError, match="class list"):
        build_dataset("image_folder", root, "train", train_classes=str(tmp_path / "nope.txt"))


# ----------------------------------------------------------------------------- split folders
def test_train_test_folders(tmp_path):
    counted_tree(tmp_path / "train", {"cat": 2, "dog": 2})
    counted_tree(tmp_path / "test", {"cow": 2, "owl": 3})
    counted_tree(tmp_path / "validation", {"pig": 2})
    assert evaluation_splits("image_folder", tmp_path) == ("test",)
    assert build_dataset("image_folder", tmp_path, "validation").num_classes() == 1
    assert len(build_dataset("image_folder", tmp_path, "test")) == 5
    assert len(build_dataset("image_folder", tmp_path, "all")) == 11
    with pytest.raises(ValueError, match="only apply to a tree of class folders"):
        build_dataset("image_folder", tmp_path, "train", test_fraction=0.3)
    counted_tree(tmp_path / "test", {"dog": 1})
    with pytest.raises(DatasetProblems, match="1 class\\(es\\) in both train/ and test/.*'dog'"):
        build_dataset("image_folder", tmp_path, "train")
    assert len(build_dataset("image_folder", tmp_path, "test", class_disjoint=False)) == 6


def test_query_gallery_folders_share_identities(tmp_path):
    counted_tree(tmp_path / "train", {"x/a": 2, "x/b": 2})
    counted_tree(tmp_path / "query", {"y/c": 1, "y/d": 1})
    counted_tree(tmp_path / "gallery", {"y/b": 1, "y/c": 2, "y/d": 3})  # y/b: a distractor sorted first
    assert evaluation_splits("image_folder", tmp_path) == ("query", "gallery")
    query, gallery = (build_dataset("image_folder", tmp_path, s) for s in ("query", "gallery"))
    q = {Path(p).parent.name: int(lab) for p, lab in zip(query.paths, query.labels[:, 0])}
    g = {Path(p).parent.name: int(lab) for p, lab in zip(gallery.paths, gallery.labels[:, 0])}
    assert q["c"] == g["c"] and q["d"] == g["d"] and g["b"] not in q.values()  # remapped jointly


# ----------------------------------------------------------------------------- problems
def test_problems_are_all_collected(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_dataset("image_folder", tmp_path / "nope", "train")
    flat = counted_tree(tmp_path / "flat", {".": 3})
    with pytest.raises(DatasetProblems, match="no class folders in .*flat"):
        build_dataset("image_folder", flat, "train")
    root = counted_tree(tmp_path / "bad", {"a/1": 2, "a/2": 2, "b": 2})
    (root / "a" / "3").mkdir()
    with pytest.raises(DatasetProblems) as err:
        build_dataset("image_folder", root, "train")
    problems = err.value.problems
    assert len(problems) == 2
    assert problems[0] == f"empty folder {str(root / 'a' / '3')!r}: no image in it or below it"
    assert "different folder depths" in problems[1] and "depth 1: b/0.png" in problems[1] and "depth 2: a/1/0.png" in problems[1]


def test_unreadable_image_raises_when_loaded(tmp_path):
    root = counted_tree(tmp_path, {"a": 2, "b": 2})
    (root / "a" / "broken.jpg").write_bytes(b"no jpeg here")
    ds = build_dataset("image_folder", root, "all")
    with pytest.raises(BadImageError, match="broken.jpg"):
        ds[ds.paths.index(str(root / "a" / "broken.jpg"))]


def test_dataset_info_lists_every_problem_and_writes_nothing(tmp_path, capsys):
    root = counted_tree(tmp_path, {"a/1": 2, "a/2": 2, "b/1": 2, "b/2": 2})
    (root / "a" / "2" / "broken.png").write_bytes(b"garbage")
    (root / "readme.md").write_text("my photos")
    before = snapshot(root)
    code, out = dataset_info(["image_folder", "--root", str(root), "--verify", "--json"], capsys)
    report = json.loads(out)
    assert code == 1 and not report["ok"] and set(report["splits"]) == {"train", "test"}
    assert len(report["problems"]) == 1 and "broken.png" in report["problems"][0] and "unreadable" in report["problems"][0]
    assert report["notes"] == [f"1 non-image file(s) ignored, e.g. {str(root / 'readme.md')!r}"]
    for split in ("train", "test", "all"):
        build_dataset("image_folder", root, split)
    assert snapshot(root) == before  # nothing is written into the user's folder
    (root / "b" / "3").mkdir()
    (root / "c").mkdir()
    with pytest.raises(DatasetProblems, match="2 problem"):  # training refuses the folder ...
        build_dataset("image_folder", root, "train")
    code, out = dataset_info(["image_folder", "--root", str(root), "--verify"], capsys)
    # ... dataset-info lists the empty folders *and* goes on to count and check the usable images
    assert code == 1 and "problems (3):" in out and "[train] PROBLEM" in out
    assert f"empty folder {str(root / 'b' / '3')!r}" in out and f"empty folder {str(root / 'c')!r}" in out
    assert "broken.png" in out and "not an image file Pillow can read" in out
    assert "  images: 4\n  class: 2\n  level1: 2" in out
    assert "note: 1 non-image file(s) ignored" in out


def test_dataset_info_counts_classes_that_cannot_be_queries(tmp_path, capsys):
    counted_tree(tmp_path / "train", {"a": 2, "b": 2})
    counted_tree(tmp_path / "test", {"p": 1, "q": 2, "r": 1})
    code, out = dataset_info(["image_folder", "--root", str(tmp_path), "--json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["ok"] and report["splits"]["test"]["classes_without_positive"] == 2
    assert report["notes"] == [("[test] 2 class(es) have a single image: their images cannot be queries "
                                "(nothing to find; counted as queries without positive)")]


# ----------------------------------------------------------------------------- images without a dataset
def test_image_files_and_unlabelled_dataset(tmp_path):
    root = counted_tree(tmp_path / "photos", {"b": 2, "a/x": 1})
    Image.new("RGB", (4, 4)).save(root / "loose.png")
    single = tmp_path / "query.webp"
    Image.new("RGB", (4, 4)).save(single)
    files = image_files([single, root])
    assert files[0] == single and files[1:] == sorted(files[1:]) and len(files) == 5
    ds = images_dataset([single, root])
    assert (ds.labels == -1).all() and len(ds) == 5 and ds[0]["image"].shape == (3, 4, 4)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        image_files([tmp_path / "missing.png"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no image .* under folder"):
        image_files([tmp_path / "empty"])


def test_folder_dataset_labels_a_class_tree(tmp_path):
    root = counted_tree(tmp_path, {"a/1": 2, "b/1": 1})
    Image.new("RGB", (4, 4)).save(root / "loose.png")
    ds = folder_dataset(root)
    labels = dict(zip((Path(p).relative_to(root).as_posix() for p in ds.paths), ds.labels.tolist()))
    assert labels == {"a/1/0.png": [0, 0], "a/1/1.png": [0, 0], "b/1/0.png": [1, 1], "loose.png": [-1, -1]}
    counted_tree(root, {"c": 1})
    with pytest.warns(UserWarning, match="own folder only .* different folder depths"):
        mixed = folder_dataset(root)
    assert mixed.labels[:, 0].tolist() == [0, 0, 1, 2, -1] and mixed.level_names == ("class",)


# ----------------------------------------------------------------------------- real data and training
def test_omniglot_alphabets_as_a_folder_tree(omniglot, tmp_path):
    with zipfile.ZipFile(omniglot / "images_evaluation.zip") as zf:
        names = [n for n in zf.namelist() if n.endswith(".png")]
        alphabets = sorted({n.split("/")[1] for n in names})[:2]
        for name in names:
            if name.split("/")[1] in alphabets:
                zf.extract(name, tmp_path)
    tree = build_dataset("image_folder", tmp_path / "images_evaluation", "all", level_names=["character", "alphabet"])
    reference = build_dataset("omniglot", omniglot, "test", alphabets=2)
    assert tree.summary()["classes"] == reference.summary()["classes"] and len(tree) == len(reference)
    np.testing.assert_array_equal(tree.labels, reference.labels)


@pytest.mark.slow
def test_train_on_a_folder_tree(tmp_path, capsys):
    from rankopt.cli import main

    root = counted_tree(tmp_path / "photos", {f"{top}/{c}": 4 for top in ("a", "b") for c in "1234"})
    run = tmp_path / "run"
    args = ["train", "image_folder", f"data.root={root}", "model.backbone=convnet_tiny", "model.embedding_dim=16",
            "data.image_size=16", "data.num_workers=0", "train.epochs=1", "train.max_steps_per_epoch=2",
            "train.batch_size=8", "schedule.warmup=0", "output.tensorboard=false", "output.figures=false",
            "--output", str(run)]
    assert main(args) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert [m["epoch"] for m in metrics] == [0, 1] and 0.0 <= metrics[-1]["map@r"] <= 1.0
    assert metrics[-1]["num_queries"] == 16
    train = (run / "classes" / "train.txt").read_text().splitlines()
    test = (run / "classes" / "test.txt").read_text().splitlines()
    assert train[0].startswith("# train classes (test_fraction=0.5") and len(train) == 5 and len(test) == 5
    assert not set(train[1:]) & set(test[1:])
    report = json.loads((run / "report.json").read_text())
    assert report["data"]["level_names"] == ["class", "level1"] and report["data"]["eval"]["test"]["images"] == 16
    assert sorted(os.listdir(root)) == ["a", "b"]  # nothing written into the data folder
    hints = [line for line in capsys.readouterr().out.splitlines() if line.startswith("hint: ")]
    assert len(hints) == 1 and "random weights" in hints[0] and "rankopt convert" in hints[0]


def test_label_names_give_each_id_its_class_folder_also_after_carving(tmp_path):
    from rankopt.data.splits import carve_validation

    root = counted_tree(tmp_path, TWO_LEVELS)
    dataset = build_dataset("image_folder", root, "all")

    def check(ds):
        names = ds.metadata["label_names"]
        for path, labels in zip(ds.paths, ds.labels):
            folder = Path(path).parent.relative_to(root).as_posix()  # e.g. "b/2": class "b/2", coarser "b"
            assert [names[c][labels[c]] for c in range(ds.num_levels)] == [folder, folder.split("/")[0]]
        assert [len(level) for level in names] == [ds.num_classes(c) for c in range(ds.num_levels)]

    check(dataset)
    train, validation = carve_validation(dataset, 0.5, level=-1, seed=1)
    check(train)
    check(validation)
    assert set(validation.metadata["label_names"][1]).isdisjoint(train.metadata["label_names"][1])
