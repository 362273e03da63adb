"""The fused compiled transform (``FastPath.fused``, ``rankopt.data._resample_kernels``) against its reference,
the transform's torch steps one by one (``FastPath.stepwise``), on the same decoded image and the same seed:
max |difference| <= 1e-5 in normalised units (float32 rounding only), the same draws from torch's RNG (its
state equal afterwards). Synthetic images always (random pixels: any wrong weight shows), real Caltech-101
JPEGs when RANKOPT_CALTECH101 names the folder."""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_fast_loading import photo

from rankopt.data.fast_transform import CenterCropStep, FastPath, NormalizeStep, RandomResizedCropStep, ResizeStep, fuse
from rankopt.data.image_files import load_image
from rankopt.data.transforms import PRESETS, build_transform

FUSED_PRESETS = sorted(p for p, spec in PRESETS.items() if not spec.area)
# odd sizes, both orientations, up- and downscales, tiny images (smaller than any crop) and extreme aspects
SHAPES = [(300, 200), (199, 301), (640, 427), (1023, 769), (57, 41), (12, 9), (4, 30), (1, 1), (1000, 37), (3, 500)]


def noise(width: int, height: int, seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def assert_same(transform: FastPath, image: Image.Image, seed: int, label: object) -> None:
    """Fused and stepwise on ``image`` from the same seed: same values (1e-5 in [0, 1] pixel units: the
    difference times the normalisation's std) and same draws."""
    torch.manual_seed(seed)
    fused = transform(image)
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    reference = transform.stepwise(image)
    assert fused.shape == reference.shape and fused.dtype == torch.float32 and fused.is_contiguous(), label
    std = next((step.std[0] for step in transform.steps if isinstance(step, NormalizeStep)), torch.ones(3, 1, 1))
    difference = float(((fused - reference).abs() * std).max())
    assert difference <= 1e-5, (label, difference)
    assert torch.equal(state, torch.get_rng_state()), label


@pytest.mark.parametrize("preset", FUSED_PRESETS)
@pytest.mark.parametrize("image_size", [None, 100, "96x130"])
def test_fused_equals_the_torch_steps(preset, image_size):
    transform = build_transform(preset, image_size)
    if PRESETS[preset].affine:
        assert transform.fast is None
        return
    assert transform.fast is not None and transform.fast.fused is not None, preset
    for i, (w, h) in enumerate(SHAPES):
        for seed in range(3):
            assert_same(transform.fast, noise(w, h, seed=i), seed, (preset, image_size, w, h, seed))


def test_fused_converts_any_mode_like_the_steps():
    transform = build_transform("train", 64).fast
    base = photo(203, 151)
    for mode in ("L", "RGBA", "CMYK", "P", "LA", "I;16", "1"):
        assert_same(transform, base.convert(mode), 3, mode)


def test_fused_covers_each_step_sequence():
    """Every supported sequence (with and without each optional step), and align_corners False."""
    normalize = NormalizeStep(*(torch.tensor(v).view(1, 3, 1, 1) for v in ([0.3, 0.4, 0.5], [0.2, 0.3, 0.4])))
    crop = CenterCropStep((40, 30))
    sequences = [
        [normalize], [], [ResizeStep(50, True, True)], [ResizeStep((33, 71), True, False), normalize],
        [ResizeStep(48, False, True), crop], [crop, normalize],
        [RandomResizedCropStep((36, 28), (0.1, 1.0), (0.5, 2.0), False), normalize],
        [ResizeStep(60, True, True), RandomResizedCropStep((64, 64), (0.2, 1.0), (0.75, 4 / 3), True)],
    ]
    for steps in sequences:
        path = FastPath(tuple(steps), fuse(steps))
        assert path.fused is not None, steps
        for i, (w, h) in enumerate([(90, 70), (61, 123), (45, 41)]):
            assert_same(path, noise(w, h, seed=i), i, (steps, w, h))
    assert fuse([crop, ResizeStep(50, True, True)]) is None  # not a fused sequence: the steps run


def test_center_crop_larger_than_the_image_falls_back_to_the_steps():
    steps = (ResizeStep(20, True, True), CenterCropStep((32, 32)))
    path = FastPath(steps, fuse(steps))
    image = noise(30, 25, seed=1)
    assert path.fused is not None and path.fused(image) is None
    with pytest.raises(AssertionError, match="Crop size must be smaller"):  # kornia's op, as the steps have it
        path(image)


def test_fused_runs_in_several_threads_without_changing_torchs_thread_count(monkeypatch):
    transform = build_transform("test", 96).fast
    images = [noise(200 + 7 * i, 150 + 5 * i, seed=i) for i in range(16)]
    expected = [transform.stepwise(image) for image in images]

    def refuse(_: int) -> None:
        raise AssertionError("the fused path changed torch's thread count")

    monkeypatch.setattr(torch, "set_num_threads", refuse)
    results: dict[int, torch.Tensor] = {}

    def work(start: int) -> None:
        for _ in range(3):
            for i in range(start, len(images), 4):
                results[i] = transform(images[i])

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(float((results[i] - expected[i]).abs().max()) <= 1e-5 for i in range(len(images)))


def caltech_files(count: int) -> list[Path]:
    root = os.environ.get("RANKOPT_CALTECH101")
    if not root or not Path(root).is_dir():
        pytest.skip("RANKOPT_CALTECH101 is not set to the Caltech-101 folder")
    files = sorted(Path(root).glob("*/*.jpg"))
    return files[:: max(len(files) // count, 1)][:count]


@pytest.mark.parametrize("preset", ["test", "train"])
@pytest.mark.parametrize("image_size", [128, 224])
def test_fused_equals_the_torch_steps_on_caltech_jpegs(preset, image_size):
    transform = build_transform(preset, image_size)
    for i, path in enumerate(caltech_files(40)):
        for side in (transform.decode_min_side, None):  # the reduced decode and the full one
            image = load_image(str(path), side)
            assert_same(transform.fast, image, i, (path.name, side))


def torch_window(step: RandomResizedCropStep, height: int, width: int) -> tuple[int, int, int, int] | None:
    """Oracle: the crop as torch's float32 ops compute it from the same draws (None: no candidate fits)."""
    low, high = math.log(step.ratio[0]), math.log(step.ratio[1])
    area = (torch.rand(10) * (step.scale[1] - step.scale[0]) + step.scale[0]) * height * width
    aspect = torch.exp(torch.rand(10) * (high - low) + low)
    w, h = torch.sqrt(area * aspect).round(), torch.sqrt(area / aspect).round()
    fits = ((w > 0) & (w <= width) & (h > 0) & (h <= height)).nonzero()
    if not fits.numel():
        return None
    h, w = int(h[fits[0, 0]]), int(w[fits[0, 0]])
    left = int(torch.rand(()) * (width - w + 1))
    return int(torch.rand(()) * (height - h + 1)), left, h, w


def test_crop_windows_are_torchs_float32_expression_draw_for_draw():
    for scale, ratio in (((0.16, 1.0), (3 / 4, 4 / 3)), ((0.08, 1.0), (0.3, 3.1))):
        step = RandomResizedCropStep((32, 32), scale, ratio, True)
        for height, width in ((146, 219), (300, 200), (41, 57), (997, 1000)):
            compared = 0
            for seed in range(400):
                torch.manual_seed(seed)
                expected = torch_window(step, height, width)
                torch.manual_seed(seed)
                if expected is not None:  # else the ratio-narrowed whole image
                    assert step.window(height, width) == expected, (scale, ratio, height, width, seed)
                    compared += 1
            assert compared > 250


def test_without_torch_is_the_transform_where_it_draws_nothing_and_runs_no_torch_op():
    """The serve request threads' path: equal to the transform for the test presets (an RGBA and a grey image
    included), None where the transform draws (a train preset) or has no fused kernel (area-resized omniglot)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        seen: set[str] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.add(str(func))
            return func(*args, **(kwargs or {}))

    test = build_transform("test", 96)
    for image in (noise(150, 110, 0), noise(90, 140, 1).convert("RGBA"), noise(120, 120, 2).convert("L")):
        with Ops() as mode:
            here = test.without_torch(image)
        assert mode.seen <= {"aten.lift_fresh.default"}  # wrapping the kernel's array, no computation
        torch.testing.assert_close(here, test(image), rtol=0, atol=0)
    assert build_transform("train", 96).without_torch(noise(150, 110, 3)) is None
    assert build_transform("omniglot_test").without_torch(noise(40, 40, 4)) is None
