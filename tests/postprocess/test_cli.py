"""``rankopt whiten`` and the post-processing options of ``evaluate``/``embed`` on a tiny checkpoint
(an untrained built-in CNN on rankopt's SYNTHETIC dataset, 4 images per class)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rankopt.cli import main
from rankopt.cli._postprocess import add_postprocess_arguments, postprocessing_from_args
from rankopt.config import config_to_dict, load_config
from rankopt.engine.assembly import (
    build_model,
    inference_preprocessing,
    model_from_checkpoint,
)
from rankopt.engine.checkpoint import save_checkpoint
from rankopt.models.fingerprint import model_fingerprint
from rankopt.models.multiscale import DEFAULT_SCALES
from rankopt.postprocess import load_whitening

SMALL_SYNTHETIC = ["data.kwargs.images_per_class=4", "model.backbone=convnet_tiny", "model.embedding_dim=16",
                   "model.pooling=gem", "eval.batch_size=200"]


def _checkpoint(path: Path, seed: int) -> Path:
    torch.manual_seed(seed)
    cfg = load_config(None, SMALL_SYNTHETIC)
    return save_checkpoint(path, {"model": build_model(cfg).state_dict(), "config": config_to_dict(cfg)})


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    return _checkpoint(tmp_path / "model.ckpt", 0)


def test_whiten_then_evaluate_with_every_step(checkpoint, tmp_path, capsys):
    whitening = tmp_path / "w" / "pca.safetensors"
    assert main(["whiten", str(checkpoint), "--power", "0.25", "--dim", "12", "--multiscale", "1", "0.5",
                 "--out", str(whitening), "--no-progress"]) == 0
    w = load_whitening(whitening)
    model, cfg = model_from_checkpoint(checkpoint)
    assert (w.kind, w.power, w.dim, w.input_dim, w.scales) == ("pca", 0.25, 12, 16, (1.0, 0.5))
    assert w.fitted_on == "synthetic/train"
    assert w.model_fingerprint == model_fingerprint(model, inference_preprocessing(cfg))

    out = tmp_path / "eval.json"
    assert main(["evaluate", str(checkpoint), "--split", "test", "--metrics", "map", "recall@1", "--json", str(out),
                 "--whiten", str(whitening), "--multiscale", "1", "0.5", "--qe", "5", "--dba", "5", "--dba-alpha", "3",
                 "--no-progress"]) == 0
    result = json.loads(out.read_text())
    post = result["postprocessing"]
    assert post["multiscale"] == [1.0, 0.5] and post["whitening"]["kind"] == "pca"
    assert post["qe"] == {"k": 5, "alpha": 2.0} and post["dba"] == {"k": 5, "alpha": 3.0}
    assert result["num_queries"] == 800 and 0.0 < result["metrics"]["map"] <= 1.0

    plain = tmp_path / "plain.json"
    assert main(["evaluate", str(checkpoint), "--split", "test", "--metrics", "map", "--json", str(plain),
                 "--no-progress"]) == 0
    assert json.loads(plain.read_text())["postprocessing"] == {"multiscale": None, "whitening": None, "dba": None,
                                                               "qe": None}
    assert json.loads(plain.read_text())["metrics"]["map"] != result["metrics"]["map"]


def test_embed_with_whitening_matches_the_library(checkpoint, tmp_path):
    whitening = tmp_path / "sup.safetensors"
    assert main(["whiten", str(checkpoint), "--supervised", "--shrinkage", "0.1", "--out", str(whitening),
                 "--no-progress"]) == 0
    raw, white = tmp_path / "raw.npy", tmp_path / "white.npy"
    assert main(["embed", str(checkpoint), "--split", "test", "--out", str(raw), "--no-progress"]) == 0
    assert main(["embed", str(checkpoint), "--split", "test", "--whiten", str(whitening), "--out", str(white),
                 "--no-progress"]) == 0
    expected = load_whitening(whitening).apply(torch.from_numpy(np.load(raw)))
    assert np.allclose(np.load(white), expected.numpy(), atol=1e-6)


def test_whitening_of_another_model_or_scales_is_refused(checkpoint, tmp_path, capsys):
    other = _checkpoint(tmp_path / "other.ckpt", 1)
    whitening = tmp_path / "w.safetensors"
    assert main(["whiten", str(other), "--out", str(whitening), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(checkpoint), "--split", "test", "--whiten", str(whitening), "--no-progress"]) == 1
    err = capsys.readouterr().err
    model, cfg = model_from_checkpoint(checkpoint)
    assert "was fitted for model fingerprint" in err and model_fingerprint(model, inference_preprocessing(cfg)) in err
    assert main(["evaluate", str(other), "--split", "test", "--whiten", str(whitening), "--multiscale",
                 "--no-progress"]) == 1
    assert "multi-scale" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--supervised", "--power", "0.5"], "--power applies to PCA whitening"),
        (["--dim", "99"], "dim must be in [1, 16]"),
        (["--multiscale", "1", "-2"], "scales > 0"),
        (["--dataset", "synthetic"], "name the split to fit on with --split"),
    ],
)
def test_whiten_bad_input_gives_one_clear_line(checkpoint, tmp_path, argv, message, capsys):
    assert main(["whiten", str(checkpoint), *argv, "--out", str(tmp_path / "w.safetensors"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "w.safetensors").exists()


def test_corrupt_whitening_file_is_a_clear_error(checkpoint, tmp_path, capsys):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"garbage")
    assert main(["evaluate", str(checkpoint), "--split", "test", "--whiten", str(bad), "--no-progress"]) == 1
    assert "not a readable safetensors file" in capsys.readouterr().err


def test_postprocess_arguments_are_reusable():
    parser = argparse.ArgumentParser()
    add_postprocess_arguments(parser, query_side=True, gallery_side=False)
    args = parser.parse_args(["--multiscale", "--qe", "3"])
    post = postprocessing_from_args(args, "0" * 16)
    assert post.scales == DEFAULT_SCALES and post.qe is not None and post.qe.k == 3 and post.dba is None
    assert post.preprocessing() == {"multiscale": [1.0, round(2**-0.5, 6), 0.5]}
    with pytest.raises(SystemExit):
        parser.parse_args(["--dba", "3"])  # a query-side command has no gallery option
    with pytest.raises(ValueError, match="--qe-alpha needs --qe"):
        postprocessing_from_args(parser.parse_args(["--qe-alpha", "1"]), "0" * 16)
