"""The fast loading path against its references: the transforms' plain-torch per-image path
(``rankopt.data.fast_transform``) against their kornia ops (``ImageTransform.reference``), and the
reduced-size JPEG decode (``rankopt.data.decode``) against the full decode (``load_image(path)``).

Tolerances, in [0, 1] pixel units (normalised differences times the preset's std):
- fast path vs kornia ops on the same decoded image: max |difference| <= 1e-5 (same formulas,
  float32 rounding only);
- reduced JPEG decode vs full decode, through the ``test`` transform: mean |difference| <= 0.008 and
  max <= 0.2 on the photo-like JPEGs below (sharp edges alias differently once decoded at 1/2-1/8
  size: the kornia resize's Gaussian, sigma = (f - 1) / 2, leaves some aliasing, the DCT scaling
  another); a decode that is not reduced (small image, PNG) gives identical tensors.
"""

from __future__ import annotations

import math

import kornia.augmentation as K
import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from rankopt.data.base import BadImageError, RetrievalDataset
from rankopt.data.decode import DRAFT_GAP
from rankopt.data.fast_transform import RandomResizedCropStep, antialiased_resize, short_side_size
from rankopt.data.image_files import load_image, pil_to_tensor
from rankopt.data.transforms import PRESETS, build_transform


def photo(width: int, height: int, seed: int = 0) -> Image.Image:
    """A photo-like RGB image: smooth colour fields, fine grain and sharp-edged ellipses."""
    if min(width, height) < 64:
        return photo(max(width, 64), max(height, 64), seed).resize((width, height), Image.BILINEAR)
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(width, height)
    base = np.stack([np.sin(6 * x + 3 * y), np.cos(5 * y - 2 * x), np.sin(4 * (x + y))], -1) * 0.3 + 0.5
    grain = rng.random((height // 8 + 1, width // 8 + 1, 3))
    grain = np.asarray(Image.fromarray((grain * 255).astype(np.uint8)).resize((width, height), Image.BICUBIC))
    img = Image.fromarray(np.clip(base * 204 + grain * 0.2, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(6):
        x0, y0 = int(rng.integers(0, width - 10)), int(rng.integers(0, height - 10))
        box = (x0, y0, x0 + int(rng.integers(10, width // 3)), y0 + int(rng.integers(10, height // 3)))
        draw.ellipse(box, fill=tuple(int(v) for v in rng.integers(0, 255, 3)))
    return img


def pixel_difference(a: torch.Tensor, b: torch.Tensor, preset: str) -> torch.Tensor:
    """|a - b| in [0, 1] pixel units (the normalisation divided by std)."""
    return (a - b).abs() * torch.tensor(PRESETS[preset].std).view(3, 1, 1)


FAST_TEST_PRESETS = sorted(p for p, spec in PRESETS.items() if not spec.train and not spec.affine)
SHAPES = [(300, 200), (199, 301), (640, 427), (57, 41), (12, 9), (4, 30)]


@pytest.mark.parametrize("preset", FAST_TEST_PRESETS)
@pytest.mark.parametrize("image_size", [None, 100])
def test_fast_path_equals_the_kornia_ops(preset, image_size):
    transform = build_transform(preset, image_size)
    assert transform.fast is not None
    for i, (w, h) in enumerate(SHAPES):
        image = photo(w, h, seed=i)
        fast, reference = transform(image), transform.reference(image)
        assert fast.shape == reference.shape and fast.dtype == torch.float32 and fast.is_contiguous()
        assert float(pixel_difference(fast, reference, preset).max()) <= 1e-5, (preset, w, h)


def test_antialiased_resize_is_kornias_formula():
    """Independent reference: kornia's functional resize (Gaussian anti-aliasing, align_corners=True)."""
    from kornia.geometry.transform import resize

    x = torch.rand(2, 3, 57, 83)
    for size in [(20, 30), (57, 83), (90, 40), (5, 83), (1, 1)]:
        expected = resize(x, size, antialias=True, align_corners=True)
        assert torch.allclose(antialiased_resize(x, size), expected, atol=1e-6), size
    assert short_side_size(200, 300, 146) == (146, 219) and short_side_size(301, 199, 146) == (220, 146)


def test_train_fast_path_draws_kornias_crop_distribution():
    """Crop sizes of RandomResizedCrop: the fast path's draws against kornia's own parameter generator."""
    op = K.RandomResizedCrop((32, 32), scale=(0.16, 1.0), ratio=(3 / 4, 4 / 3))
    step = RandomResizedCropStep((32, 32), (0.16, 1.0), (3 / 4, 4 / 3), True)
    torch.manual_seed(0)
    ours = torch.tensor([step.crop_size(60, 90) for _ in range(3000)], dtype=torch.float64)
    boxes = op._param_generator(torch.Size([3000, 3, 60, 90]))["src"]
    theirs = torch.stack([boxes[:, 2, 1] - boxes[:, 0, 1] + 1, boxes[:, 2, 0] - boxes[:, 0, 0] + 1], 1).double()
    fraction = ours.prod(1) / (60 * 90)
    assert float(fraction.min()) >= 0.15 and float(fraction.max()) <= 1.0
    aspect = ours[:, 1] / ours[:, 0]
    assert float(aspect.min()) >= 0.7 and float(aspect.max()) <= 1.4
    for q in (0.1, 0.5, 0.9):
        for side in (0, 1):
            a, b = torch.quantile(ours[:, side], q), torch.quantile(theirs[:, side], q)
            assert abs(float(a - b)) <= 2.5, (q, side, float(a), float(b))
    # nothing fits a 1000 x 10 strip: the whole height, the width narrowed to the largest ratio
    assert step.crop_size(10, 1000) == (10, 13)


def test_train_fast_path_shapes_flips_and_whole_image_crop():
    image = Image.new("RGB", (256, 256), (255, 0, 0))
    image.paste((0, 0, 255), (0, 0, 128, 256))  # left half blue
    transform = build_transform("train", image_size=64)
    assert transform.fast is not None
    left_blue = []
    for seed in range(40):
        torch.manual_seed(seed)
        out = transform(image)
        assert out.shape == (3, 64, 64)
        left_blue.append(bool(out[2, :, 0].mean() > out[0, :, 0].mean()))
    assert 8 < sum(left_blue) < 32  # p = 0.5 flips
    whole = RandomResizedCropStep((20, 30), (1.0, 1.0), (1.5, 1.5), True)  # the crop is the whole 40 x 60 image
    x = pil_to_tensor(photo(60, 40))[None]
    expected = torch.nn.functional.interpolate(x, (20, 30), mode="bilinear", align_corners=True)
    assert torch.allclose(whole(x), expected, atol=1e-6)


def test_unsupported_ops_keep_the_kornia_pipeline():
    transform = build_transform("omniglot_train")  # RandomAffine: no fast path
    assert transform.fast is None
    image = photo(105, 105).convert("L")
    torch.manual_seed(5)
    a = transform(image)
    torch.manual_seed(5)
    assert torch.equal(a, transform.reference(image))


def saved(tmp_path, image: Image.Image, name: str, **kwargs) -> str:
    path = tmp_path / name
    image.save(path, **kwargs)
    return str(path)


@pytest.mark.parametrize("image_size", [128, 224])
def test_reduced_jpeg_decode_is_within_tolerance(tmp_path, image_size):
    transform = build_transform("test", image_size)
    side = transform.decode_min_side
    assert side == round(256 * image_size / 224)
    rotated = Image.Exif()
    rotated[0x0112] = 6  # displayed rotated by 90 degrees
    files = {
        "landscape.jpg": (photo(1600, 1200), {"quality": 90}),
        "portrait.jpg": (photo(1200, 1700, seed=1), {"quality": 90}),
        "medium.jpg": (photo(900, 620, seed=2), {"quality": 90}),
        "small.jpg": (photo(300, 200, seed=3), {"quality": 90}),
        "exif.jpg": (photo(1700, 1100, seed=4), {"quality": 90, "exif": rotated}),
        "gray.jpg": (photo(1500, 1000, seed=5).convert("L"), {"quality": 90}),
        "cmyk.jpg": (photo(1400, 1000, seed=6).convert("CMYK"), {"quality": 90}),
        "alpha.png": (photo(1200, 900, seed=7).convert("RGBA"), {}),
    }
    reduced = 0
    for name, (image, options) in files.items():
        path = saved(tmp_path, image, name, **options)
        full, fast = load_image(path), load_image(path, side)
        assert fast.mode == "RGB" and (fast.width >= fast.height) == (full.width >= full.height), name
        assert min(fast.size) >= min(math.ceil(DRAFT_GAP * side), min(full.size)), name  # never below the target
        a, b = transform(fast), transform(full)
        diff = pixel_difference(a, b, "test")
        if fast.size == full.size:
            assert float(diff.max()) <= 1e-6, name
            continue
        reduced += 1
        assert float(diff.mean()) <= 0.008 and float(diff.max()) <= 0.2, (name, float(diff.mean()), float(diff.max()))
    assert reduced >= 3  # the large JPEGs were decoded at reduced size
    assert load_image(saved(tmp_path, photo(1600, 1200), "big.jpg"), 100).size == (400, 300)  # 1/4: 300 >= 2 x 100


def test_dataset_decodes_reduced_only_without_box_or_landmarks(tmp_path):
    path = saved(tmp_path, photo(1600, 1200), "big.jpg", quality=90)
    transform = build_transform("test", 64)
    ds = RetrievalDataset([path, path], np.zeros(2, dtype=np.int64), "test", ("class",), transform,
                          boxes={1: (100, 100, 1500, 1100)})
    plain, boxed = ds[0]["image"], ds[1]["image"]
    assert torch.equal(plain, transform(load_image(path, transform.decode_min_side)))
    assert torch.equal(boxed, transform(load_image(path).crop((100, 100, 1500, 1100))))
    assert ds.load(0).size == (1600, 1200)  # load() without min_side: the full decode


def test_bad_and_truncated_images_name_the_file(tmp_path):
    good = tmp_path / "good.jpg"
    photo(800, 600).save(good, quality=90)
    truncated = tmp_path / "truncated.jpg"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    garbage = tmp_path / "garbage.jpg"
    garbage.write_bytes(b"not an image at all")
    ds = RetrievalDataset([str(truncated), str(garbage)], np.zeros(2, dtype=np.int64), "test", ("class",),
                          build_transform("test", 64), sources=["list.txt:1", "list.txt:2"])
    with pytest.raises(BadImageError, match=r"truncated\.jpg.*list\.txt:1"):
        ds[0]
    with pytest.raises(BadImageError, match=r"garbage\.jpg.*list\.txt:2.*not an image file Pillow can read"):
        ds[1]
