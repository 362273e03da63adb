"""The framing choice of ``rankopt fit`` (SYNTHETIC photos, labelled as such): the whole photo replaces the model's
centre crop only when the validation classes clearly gain, and the presets keep the model's input convention."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rankopt.data.transforms import PRESETS, build_transform
from rankopt.fit.framing import WHOLE_PHOTO, choose_framing
from rankopt.fit.photos import read_photos
from rankopt.models import create_model

CLASSES, PER_CLASS, SIDE, BAND = 6, 8, 80, 4


def _photos(root: Path, where: str, seed: int = 0) -> Path:
    """SYNTHETIC: each class a colour, painted in a ``BAND``-pixel frame (``where="border"``, which the centre crop
    cuts away) or in the middle (``"centre"``); the rest low-contrast grey noise, different in every photo."""
    rng = np.random.default_rng(seed)
    colours = rng.integers(0, 256, (CLASSES, 3))
    for c in range(CLASSES):
        (root / f"class{c}").mkdir(parents=True)
        for i in range(PER_CLASS):
            pixels = (128 + 20 * rng.standard_normal((SIDE, SIDE, 3))).clip(0, 255)
            if where == "border":
                mask = np.ones((SIDE, SIDE), bool)
                mask[BAND:-BAND, BAND:-BAND] = False
            else:
                mask = np.zeros((SIDE, SIDE), bool)
                mask[SIDE // 4: -SIDE // 4, SIDE // 4: -SIDE // 4] = True
            pixels[mask] = colours[c]
            Image.fromarray(pixels.astype(np.uint8)).save(root / f"class{c}" / f"{i}.png")
    return root


def _choose(root: Path):
    torch.manual_seed(0)
    net = create_model("mobilenet_v2").eval()
    dataset = read_photos(root, None)
    labels = np.asarray(dataset.labels)[:, 0]
    names = list(dataset.metadata["label_names"][0])
    return choose_framing(net, dataset, labels, names, "test", 64, device=torch.device("cpu"), batch_size=16)


def test_the_whole_photo_is_chosen_when_the_centre_crop_cuts_the_class_away(tmp_path):
    root = _photos(tmp_path / "photos", "border")
    crop = build_transform("test", 64)(Image.open(next(root.rglob("*.png"))))
    assert crop.shape == (3, 64, 64)
    choice = _choose(root)
    assert choice.preset == "landmark_test", choice.note
    assert choice.scores["landmark_test"] > choice.scores["test"] + 0.2
    assert "the whole photo is used" in choice.note and choice.words() == "whole photo"


def test_the_model_s_own_framing_stays_without_a_clear_gain(tmp_path):
    choice = _choose(_photos(tmp_path / "photos", "centre"))
    assert choice.preset == "test", choice.note
    assert set(choice.scores) == {"test", "landmark_test"} and "kept" in choice.note
    assert choice.words() == "centre crop"


def test_a_convention_without_another_framing_is_kept_untouched(tmp_path):
    root = _photos(tmp_path / "photos", "border")
    dataset = read_photos(root, None)
    choice = choose_framing(torch.nn.Identity(), dataset, np.asarray(dataset.labels)[:, 0], [], "mobilefacenet_test",
                            None, device=torch.device("cpu"), batch_size=16)
    assert choice.preset == "mobilefacenet_test" and choice.scores == {} and choice.words() == ""


@pytest.mark.parametrize("own", sorted(WHOLE_PHOTO))
def test_the_whole_photo_keeps_the_model_s_input_convention(own):
    whole = PRESETS[WHOLE_PHOTO[own]]
    assert whole.square and not whole.train and not PRESETS[own].square
    assert (whole.mean, whole.std, whole.crop) == (PRESETS[own].mean, PRESETS[own].std, PRESETS[own].crop)
