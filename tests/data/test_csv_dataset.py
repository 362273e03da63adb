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


def test_sequence_and_category_follow_their_items(oml_csv):
    """OML's ``sequence`` and ``category`` columns, per item in each split's metadata ("" where empty),
    through the query/gallery split, skipped images and carved splits."""
    from rankopt.data.splits import carve_validation, subset

    query, gallery = build_dataset("csv", oml_csv, "query"), build_dataset("csv", oml_csv, "gallery")
    assert query.metadata["sequence"].tolist() == ["s1", "s1", ""] and gallery.metadata["sequence"].tolist() == ["s1", "s1", "", ""]
    assert query.metadata["category"].tolist() == ["0", "0", "1"] and gallery.metadata["category"].tolist() == ["0", "0", "1", "1"]
    assert build_dataset("csv", oml_csv, "train").metadata["sequence"].tolist() == [""] * 4
    (oml_csv.parent / "images" / "c0.png").unlink()
    with pytest.warns(UserWarning, match="skipped 2 bad image"):  # its query and its gallery entry
        gallery = build_dataset("csv", oml_csv, "gallery", on_bad_image="skip")
    assert [Path(p).name for p in gallery.paths] == ["c1.png", "d0.png", "d1.png"]
    assert gallery.metadata["sequence"].tolist() == ["s1", "", ""] and gallery.metadata["category"].tolist() == ["0", "1", "1"]
    picked = subset(gallery, [2, 0], "picked")
    assert picked.metadata["sequence"].tolist() == ["", "s1"] and picked.metadata["category"].tolist() == ["1", "0"]
    train, validation = carve_validation(gallery, 0.5, level=0, seed=0)
    for part in (train, validation):
        by_path = dict(zip(gallery.paths, gallery.metadata["sequence"]))
        assert part.metadata["sequence"].tolist() == [by_path[p] for p in part.paths]


def test_sequence_ids_are_read_like_labels(tmp_path):
    """``3.0`` and ``3`` are one sequence, names stay names, empty/NaN is none; ``1.5`` is an error naming its row;
    without the column there is no sequence metadata."""
    write_images(tmp_path, ["a.png", "b.png", "c.png", "d.png", "e.png"])
    path = tmp_path / "df.csv"
    path.write_text("label,path,split,sequence\n1,a.png,test,3.0\n1,b.png,test,3\n2,c.png,test,cam-7\n2,d.png,test,NaN\n"
                    "3,e.png,test,\n")
    assert build_dataset("csv", path, "test").metadata["sequence"].tolist() == ["3", "3", "cam-7", "", ""]
    path.write_text(path.read_text().replace("cam-7", "1.5").replace("b.png,test,3", "b.png,test,2.25"))
    with pytest.raises(DatasetProblems) as err:
        build_dataset("csv", path, "test")
    assert err.value.problems == [f"{path}:3: sequence '2.25' is neither an integer nor a name",
                                  f"{path}:4: sequence '1.5' is neither an integer nor a name"]
    path.write_text("label,path,split\n1,a.png,test\n1,b.png,test\n")
    assert "sequence" not in build_dataset("csv", path, "test").metadata


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


def test_evaluate_a_csv_with_sequences_and_categories(tmp_path, capsys):
    """``rankopt evaluate`` on an OML file (1 vs rest): the frames of a sequence never retrieve each other
    (classes 0 and 3 lie in one sequence each: their 5 queries have no positive), metrics per category
    in the JSON, metrics.json, report.json and report.html; the values are ``evaluate()``'s on the same
    embeddings with the groups and categories written out by hand."""
    import numpy as np
    import torch

    from rankopt.cli import main
    from rankopt.config import config_to_dict, load_config
    from rankopt.engine.assembly import build_model
    from rankopt.engine.checkpoint import save_checkpoint
    from rankopt.metrics import evaluate

    table = [(0, "v1", "shoes"), (0, "v1", "shoes"), (0, "v1", "shoes"), (1, "v2", "shoes"), (1, "v3", "shoes"),
             (2, "", "bags"), (2, "", "bags"), (3, "4", "bags"), (3, "4.0", "bags")]  # 4.0 is 4
    names = [f"img/{i}.png" for i in range(len(table))]
    write_images(tmp_path, names)
    for i, name in enumerate(names):  # distinct pictures
        Image.new("RGB", (12, 12), (20 * i, 255 - 25 * i, (70 * i) % 256)).save(tmp_path / name)
    rows = [f"{label},{name},validation,True,True,{category},{sequence}" for (label, sequence, category), name in zip(table, names)]
    path = tmp_path / "df.csv"
    path.write_text("label,path,split,is_query,is_gallery,category,sequence\n" + "\n".join(rows) + "\n")
    torch.manual_seed(0)
    cfg = load_config(None, ["model.backbone=convnet_tiny", "model.embedding_dim=16"])
    checkpoint = save_checkpoint(tmp_path / "model.ckpt", {"model": build_model(cfg).state_dict(), "config": config_to_dict(cfg)})
    common = [str(checkpoint), "--dataset", "csv", "--root", str(path), "--image-size", "24", "--no-progress"]
    out, run = tmp_path / "out.json", tmp_path / "run"
    assert main(["evaluate", *common, "--metrics", "recall@1", "map", "--json", str(out), "--output", str(run)]) == 0
    assert main(["embed", *common, "--split", "validation", "--out", str(tmp_path / "E.npy")]) == 0
    capsys.readouterr()
    result = json.loads(out.read_text())
    assert result["num_queries"] == 9 and result["num_queries_without_positive"] == 5
    assert {k: (v["num_queries"], v["num_queries_without_positive"]) for k, v in result["by_category"].items()} == {
        "bags": (4, 2), "shoes": (5, 3)}
    x = torch.from_numpy(np.load(tmp_path / "E.npy"))
    labels = torch.tensor([label for label, _, _ in table])
    groups = torch.tensor([{"v1": 0, "v2": 1, "v3": 2, "4": 3, "4.0": 3}.get(s, -1) for _, s, _ in table])
    want = evaluate(x, labels, metrics=["recall@1", "map"], query_groups=groups, query_categories=[c for _, _, c in table])
    assert result["metrics"] == pytest.approx(want.metrics)
    for name, sub in want.by_category.items():
        assert result["by_category"][name]["metrics"] == pytest.approx(sub.metrics)
    record = json.loads((run / "metrics.json").read_text())[-1]
    assert record["by_category"]["shoes"] == pytest.approx(want.by_category["shoes"].to_record())
    assert json.loads((run / "report.json").read_text())["trained"]["by_category"] == record["by_category"]
    page = (run / "report.html").read_text()
    assert "Per query category (last evaluation)" in page and page.index("shoes") > page.index("bags")
