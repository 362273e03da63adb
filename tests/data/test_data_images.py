"""Image decoding (Pillow; EXIF orientation; 1-bit/L/P/CMYK/RGBA/16-bit -> RGB) and transform presets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from rankopt.data.image_files import load_image, pil_to_tensor
from rankopt.data.transforms import IMAGENET_MEAN, IMAGENET_STD, PRESETS, build_transform


def saved(tmp_path, image: Image.Image, name: str, **kwargs) -> str:
    path = tmp_path / name
    image.save(path, **kwargs)
    return str(path)


def test_modes_become_rgb(tmp_path):
    cases = {
        "gray.png": Image.new("L", (5, 4), 77),
        "bits.png": Image.new("1", (5, 4), 0),
        "pal.png": Image.new("RGB", (5, 4), (10, 20, 30)).convert("P", palette=Image.Palette.ADAPTIVE),
        "cmyk.jpg": Image.new("CMYK", (5, 4), (0, 255, 255, 0)),
        "deep.png": Image.fromarray(np.full((4, 5), 65535, dtype=np.uint16)),
    }
    expected = {"gray.png": (77, 77, 77), "bits.png": (0, 0, 0), "pal.png": (10, 20, 30), "cmyk.jpg": (255, 0, 0), "deep.png": (255, 255, 255)}
    for name, image in cases.items():
        out = load_image(saved(tmp_path, image, name))
        assert out.mode == "RGB" and out.size == (5, 4)
        assert np.abs(np.asarray(out)[1, 1].astype(int) - expected[name]).max() <= 3, name


def test_alpha_is_composited_on_white(tmp_path):
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    rgba.putpixel((0, 0), (0, 0, 255, 255))
    rgba.putpixel((1, 0), (0, 0, 0, 128))
    out = np.asarray(load_image(saved(tmp_path, rgba, "a.png"))).astype(int)
    assert out[3, 3].tolist() == [255, 255, 255]  # transparent -> white, not black or red
    assert out[0, 0].tolist() == [0, 0, 255]
    assert abs(out[0, 1, 0] - 127) <= 1  # half alpha: halfway to white
    pal = Image.new("P", (2, 2), 0)
    pal.putpalette([0, 0, 0, 9, 9, 9])
    pal.info["transparency"] = 0
    assert np.asarray(load_image(saved(tmp_path, pal, "p.png", transparency=0)))[0, 0].tolist() == [255, 255, 255]


def test_exif_orientation_is_applied(tmp_path):
    image = Image.new("RGB", (6, 3), (0, 0, 0))
    image.putpixel((0, 0), (255, 255, 255))
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 clockwise to display
    path = saved(tmp_path, image, "o.jpg", exif=exif, quality=100)
    out = load_image(path)
    assert out.size == (3, 6)
    reference = image.transpose(Image.Transpose.ROTATE_270)  # independent: Pillow's transpose
    assert np.abs(np.asarray(out).astype(int) - np.asarray(reference).astype(int)).max() < 60


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_shapes_and_determinism(preset):
    image = Image.fromarray((np.random.default_rng(0).random((90, 130, 3)) * 255).astype(np.uint8))
    transform = build_transform(preset)
    torch.manual_seed(3)
    a = transform(image)
    torch.manual_seed(3)
    b = transform(image)
    height, width = PRESETS[preset].crop, PRESETS[preset].crop_width or PRESETS[preset].crop
    assert a.shape == (3, height, width) and a.dtype == torch.float32
    assert torch.equal(a, b)
    assert build_transform(preset, image_size=32)(image).shape == (3, 32, round(32 * width / height))
    assert build_transform(preset, image_size="40x24")(image).shape == (3, 40, 24)


def test_test_preset_matches_resize_then_center_crop():
    """Independent reference: torch bilinear resize (short side 256) then the central 224 window."""
    x = torch.linspace(0, 1, 600).repeat(3, 300, 1)  # horizontal gradient, 600 x 300
    image = Image.fromarray((x.permute(1, 2, 0).numpy() * 255).round().astype(np.uint8))
    out = build_transform("test")(image)
    mean, std = torch.tensor(IMAGENET_MEAN)[:, None, None], torch.tensor(IMAGENET_STD)[:, None, None]
    pixels = out * std + mean
    ref = torch.nn.functional.interpolate(pil_to_tensor(image)[None], size=(256, 512), mode="bilinear", antialias=True)[0]
    ref = ref[:, 16:240, 144:368]
    assert torch.allclose(pixels, ref, atol=0.02)


def test_train_preset_flips_and_crops():
    image = Image.new("RGB", (256, 256), (255, 0, 0))
    image.paste((0, 0, 255), (0, 0, 128, 256))  # left half blue
    transform = build_transform("train", image_size=64)
    left_blue = []
    for seed in range(20):
        torch.manual_seed(seed)
        out = transform(image)
        left_blue.append(bool(out[2, :, 0].mean() > out[0, :, 0].mean()))
    assert 0 < sum(left_blue) < 20  # random horizontal flips and crops both happen


def test_constant_image_is_normalised():
    out = build_transform("synthetic_test")(Image.new("RGB", (56, 56), (255, 0, 128)))
    expected = (torch.tensor([1.0, 0.0, 128 / 255]) - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    assert torch.allclose(out[:, 10, 10], expected, atol=1e-4)


def test_face_presets_follow_their_weights_input_conventions():
    """SENet-50 (VGGFace2 PyTorch release): 0-255 minus the mean face, RGB; IResNet (ArcFace): (x - 0.5) / 0.5."""
    from rankopt.data.transforms import VGGFACE2_MEAN_RGB

    rgb = (255, 0, 128)
    out = build_transform("vggface2_test")(Image.new("RGB", (300, 250), rgb))
    assert out.shape == (3, 224, 224)
    expected = torch.tensor(rgb, dtype=torch.float32) - torch.tensor((131.0912, 103.8827, 91.4953))
    assert VGGFACE2_MEAN_RGB == (131.0912, 103.8827, 91.4953)
    assert torch.allclose(out[:, 100, 100], expected, atol=1e-3)
    out = build_transform("arcface_test")(Image.new("RGB", (112, 112), rgb))
    assert out.shape == (3, 112, 112)
    assert torch.allclose(out[:, 50, 50], (torch.tensor(rgb) / 255 - 0.5) / 0.5, atol=1e-5)


def test_unknown_preset():
    with pytest.raises(KeyError, match="unknown transform preset"):
        build_transform("randaugment")


def test_batch_mode_draws_parameters_per_image():
    image = torch.rand(3, 56, 56)
    batch = image.expand(8, 3, 56, 56).contiguous()
    out = build_transform("synthetic_train")(batch)
    assert out.shape == (8, 3, 48, 48)
    assert len({tuple(o.flatten()[:50].tolist()) for o in out}) > 1  # not the same crop for all
    single = build_transform("synthetic_test")
    assert torch.allclose(single(batch)[0], single(image), atol=1e-6)
    with pytest.raises(ValueError, match="expected a"):
        single(torch.rand(1, 56, 56))
