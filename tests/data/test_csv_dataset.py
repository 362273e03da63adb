"""``csv``: open-metric-learning's dataframe format (label, path, split, is_query, is_gallery,
category, x_1..y_2), its errors naming file:line, ``dataset-info`` on a CSV, and training on one."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from PIL import Image

from rankopt.cli.datasets import register
from rankopt.data import (
    BadImageError,
    DatasetProblems,
    LabelFileError,
    build_dataset,
    evaluation_splits,
)

OML_HEADER = "label,path,split,is_query,is_gallery,category,category_name,x_1,x_2,y_1,y_2,sequence"


def write_images(root: Path, names: list[str]) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (10, 8), (len(name) * 20 % 256, 40, 90)).save(root / name)


@pytest.fixture
def oml_csv(tmp_path: Path) -> Path:
    """An OML-style file: 2 train labels, 2 validation labels (1 vs rest: every row query and gallery)."""
    rows = [
        "0,images/a0.png,train,,,0,shoes,,,,,",
        "0,images/a1.png,train,,,0,shoes,,,,,",
        "1,images/b0.png,train,,,1,bags,,,,,",
        "1,images/b1.png,train,,,1,bags,,,,,",
        "2,images/c0.png,validation,True,True,0,shoes,1,9,2,7,s1",
        "2,images/c1.png,validation,True,True,0,shoes,,,,,s1",
        "3,images/d0.png,validation,True,True,1,bags,,,,,",
        "3,images/d1.png,validation,False,True,1,bags,,,,,",
    ]
    write_images(tmp_path, [r.split(",")[1] for r in rows])
    path = tmp_path / "df.csv"
    path.write_text("\n".join([OML_HEADER, *rows]) + "\n")
    return path


def test_oml_file_splits_levels_boxes(oml_csv):
    assert evaluation_splits("csv", oml_csv) == ("query", "gallery")
    train = build_dataset("csv", oml_csv, "train")
    assert train.level_names == ("label", "category") and train.summary()["classes"] == {"label": 2, "category": 2}
    assert train.paths[0] == str(oml_csv.parent / "images" / "a0.png")
    query, gallery = build_dataset("csv", oml_csv, "query"), build_dataset("csv", oml_csv, "gallery")
    assert len(query) == 3 and len(gallery) == 4 and query.metadata["gallery_contains_queries"] is True
    assert query.labels[:, 0].tolist() == [0, 0, 1] and gallery.labels[:, 0].tolist() == [0, 0, 1, 1]
    assert query.boxes == {0: (1.0, 2.0, 9.0, 7.0)} and gallery.boxes == {0: (1.0, 2.0, 9.0, 7.0)}
    assert query.load(0).size == (8, 5) and query.load(1).size == (10, 8)  # (x_1, y_1, x_2, y_2) crop
    assert query.sources[0] == f"{oml_csv}:6"
    assert len(build_dataset("csv", oml_csv, "validation")) == 4


def test_self_retrieval_test_split_string_labels_and_levels(tmp_path):
    write_images(tmp_path / "root", ["x.png", "y.png", "z.png", "w.png"])
    path = tmp_path / "lists" / "items.csv"
    path.parent.mkdir()
    path.write_text("path,label,split,label_1,category\n"
                    "x.png,cat,TRAIN,animal,zz\ny.png,3.0,Train,animal,zz\nz.png,dog,test,animal,zz\nw.png,cow,test,farm,zz\n")
    assert evaluation_splits("csv", path, dataset_root=str(tmp_path / "root")) == ("test",)
    train = build_dataset("csv", path, "train", dataset_root=str(tmp_path / "root"))
    assert train.level_names == ("label", "label_1") and train.num_classes(0) == 2  # label_1 before category
    test = build_dataset("csv", path, "test", dataset_root=str(tmp_path / "root"), levels=["label", "category"])
    assert test.level_names == ("label", "category") and test.summary()["classes"] == {"label": 2, "category": 1}
    with pytest.raises(ValueError, match="has no split 'query'; splits: train, test"):
        build_dataset("csv", path, "query", dataset_root=str(tmp_path / "root"))


def test_every_row_problem_is_named(tmp_path):
    write_images(tmp_path, ["a.png", "b.png", "c.png"])
    path = tmp_path / "bad.csv"
    path.write_text("label,path,split\n1,a.png,train\n1.5,b.png,train\n,c.png,test\n2,a.png,test\n3,c.png,val\n")
    with pytest.raises(DatasetProblems) as err:
        build_dataset("csv", path, "train")
    assert err.value.problems == [
        f"{path}:3: label '1.5' is neither an integer nor a name",
        f"{path}:4: empty or NaN label ''",
        f"{path}:5: path 'a.png' is also listed at line 2",
        f"{path}:6: split must be one of train, validation, test, got 'val'",
    ]


def test_file_and_column_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="CSV file .*nope.csv"):
        build_dataset("csv", tmp_path / "nope.csv", "train")
    with pytest.raises(ValueError, match="needs root"):
        build_dataset("csv", None, "train")
    with pytest.raises(ValueError, match="give the CSV file itself"):
        build_dataset("csv", tmp_path, "train")
    path = tmp_path / "cols.csv"
    path.write_text("label,image,split\n1,a.png,train\n")
    with pytest.raises(LabelFileError, match=r"cols.csv:1: missing column\(s\) \['path'\]; header: label,image,split"):
        build_dataset("csv", path, "train")
    path.write_text("label,path,split,is_query\n1,a.png,train,\n")
    with pytest.raises(LabelFileError, match=r"missing column\(s\) \['is_gallery'\]"):
        build_dataset("csv", path, "train")
    path.write_text("label,path,split,is_query,is_gallery,x_1,x_2,y_1,y_2\n1,a.png,train,,,1,,2,3\n2,b.png,validation,maybe,True,,,,\n")
    with pytest.raises(DatasetProblems) as err:
        build_dataset("csv", path, "train")
    assert err.value.problems[0].startswith(f"{path}:2: bounding box") and "partly empty" in err.value.problems[0]
    assert err.value.problems[1] == f"{path}:3: is_query must be True/False (or 1/0), got 'maybe'"


def test_missing_image_names_its_row(tmp_path):
    write_images(tmp_path, ["a.png"])
    path = tmp_path / "df.csv"
    path.write_text("label,path,split\n1,a.png,train\n1,gone.png,train\n")
    with pytest.raises(BadImageError, match=r"gone.png \(listed at .*df.csv:3\)"):
        build_dataset("csv", path, "train")
    with pytest.warns(UserWarning, match="skipped 1 bad image"):
        assert len(build_dataset("csv", path, "train", on_bad_image="skip")) == 1


def test_class_disjointness(tmp_path):
    write_images(tmp_path, ["a.png", "b.png", "c.png"])
    path = tmp_path / "df.csv"
    path.write_text("label,path,split\n7,a.png,train\n7,b.png,test\n8,c.png,test\n")
    with pytest.raises(DatasetProblems, match=rf"label 7 is in train \({path}:2\) and in test \({path}:3\)"):
        build_dataset("csv", path, "test")
    assert len(build_dataset("csv", path, "test", class_disjoint=False)) == 2


def test_dataset_info_on_a_csv(oml_csv, capsys):
    parser = argparse.ArgumentParser(prog="rankopt")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["dataset-info", "csv", "--root", str(oml_csv), "--json"])
    code = args.func(args)
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and set(report["splits"]) == {"train", "validation", "query", "gallery"}
    assert report["splits"]["query"]["classes_without_positive"] == 0
    text = oml_csv.read_text().replace("2,images/c1.png,validation", "0,images/c1.png,validation")
    oml_csv.write_text(text + "4,images/a0.png,train,,,0,shoes,,,,,\n")
    args = parser.parse_args(["dataset-info", "csv", "--root", str(oml_csv), "--json"])
    code = args.func(args)
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and len(report["problems"]) == 2
    assert "path 'images/a0.png' is also listed at line 2" in report["problems"][0]
    assert "label 0 is in train" in report["problems"][1]
    # the usable rows are still counted (the duplicate row left out)
    assert report["splits"]["train"]["found"] == {"images": 4, "label": 2, "category": 2}
    with pytest.raises(DatasetProblems, match="2 problem"):
        build_dataset("csv", oml_csv, "train")


@pytest.mark.slow
def test_train_on_a_csv(tmp_path):
    from rankopt.cli import main

    names = [f"img/{c}{i}.png" for c in "abcdefgh" for i in range(3)]
    write_images(tmp_path, names)
    lines = [f"{ord(n[4]) - 97},{n},{'train' if n[4] < 'e' else 'validation'},"
             f"{'' if n[4] < 'e' else 'True'},{'' if n[4] < 'e' else 'True'}" for n in names]
    path = tmp_path / "df.csv"
    path.write_text("label,path,split,is_query,is_gallery\n" + "\n".join(lines) + "\n")
    run = tmp_path / "run"
    args = ["train", "image_folder", "data.name=csv", f"data.root={path}", "model.backbone=convnet_tiny",
            "model.embedding_dim=16", "data.image_size=16", "data.num_workers=0", "train.epochs=1",
            "train.max_steps_per_epoch=2", "train.batch_size=6", "train.m=3", "schedule.warmup=0",
            "output.tensorboard=false", "output.figures=false", "--output", str(run)]
    assert main(args) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert [m["epoch"] for m in metrics] == [0, 1] and metrics[-1]["num_queries"] == 12
    report = json.loads((run / "report.json").read_text())
    assert report["data"]["eval"]["gallery"]["images"] == 12 and not (run / "classes").exists()
