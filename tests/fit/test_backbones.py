"""``rankopt fit --backbone auto`` (:mod:`rankopt.fit.backbones`): the rule, and whole fits where it keeps the first
candidate or passes over it for the budget. The candidates are stood in for by random-weight checkpoints (no release
is fetched): SYNTHETIC photos, the choice is what is tested, not the weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.images import photo_folder
from rankopt.config import config_to_dict, load_config
from rankopt.engine.assembly import build_model
from rankopt.engine.checkpoint import save_model_checkpoint
from rankopt.fit import FitSettings, backbones, fit, flat, passes
from rankopt.fit.backbones import AUTO, CANDIDATES, candidates, holds, passed_over


def test_auto_tries_the_better_search_first_and_a_named_backbone_or_given_weights_alone():
    assert FitSettings().backbone == AUTO
    assert candidates(AUTO, None) == CANDIDATES and CANDIDATES[-1] == "mobilenet_v2"
    assert candidates("mobilenet_v2", None) == ("mobilenet_v2",)
    assert candidates(AUTO, "model.ckpt") == (AUTO,)  # a checkpoint names its own backbone
    assert holds(400.0, 600.0) and not holds(401.0, 600.0)
    assert passed_over("efficientnet_lite2", 480.0, 600.0) == (
        "efficientnet_lite2 passed over: one pass over the photos would take about 8:00, 80% of the 10:00 left "
        "(auto keeps a backbone up to 67%)")


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict[str, Path]:
    """Random-weight checkpoints at 64 px standing in for the two candidates' releases."""
    folder = tmp_path_factory.mktemp("releases")
    made = {}
    for name, backbone in (("first", "efficientnet_lite0"), ("last", "mobilenet_v2")):
        cfg = load_config(None, [f"model.backbone={backbone}", "data.image_size=64", "data.test_transform=test",
                                 "data.train_transform=train"])
        torch.manual_seed(0)
        made[name] = save_model_checkpoint(folder / f"{name}.ckpt", build_model(cfg).state_dict(),
                                           config_to_dict(cfg))
    return made


@pytest.fixture
def stand_ins(monkeypatch, releases):
    """``auto``'s candidates are the two checkpoints of ``releases``, resolved by name."""
    monkeypatch.setattr(backbones, "CANDIDATES", ("first", "last"))
    for module in (passes, flat):
        monkeypatch.setattr(module, "resolve_checkpoint", lambda name, weights, say: releases[name])


@pytest.mark.parametrize("share, kept", [(1.0, "efficientnet_lite0"), (0.0, "mobilenet_v2")],
                         ids=["the-budget-holds-the-first", "the-first-passed-over"])
def test_a_fit_keeps_the_first_candidate_whose_pass_the_budget_holds(tmp_path, monkeypatch, stand_ins, share, kept):
    monkeypatch.setattr(backbones, "PASS_SHARE", share)
    lines: list[str] = []
    record = fit(photo_folder(tmp_path / "photos"), tmp_path / "run",
                 FitSettings(minutes=0.3, backbone=AUTO, lrs=(1e-3,)), say=lines.append)
    assert record["backbone"] == kept
    model_line = next(line for line in lines if "] model: " in line)
    assert f"model: auto chose {kept}" in model_line
    assert ("first passed over: one pass over the photos would take about" in model_line) == (share == 0.0)


def test_a_flat_folder_chooses_as_a_fit_does(tmp_path, monkeypatch, stand_ins):
    monkeypatch.setattr(backbones, "PASS_SHARE", 0.0)
    photos = tmp_path / "photos"
    for path in photo_folder(tmp_path / "classes").rglob("*.jpg"):  # the same photos, no class folders
        photos.mkdir(exist_ok=True)
        (photos / f"{path.parent.name}-{path.name}").write_bytes(path.read_bytes())
    lines: list[str] = []
    record = fit(photos, tmp_path / "run", FitSettings(minutes=0.3, backbone=AUTO), say=lines.append)
    assert record["backbone"] == "mobilenet_v2"
    assert any("model: auto chose mobilenet_v2 (first passed over" in line for line in lines)
