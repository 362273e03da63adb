"""The papers' augmentation protocols as named presets (kornia ops on tensors, Pillow decoding).

==================  ==========================================================================
preset              ops (then ImageNet mean/std normalisation)
==================  ==========================================================================
``train``           resize shorter side 256, RandomResizedCrop 224 scale (0.16, 1) ratio (3/4, 4/3), h-flip
``test``            resize shorter side 256, center crop 224
``train_big``       288 -> RandomResizedCrop 256 (same scale/ratio), h-flip
``test_big``        288 -> center crop 256
``landmark_train``  resize to 224 x 224 (aspect not kept, as ROADMAP/SupRank), h-flip
``landmark_test``   resize to 224 x 224 (multi-scale evaluation rescales this by 1, 1/sqrt 2, 1/2)
``synthetic_train`` RandomResizedCrop 48 of the 56 px synthetic images, scale (0.5, 1), h-flip
``synthetic_test``  resize 56, center crop 48
``omniglot_train``  area-resize to 32 x 32, random affine (rotation ±10°, shift ±8 %, scale 0.9-1.1, white fill), no
flip ``omniglot_test``   area-resize to 32 x 32
``vggface2_train``  resize to 224 x 224, h-flip; 0-255 minus the VGGFace2 mean face, RGB (SENet-50 PyTorch release)
``vggface2_test``   resize to 224 x 224; same input convention
``arcface_train``   resize to 112 x 112 (aligned crops already are), h-flip; (x - 0.5) / 0.5 (IResNet release)
``arcface_test``    resize to 112 x 112; same input convention
``mobilefacenet_train`` resize to 112 x 96 (H x W), h-flip; (255 x - 127.5) / 128, RGB (MobileFaceNet release)
``mobilefacenet_test``  resize to 112 x 96; same input convention
``tf_lite_train``   as ``train`` with the TF-Lite models' input convention (255 x - 127) / 128 (EfficientNet-Lite)
``tf_lite_test``    as ``test``; same input convention
``tf_lite_whole_test`` as ``landmark_test`` (the whole photo at 224 x 224); the TF-Lite input convention
==================  ==========================================================================

Face presets follow Smooth-AP §5.3: SENet-50 on the (extended) VGGFace2 crops resized to 224 x 224,
ArcFace on 112 x 112 crops aligned by 5 landmarks; each with the input convention of its released weights.

``image_size`` replaces the output size: ``S`` (or ``"S"``) keeps the preset's aspect (square presets
become ``S x S``, ``mobilefacenet`` ``S x round(S·96/112)``), ``"HxW"`` (or ``(H, W)``) sets both; the resize
step keeps its ratio to the crop (256/224 for ``train``). The other presets normalise by the ImageNet mean/std.
A preset name may carry a model's own input convention (:func:`convention_preset`, e.g. a timm or open_clip
model's): ``test(mean=R,G,B;std=R,G,B;crop_pct=P)`` is ``test`` with that mean/std and the shorter side resized to
``floor(crop / P)`` (timm's ``crop_pct``); the name alone is what a checkpoint's config stores.
Randomness comes from torch's global RNG (deterministic given its state, e.g. per DataLoader worker seed).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from rankopt.checks import ImageSize, parse_image_size
from rankopt.data.fast_transform import (AreaResize, CenterCropStep, FlipStep, NormalizeStep, RandomResizedCropStep,
                                         ResizeStep, Step, fast_path)
from rankopt.data.image_files import pil_to_tensor, to_rgb

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
VGGFACE2_MEAN_RGB = (131.0912, 103.8827, 91.4953)  # the VGGFace2 models' mean face, 0-255 (RGB, as their PyTorch port)


@dataclass(frozen=True)
class Preset:
    resize: int  # shorter side (or both sides when square)
    crop: int  # output height (and width unless crop_width)
    train: bool
    square: bool = False
    scale: tuple[float, float] = (0.16, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    affine: bool = False  # small random rotation/shift/scale instead of a random crop (handwriting)
    flip: bool = True  # random horizontal flip when training (not for characters)
    area: bool = False  # square resize by area averaging (fast, alias-free downscaling of thin strokes)
    mean: tuple[float, ...] = IMAGENET_MEAN  # of the [0, 1] RGB input
    std: tuple[float, ...] = IMAGENET_STD
    crop_width: int | None = None  # output width of a square-resize preset, when not crop (e.g. 112 x 96 faces)
    crop_pct: float | None = None  # share of the resized shorter side the crop keeps (timm's); None: crop / resize


PRESETS: dict[str, Preset] = {
    "train": Preset(256, 224, True),
    "test": Preset(256, 224, False),
    "train_big": Preset(288, 256, True),
    "test_big": Preset(288, 256, False),
    "landmark_train": Preset(224, 224, True, square=True),
    "landmark_test": Preset(224, 224, False, square=True),
    "synthetic_train": Preset(56, 48, True, scale=(0.5, 1.0)),
    "synthetic_test": Preset(56, 48, False),
    "omniglot_train": Preset(32, 32, True, square=True, affine=True, flip=False, area=True),
    "omniglot_test": Preset(32, 32, False, square=True, area=True),
    **{f"vggface2_{mode}": Preset(224, 224, mode == "train", square=True, std=(1 / 255,) * 3,
                                  mean=tuple(m / 255 for m in VGGFACE2_MEAN_RGB)) for mode in ("train", "test")},
    **{f"arcface_{mode}": Preset(112, 112, mode == "train", square=True, mean=(0.5,) * 3, std=(0.5,) * 3)
       for mode in ("train", "test")},
    **{f"mobilefacenet_{mode}": Preset(112, 112, mode == "train", square=True, crop_width=96, mean=(0.5,) * 3,
                                       std=(128 / 255,) * 3) for mode in ("train", "test")},
    "tf_lite_train": Preset(256, 224, True, mean=(127 / 255,) * 3, std=(128 / 255,) * 3),
    "tf_lite_test": Preset(256, 224, False, mean=(127 / 255,) * 3, std=(128 / 255,) * 3),
    "tf_lite_whole_test": Preset(224, 224, False, square=True, mean=(127 / 255,) * 3, std=(128 / 255,) * 3),
}

class ImageTransform:
    """PIL image (any mode), ``(H, W, 3)`` uint8 RGB array or (3, H, W) tensor in [0, 1] -> normalised FloatTensor
    (3, h, w); a (B, 3, H, W) batch -> (B, 3, h, w) with independent random parameters per image.

    Applying it to whole batches of same-size images (e.g. the synthetic set decoded with
    ``transform=None``) is faster than per image: kornia's per-call cost is paid once (measured:
    benchmarks/results/loader.md).
    A PIL image takes ``fast`` (the same ops in plain torch, :mod:`rankopt.data.fast_transform`) when
    every op has one; :meth:`reference` runs the kornia ops (:attr:`ops`, made and kornia imported on first
    use). ``decode_min_side``: the shorter side the first resize needs (a dataset may decode JPEGs at
    reduced size, :mod:`rankopt.data.decode`).
    """

    def __init__(self, preset: str, spec: Preset, crop: int, width: int, resize: int) -> None:
        self.preset = preset
        self._made = (spec, crop, width, resize)
        steps = _fast_steps(spec, crop, width, resize)
        self.fast = None if steps is None else fast_path(steps)
        self.decode_min_side = max(crop, width) if spec.square else resize

    @functools.cached_property
    def ops(self) -> torch.nn.Sequential:
        """The preset's kornia ops (what :attr:`fast` reproduces)."""
        return _kornia_ops(*self._made)

    @property
    def takes_pixels(self) -> bool:
        """Whether ``(H, W, 3)`` uint8 RGB arrays take the fused path (a dataset may then hand over a JPEG's
        pixels as decoded, :func:`~rankopt.data.decode.decode_jpeg_pixels`, without a Pillow image)."""
        return self.fast is not None and self.fast.fused is not None

    def __call__(self, image: Image.Image | np.ndarray | torch.Tensor) -> torch.Tensor:
        if isinstance(image, np.ndarray):
            if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
                raise ValueError(f"expected (H, W, 3) uint8 RGB pixels, got {image.dtype} {image.shape}")
            if self.fast is None:
                return self.reference(Image.fromarray(image))
        if isinstance(image, (Image.Image, np.ndarray)) and self.fast is not None:
            return self.fast(image)
        return self.reference(image)

    def without_torch(self, image: Image.Image) -> torch.Tensor | None:
        """``self(image)`` made without a torch operation, so on any thread beside the one running the model (the
        fused kernel of a preset that draws nothing: every test preset but the area-resized ones), or None where
        this transform needs torch for ``image`` (:mod:`rankopt.serve.batcher` then transforms it on its torch
        thread)."""
        fused = self.fast.fused if self.fast is not None else None
        if fused is None or fused.draws or not isinstance(image, Image.Image):
            return None
        return fused(to_rgb(image))

    def reference(self, image: Image.Image | torch.Tensor) -> torch.Tensor:
        """The kornia ops on ``image`` (what the fast path reproduces)."""
        x = pil_to_tensor(to_rgb(image)) if isinstance(image, Image.Image) else image
        if x.ndim not in (3, 4) or x.shape[-3] != 3:
            raise ValueError(f"expected a (3, H, W) image or a (B, 3, H, W) batch, got {tuple(x.shape)}")
        with torch.no_grad():
            return self.ops(x) if x.ndim == 4 else self.ops(x.unsqueeze(0)).squeeze(0)

    def __repr__(self) -> str:
        return f"ImageTransform({self.preset!r}, output {self._made[1]}x{self._made[2]})"


def output_size(preset: str, image_size: ImageSize = None) -> tuple[int, int]:
    """``(H, W)`` of the images ``build_transform(preset, image_size)`` returns."""
    spec = _preset(preset)
    parsed = parse_image_size(image_size)
    height, width = (spec.crop, None) if parsed is None else parsed
    if width is None:
        width = height if spec.crop_width is None else round(height * spec.crop_width / spec.crop)
    return height, width


def _number(value: float) -> str:
    return format(float(value), ".8g")


def convention_preset(base: str, *, mean: Sequence[float] | None = None, std: Sequence[float] | None = None,
                      crop_pct: float | None = None) -> str:
    """The name of preset ``base`` with a model's own ``mean``/``std`` (of RGB in [0, 1]) and ``crop_pct`` (for
    a centre-cropping ``base``), ``base(mean=R,G,B;std=R,G,B;crop_pct=P)`` with only what differs from ``base``."""
    spec = _preset(base)
    parts = [f"{key}={','.join(_number(v) for v in values)}" for key, values in (("mean", mean), ("std", std))
             if values is not None and tuple(float(v) for v in values) != getattr(spec, key)]
    if crop_pct is not None and not spec.square and abs(crop_pct - spec.crop / spec.resize) > 1e-9:
        parts.append(f"crop_pct={_number(crop_pct)}")
    name = f"{base}({';'.join(parts)})" if parts else base
    _preset(name)  # a bad value fails here
    return name


def _preset(preset: str) -> Preset:
    base, convention, settings = preset.partition("(")
    try:
        spec = PRESETS[base]
    except KeyError:
        raise KeyError(f"unknown transform preset {preset!r}; known: {', '.join(PRESETS)}") from None
    if not convention:
        return spec
    changes: dict[str, object] = {}
    for item in settings.removesuffix(")").split(";"):
        key, _, value = item.partition("=")
        try:
            numbers = tuple(float(v) for v in value.split(","))
        except ValueError:
            numbers = ()
        if key in ("mean", "std") and len(numbers) == 3 and (key == "mean" or min(numbers) > 0):
            changes[key] = numbers
        elif key == "crop_pct" and len(numbers) == 1 and 0 < numbers[0] <= 1 and not spec.square:
            changes[key] = numbers[0]
        if not settings.endswith(")") or key not in changes:
            raise KeyError(f"transform preset {preset!r}: {item!r} is not one of mean=R,G,B, std=R,G,B (> 0) or "
                           "crop_pct=P (0 < P <= 1, for a centre-cropping preset), separated by ';'")
    return dataclasses.replace(spec, **changes)  # type: ignore[arg-type]


def build_transform(preset: str, image_size: ImageSize = None) -> ImageTransform:
    """The named preset (see the module table); ``image_size`` (S or HxW) overrides the output size."""
    spec = _preset(preset)
    crop, width = output_size(preset, image_size)
    resize = (math.floor(max(crop, width) / spec.crop_pct) if spec.crop_pct
              else round(spec.resize * max(crop, width) / spec.crop))
    return ImageTransform(preset, spec, crop, width, resize)


def _kornia_ops(spec: Preset, crop: int, width: int, resize: int) -> torch.nn.Sequential:
    """The preset's ops as kornia modules: a square resize (by area, or bilinear with anti-aliasing) and a random
    affine, or a shorter-side resize and a crop (random resized when training, else central); a horizontal flip
    when training; the normalisation."""
    import kornia.augmentation as K  # noqa: PLC0415 - 0.15-0.25 s to import: only where these ops run

    ops: list[torch.nn.Module] = []
    if spec.square:
        ops.append(AreaResize((crop, width)) if spec.area else K.Resize((crop, width), antialias=True))
        if spec.train and spec.affine:  # border fill: the page around the strokes is white
            ops.append(K.RandomAffine(degrees=10.0, translate=(0.08, 0.08), scale=(0.9, 1.1), padding_mode="border"))
    else:
        ops.append(K.Resize(resize, side="short", antialias=True))
        ops.append(
            K.RandomResizedCrop((crop, width), scale=spec.scale, ratio=spec.ratio) if spec.train
            else K.CenterCrop((crop, width))
        )
    if spec.train and spec.flip:
        ops.append(K.RandomHorizontalFlip())
    ops.append(K.Normalize(torch.tensor(spec.mean), torch.tensor(spec.std)))
    return torch.nn.Sequential(*ops)


def _fast_steps(spec: Preset, crop: int, width: int, resize: int) -> list[Step] | None:
    """:func:`_kornia_ops` as the steps of :mod:`rankopt.data.fast_transform` (kornia's defaults: bilinear,
    ``align_corners=True``, flip probability 1/2), or None for a random affine, which has none (tests: each preset
    against its kornia ops)."""
    if spec.train and spec.affine:
        return None
    steps: list[Step] = []
    if spec.square:
        steps.append(AreaResize((crop, width)) if spec.area else ResizeStep((crop, width), True, True))
    else:
        steps.append(ResizeStep(resize, True, True))
        steps.append(RandomResizedCropStep((crop, width), spec.scale, spec.ratio, True) if spec.train
                     else CenterCropStep((crop, width)))
    if spec.train and spec.flip:
        steps.append(FlipStep(0.5))
    mean, std = (torch.tensor(values, dtype=torch.float32).reshape(1, -1, 1, 1) for values in (spec.mean, spec.std))
    steps.append(NormalizeStep(mean, std))
    return steps
