"""The train / evaluate / embed sub-commands (rankopt.cli): parsing, clear errors, outputs.

evaluate/embed run on a small SYNTHETIC set (rankopt's generated dataset, 4 images per class)
with an untrained built-in CNN saved as a checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rankopt.cli import main
from rankopt.config import config_to_dict, list_recipes, load_config
from rankopt.engine.checkpoint import save_checkpoint
from rankopt.engine.assembly import build_model

SMALL_SYNTHETIC = ["data.kwargs.images_per_class=4", "model.backbone=convnet_tiny", "model.embedding_dim=16",
                   "eval.batch_size=200"]


def test_list_recipes(capsys):
    assert main(["train", "--list-recipes"]) == 0
    out = capsys.readouterr().out
    for name in list_recipes():
        assert name in out


def test_print_config_with_overrides(capsys):
    assert main(["train", "roadmap_sop_resnet50", "train.batch_size=64", "optim.lr=3e-5", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "batch_size: 64" in out and "lr: 3.0e-05" in out and "name: sop" in out


def test_overrides_without_recipe_use_the_default(capsys):
    assert main(["train", "train.epochs=1", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "name: synthetic" in out and "epochs: 1" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "train.epochz=1"], "unknown config key 'train.epochz'"),
        (["train", "default", "train.epochs=two"], "invalid value for 'train.epochs'"),
        (["train", "no_such_recipe"], "unknown recipe 'no_such_recipe'"),
        (["train", "--resume", "auto"], "--resume auto needs the run folder"),
        (["train", "--resume", "/nonexistent/last.ckpt"], "does not exist"),
        (["evaluate", "/nonexistent/best.ckpt"], "does not exist"),
    ],
)
def test_bad_input_gives_one_clear_line(argv, message, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_missing_dataset_folder_is_named(tmp_path, capsys):
    missing = tmp_path / "CUB_200_2011"
    assert main(["train", "roadmap_cub_resnet50", f"data.root={missing}", "model.pretrained=false",
                 f"output.dir={tmp_path / 'run'}"]) == 1
    err = capsys.readouterr().err
    assert str(missing) in err and "cub200" in err


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    cfg = load_config(None, SMALL_SYNTHETIC)
    model = build_model(cfg)
    return save_checkpoint(tmp_path / "model.ckpt", {"model": model.state_dict(), "config": config_to_dict(cfg)})


def test_evaluate_and_embed_agree(checkpoint, tmp_path, capsys):
    from rankopt.metrics import ALL_METRICS, evaluate

    out_json = tmp_path / "eval.json"
    assert main(["evaluate", str(checkpoint), "--split", "test", "--metrics", "all", "--json", str(out_json),
                 "--no-progress"]) == 0
    result = json.loads(out_json.read_text())
    assert result["dataset"] == "synthetic" and result["splits"] == ["test"]
    assert result["num_queries"] == 800

    emb_path = tmp_path / "emb" / "E.npy"
    assert main(["embed", str(checkpoint), "--split", "test", "--out", str(emb_path), "--no-progress"]) == 0
    emb = np.load(emb_path)
    labels = np.load(tmp_path / "emb" / "E.labels.npy")
    paths = (tmp_path / "emb" / "E.paths.txt").read_text().splitlines()
    assert emb.shape == (800, 16) and labels.shape == (800, 3) and len(paths) == 800
    again = evaluate(torch.from_numpy(emb), torch.from_numpy(labels), metrics=list(ALL_METRICS))
    for name, value in again.metrics.items():
        assert result["metrics"][name] == pytest.approx(value, abs=1e-6), name

    # the embeddings are the model's outputs on the test transform
    from rankopt.data import build_dataset
    from rankopt.data.transforms import build_transform
    from rankopt.engine.assembly import model_from_checkpoint

    model, cfg = model_from_checkpoint(checkpoint)
    ds = build_dataset("synthetic", None, "test", transform=build_transform("synthetic_test"), images_per_class=4)
    with torch.no_grad():
        direct = model(torch.stack([ds[i]["image"] for i in (0, 399, 799)]))
    assert np.allclose(emb[[0, 399, 799]], direct.numpy(), atol=1e-5)
    assert paths[399] == ds.paths[399]


def test_embed_image_folder(checkpoint, tmp_path):
    folder = tmp_path / "imgs"
    rng = np.random.default_rng(0)
    for rel in ("a/1.png", "a/2.jpg", "b/3.png", "b/sub/4.png", "loose.png"):
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (40, 30, 3), dtype=np.uint8)).save(path)
    (folder / "notes.txt").write_text("not an image")
    out = tmp_path / "folder_emb.npy"
    assert main(["embed", str(checkpoint), "--images", str(folder), "--out", str(out), "--no-progress"]) == 0
    paths = (tmp_path / "folder_emb.paths.txt").read_text().splitlines()
    assert [Path(p).relative_to(folder).as_posix() for p in paths] == ["a/1.png", "a/2.jpg", "b/3.png", "b/sub/4.png", "loose.png"]
    assert np.load(tmp_path / "folder_emb.labels.npy")[:, 0].tolist() == [0, 0, 1, 2, -1]
    emb = np.load(out)
    assert emb.shape == (5, 16) and np.allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)


def test_embed_rejects_mixed_sources(checkpoint, tmp_path, capsys):
    assert main(["embed", str(checkpoint), "--images", str(tmp_path), "--split", "test", "--out", "x.npy"]) == 1
    assert "either --images" in capsys.readouterr().err


def test_resume_without_recipe_takes_the_checkpoints_config(tmp_path):
    import argparse

    from rankopt.cli.train import resolve_config

    cfg = load_config(None, ["train.epochs=5", "train.seed=7"])
    path = save_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt", {"config": config_to_dict(cfg)})
    args = argparse.Namespace(recipe="train.epochs=6", overrides=[], resume=str(path), output=None)
    resumed = resolve_config(args)
    assert (resumed.train.epochs, resumed.train.seed) == (6, 7)  # saved config + the new override
    assert resumed.train.resume == str(path) and resumed.output.dir == str((tmp_path / "run").resolve())


def test_train_a_sum_of_losses_end_to_end(tmp_path):
    """``rankopt train loss.name=arcface+smooth_ap`` (Smooth-AP appended to ArcFace) on a few synthetic steps."""
    import csv

    run = tmp_path / "sum"
    assert main(["train", "loss.name=arcface+smooth_ap", "loss.kwargs.smooth_ap.tau=0.02", *SMALL_SYNTHETIC,
                 "train.epochs=1", "train.max_steps_per_epoch=2", "eval.metrics=[map@r]", "output.figures=false",
                 "output.tensorboard=false", "output.progress=false", f"output.dir={run}"]) == 0
    report = json.loads((run / "report.json").read_text())
    assert report["loss"]["name"] == "arcface+smooth_ap" and report["steps"] == 2 and "map@r" in report["trained"]
    rows = list(csv.DictReader((run / "steps.csv").open()))
    assert len(rows) == 2 and all(float(r["term/arcface"]) > 0 and float(r["term/smooth_ap"]) > 0 for r in rows)
