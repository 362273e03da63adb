"""Released weights without training: ``rankopt convert``, model checkpoints (safetensors), ``model.init``,
``model.freeze`` and ``train.epochs=0``.

A "release" here is a backbone state dict written by the test (convnet_tiny, resnet18), so every check runs
without downloads; the real releases' layouts are tested in tests/models/test_mobile_backbones.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from rankopt.cli import main
from rankopt.config import load_config
from rankopt.engine import checkpoint as ckpt
from rankopt.engine.assembly import adopt_init_model, build_model, model_from_checkpoint
from rankopt.engine.convert import convert_released_weights, native_presets, write_converted
from rankopt.models import build_backbone

SMALL = ["data.kwargs.images_per_class=4", "eval.batch_size=200", "output.figures=false", "output.progress=false",
         "output.tensorboard=false"]


@pytest.fixture
def release(tmp_path: Path) -> Path:
    """A convnet_tiny backbone's weights as a plain torch file (its own key layout)."""
    torch.manual_seed(3)
    path = tmp_path / "convnet_tiny_release.pth"
    torch.save(build_backbone("convnet_tiny").state_dict(), path)
    return path


def test_convert_writes_a_safetensors_model_checkpoint_with_the_release_weights(release, tmp_path):
    converted = convert_released_weights("convnet_tiny", release, image_size="40x32")
    out = write_converted(converted, tmp_path / "model.ckpt")
    head = out.read_bytes()[:9]
    assert head[8:9] == b"{"  # safetensors: header length then JSON, not a pickle
    state = ckpt.load_checkpoint(out)
    assert set(state) == {"model", "config", "source"}
    released = torch.load(release, weights_only=True)
    for key, value in released.items():
        assert torch.equal(state["model"][f"backbone.{key}"], value), key
    assert state["source"]["weights"] == release.name and len(state["source"]["sha256"]) == 64
    model, cfg = model_from_checkpoint(out)
    assert cfg.data.image_size == "40x32" and cfg.data.test_transform == "test" and cfg.model.init is None
    images = torch.rand(3, 3, 40, 32)
    with torch.no_grad():
        assert torch.allclose(model(images), converted.model(images))


def test_native_presets_are_the_releases_input_conventions():
    assert native_presets("mobilefacenet") == ("mobilefacenet_train", "mobilefacenet_test")
    assert native_presets("efficientnet_lite0") == ("tf_lite_train", "tf_lite_test")
    assert native_presets("efficientnet_lite2") == ("tf_lite_train", "tf_lite_test")
    assert native_presets("iresnet50") == ("arcface_train", "arcface_test")
    assert native_presets("mobilenet_v2") == ("train", "test")


def test_a_release_trained_off_its_presets_size_converts_at_its_own(tmp_path):
    path = tmp_path / "lite2.pth"  # EfficientNet-Lite2: the tf_lite presets at 260 px, not their 224
    torch.save(build_backbone("efficientnet_lite2").state_dict(), path)
    assert convert_released_weights("efficientnet_lite2", path).config.data.image_size == 260
    assert convert_released_weights("efficientnet_lite2", path, image_size=224).config.data.image_size == 224


def test_convert_errors_name_the_problem(release, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        convert_released_weights("convnet_tiny", tmp_path / "nope.pth")
    with pytest.raises(ValueError, match="do not match"):  # another network's weights
        convert_released_weights("convnet_small", release)
    with pytest.raises(KeyError, match="unknown transform preset"):
        convert_released_weights("convnet_tiny", release, transform="nope_test")
    with pytest.raises(ValueError, match="image size"):
        convert_released_weights("convnet_tiny", release, image_size="big")
    stray = tmp_path / "stray.safetensors"
    save_file({"w": torch.zeros(2)}, str(stray))
    with pytest.raises(ValueError, match="not a rankopt model checkpoint"):
        ckpt.load_checkpoint(stray)
    plain = tmp_path / "plain.pth"  # released weights given where a rankopt checkpoint is expected
    torch.save({"weight": torch.zeros(2)}, plain)
    with pytest.raises(ValueError, match="rankopt convert"):
        model_from_checkpoint(plain)


def test_every_checkpoint_command_takes_a_converted_model(release, tmp_path, capsys):
    out = tmp_path / "model.ckpt"
    assert main(["convert", "convnet_tiny", str(release), "--out", str(out), "--image-size", "32"]) == 0
    printed = capsys.readouterr().out
    assert "fingerprint" in printed and "wrote" in printed
    metrics = tmp_path / "m.json"
    assert main(["evaluate", str(out), "--dataset", "synthetic", "--metrics", "recall@1", "map@r", "--json",
                 str(metrics), "--no-progress"]) == 0
    assert set(json.loads(metrics.read_text())["metrics"]) >= {"recall@1", "map@r"}
    emb = tmp_path / "e.npy"
    assert main(["embed", str(out), "--dataset", "synthetic", "--split", "test", "--out", str(emb),
                 "--no-progress"]) == 0
    assert emb.is_file()
    white = tmp_path / "w.safetensors"
    assert main(["whiten", str(out), "--dataset", "synthetic", "--split", "train", "--out", str(white),
                 "--no-progress"]) == 0
    images = tmp_path / "images"
    images.mkdir()
    for i in range(6):
        Image.fromarray(np.random.default_rng(i).integers(0, 255, (40, 36, 3), dtype=np.uint8)).save(images / f"{i}.png")
    index = tmp_path / "index"
    assert main(["index", str(out), "--images", str(images), "--out", str(index), "--no-progress"]) == 0
    found = tmp_path / "found.json"
    assert main(["search", str(index), str(images / "0.png"), "--top-k", "3", "--json", str(found),
                 "--no-progress"]) == 0
    records = json.loads(found.read_text())
    assert Path(records[0]["results"][0]["path"]).name == "0.png"  # an indexed image finds itself first


def test_train_from_a_converted_model_adopts_its_architecture_and_weights(release, tmp_path):
    model_ckpt = write_converted(convert_released_weights("convnet_tiny", release, image_size=32),
                                 tmp_path / "model.ckpt")
    cfg = load_config(None, [*SMALL, f"model.init={model_ckpt}", "model.backbone=convnet_small",
                             "model.embedding_dim=16", "data.image_size=32", "data.batch_transform=false"])
    adopted, notes = adopt_init_model(cfg)
    assert adopted.model.backbone == "convnet_tiny" and adopted.model.embedding_dim is None
    assert any("model.backbone" in n for n in notes) and any("test transform" in n for n in notes)
    model = build_model(adopted)
    reference, _ = model_from_checkpoint(model_ckpt)
    for key, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key

    run = tmp_path / "run"
    assert main(["train", *SMALL, f"model.init={model_ckpt}", "data.image_size=32", "data.batch_transform=false",
                 "train.epochs=1",
                 "train.max_steps_per_epoch=2", "--output", str(run)]) == 0
    report = json.loads((run / "report.json").read_text())
    from rankopt.engine.assembly import build_datasets
    from rankopt.engine.embed_and_score import evaluate_model

    _, splits = build_datasets(adopted, train=False)
    converted_eval, _ = evaluate_model(reference, splits, adopted.eval, metrics=["map@r"], show_progress=False)
    # the run's epoch-0 evaluation is the converted model's, on the same split and transform
    assert report["untrained"]["map@r"] == pytest.approx(converted_eval.metrics["map@r"])
    assert report["steps"] == 2 and report["epochs"] == 1  # a new run: fresh optimizer, from epoch 0
    saved = ckpt.load_checkpoint(run / "checkpoints" / "last.ckpt")
    assert saved["config"]["model"]["backbone"] == "convnet_tiny"
    trained, _ = model_from_checkpoint(run / "checkpoints" / "last.ckpt")  # loads without the init file
    assert any(not torch.equal(trained.state_dict()[k], v) for k, v in reference.state_dict().items())


def test_frozen_prefixes_are_not_trained_and_keep_their_statistics(tmp_path):
    run = tmp_path / "run"
    frozen = "backbone.features.0"
    assert main(["train", *SMALL, "model.backbone=convnet_tiny", "model.embedding_dim=16", "model.freeze_bn=false",
                 f"model.freeze=[{frozen}]", "train.epochs=1", "train.max_steps_per_epoch=2", "--output", str(run)]) == 0
    cfg = load_config(None, [*SMALL, "model.backbone=convnet_tiny", "model.embedding_dim=16", "train.seed=0"])
    torch.manual_seed(0)
    start = build_model(cfg).state_dict()
    after = ckpt.load_checkpoint(run / "checkpoints" / "last.ckpt")["model"]
    frozen_keys = [k for k in after if k.startswith(frozen + ".")]
    assert frozen_keys
    changed = [k for k in after if not torch.equal(after[k], start[k])]
    assert changed and not any(k.startswith(frozen + ".") for k in changed)
    with pytest.raises(ValueError, match="match no parameter"):
        build_model(load_config(None, ["model.backbone=convnet_tiny", "model.freeze=[backbone.nope]"]))


def test_zero_epochs_evaluate_the_initial_model_as_the_trained_row(tmp_path):
    run = tmp_path / "run"
    assert main(["train", *SMALL, "model.backbone=convnet_tiny", "model.embedding_dim=16", "train.epochs=0",
                 "--output", str(run)]) == 0
    report = json.loads((run / "report.json").read_text())
    assert report["trained"] == report["untrained"] and report["steps"] == 0
    with pytest.raises(ValueError, match="train.epochs"):
        load_config(None, ["train.epochs=-1"])


def test_a_converted_face_model_embeds_at_its_release_input_convention(tmp_path):
    """MobileFaceNet's release: RGB 112 x 96, (255 x - 127.5) / 128 — the converted checkpoint's default."""
    from rankopt.data.transforms import build_transform

    release = tmp_path / "068.ckpt"
    torch.save({"epoch": 68, "net_state_dict": build_backbone("mobilefacenet").state_dict()}, release)
    out = write_converted(convert_released_weights("mobilefacenet", release), tmp_path / "mfn.ckpt")
    model, cfg = model_from_checkpoint(out)
    assert (cfg.data.test_transform, cfg.data.train_transform) == ("mobilefacenet_test", "mobilefacenet_train")
    x = build_transform(cfg.data.test_transform, cfg.data.image_size)(Image.new("RGB", (168, 192), (255, 0, 128)))
    assert x.shape == (3, 112, 96)
    assert torch.allclose(x[:, 0, 0], torch.tensor([(255 - 127.5) / 128, -127.5 / 128, 0.5 / 128]), atol=1e-5)
    with torch.no_grad():
        assert model(x.unsqueeze(0)).shape == (1, 128)
