"""The per-image path of :class:`~rankopt.data.transforms.ImageTransform`: its kornia ops as plain torch.

A kornia augmentation module has a fixed cost per call whatever the image size (parameter generation,
checks, transformation matrices; timings in ``benchmarks/results/loader.md``), so a dataset
transforming image by image spent most of its time there. A preset's steps here
(:func:`rankopt.data.transforms.build_transform` makes them from the preset, :func:`fast_path` joins them) are
the same computation on one ``(1, 3, H, W)`` image without that cost; kornia itself (0.15-0.25 s to import) is
imported only where its ops run (:meth:`~rankopt.data.transforms.ImageTransform.reference`, a random affine):

- ``Resize`` (kornia, bilinear): with ``antialias`` and a downscale, a Gaussian blur first with
  ``sigma_i = max((f_i - 1) / 2, 0.001)`` on each axis (``f_i`` = input / output size), kernel size
  ``max(4 sigma_i, 3)`` made odd, reflected border; then ``F.interpolate`` with kornia's
  ``align_corners``. A shorter-side size gives the other side ``int(size * aspect)``. Kornia's
  formulas, so the test presets give the same tensors as the kornia pipeline (tests: max |difference|
  below 1e-5).
- ``CenterCrop``: the window starting at ``((H - h) // 2, (W - w) // 2)``.
- ``RandomResizedCrop``: 10 candidates of area ``U(scale) H W`` and aspect ``exp(U(log ratio))``
  (sides rounded), the first that fits, else the whole image narrowed to the ratio range; start
  ``floor(U(0, 1) (H - h + 1))``; the crop resized bilinearly (kornia's sampling, same distribution;
  the draws come from torch's global RNG as kornia's do).
- ``RandomHorizontalFlip`` with probability ``p``; ``Normalize``: ``(x - mean) / std``; rankopt's own
  modules (``AreaResize``) are called as they are.

A preset with any other op (``RandomAffine``) has no fast path: the kornia pipeline runs. Steps in the order
``[Resize] [CenterCrop | RandomResizedCrop] [Flip] [Normalize]`` (every preset but the area-resized ones) also get
a :class:`FusedPath`: one compiled pass from the uint8 pixels to the model input computing only the output window
(:mod:`rankopt.data._resample_kernels`), cheaper than the steps, which stay its reference
(:meth:`FastPath.stepwise`, tests: 1e-5).

The stepwise ops and :func:`collate` (the DataLoaders' batching) run on one intra-op thread
(:func:`one_thread`; the fused path runs no torch op but the draws and leaves the thread count alone):
in the main process (``num_workers=0``) torch has several, and on ops this small each waits for all of
them (``benchmarks/results/loader.md``).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import default_collate

from rankopt.data.image_files import to_rgb

Step = Callable[[torch.Tensor], torch.Tensor]  # (1, 3, H, W) -> (1, 3, h, w)
_CANDIDATES = 10  # crop candidates drawn by RandomResizedCrop


class AreaResize(torch.nn.Module):
    """Resize ``(B, C, H, W)`` to ``size`` by area averaging (``F.interpolate(mode="area")``)."""

    def __init__(self, size: tuple[int, int]) -> None:
        super().__init__()
        self.size = size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.interpolate(x, self.size, mode="area")


def short_side_size(height: int, width: int, size: int) -> tuple[int, int]:
    """``(h, w)`` of an image resized to shorter side ``size``, the other side truncated (kornia's rule)."""
    aspect = width / height
    return (size, int(size * aspect)) if aspect >= 1.0 else (int(size / aspect), size)


def _gaussian_kernel(size: int, sigma: float) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float32) - size // 2
    weights = torch.exp(-x.pow(2) / (2 * torch.tensor(sigma, dtype=torch.float32).pow(2)))
    return weights / weights.sum()


def _blur_axis(x: torch.Tensor, size: int, sigma: float, axis: int) -> torch.Tensor:
    """Gaussian blur of ``x`` along ``axis`` (-2 rows, -1 columns), reflected border (row ``-s`` is row
    ``s``): a weighted sum of shifted views, in ``x``'s memory layout (for kernels this small, cheaper than a
    depthwise convolution)."""
    if size == 1:
        return x
    weights = _gaussian_kernel(size, sigma).tolist()
    half, length = size // 2, x.shape[axis]
    if weights[half] == 1.0:  # sigma 0.001 (an axis not downscaled): the identity
        return x
    out = x * weights[half]
    for shift in range(1, half + 1):
        weight, rest = weights[half - shift], length - shift
        out.narrow(axis, shift, rest).add_(x.narrow(axis, 0, rest), alpha=weight)
        out.narrow(axis, 0, rest).add_(x.narrow(axis, shift, rest), alpha=weight)
        out.narrow(axis, 0, shift).add_(x.narrow(axis, 1, shift).flip(axis), alpha=weight)
        out.narrow(axis, rest, shift).add_(x.narrow(axis, rest - 1, shift).flip(axis), alpha=weight)
    return out


def blurs(height: int, width: int, size: tuple[int, int], antialias: bool) -> bool:
    """Whether the resize of ``(height, width)`` to ``size`` blurs first: anti-aliased and a downscale."""
    return antialias and max(height / size[0], width / size[1]) > 1


def blur_parameters(length: int, target: int) -> tuple[int, float]:
    """Gaussian ``(kernel size, sigma)`` of one axis resized ``length -> target``: ``sigma = max((length / target
    - 1) / 2, 0.001)``, size ``max(4 sigma, 3)`` made odd (1 for a single pixel)."""
    sigma = max((length / target - 1.0) / 2.0, 0.001)
    kernel = int(max(4.0 * sigma, 3))
    return 1 if length == 1 else kernel + 1 - kernel % 2, sigma


def antialiased_resize(x: torch.Tensor, size: tuple[int, int], *, antialias: bool = True,
                       align_corners: bool | None = True) -> torch.Tensor:
    """``(B, C, H, W)`` -> ``(B, C, h, w)``: Gaussian anti-aliasing blur when downscaling, then bilinear
    interpolation (the formula of ``kornia.geometry.transform.resize``, see the module docstring).

    Rows are blurred and resampled first, then columns: the same linear map as kornia's (blur both
    axes, then resample both: operations on different axes commute), the column pass on fewer rows.
    """
    height, width = x.shape[-2:]
    if not blurs(height, width, size, antialias):
        return F.interpolate(x, size=size, mode="bilinear", align_corners=align_corners)
    for axis, target in ((-2, size[0]), (-1, size[1])):
        x = _blur_axis(x, *blur_parameters(x.shape[axis], target), axis)
        shape = (target, x.shape[-1]) if axis == -2 else (x.shape[-2], target)
        x = F.interpolate(x, size=shape, mode="bilinear", align_corners=align_corners)
    return x


@dataclass(frozen=True)
class ResizeStep:
    size: int | tuple[int, int]  # shorter side, or (h, w)
    antialias: bool
    align_corners: bool | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        size = self.size if isinstance(self.size, tuple) else short_side_size(x.shape[-2], x.shape[-1], self.size)
        return antialiased_resize(x, size, antialias=self.antialias, align_corners=self.align_corners)


@functools.lru_cache(maxsize=8)
def _kornia_center_crop(size: tuple[int, int]) -> torch.nn.Module:
    import kornia.augmentation as K  # noqa: PLC0415 - slow import, for images smaller than the window only

    return K.CenterCrop(size)


@dataclass(frozen=True)
class CenterCropStep:
    """The centre ``size`` window; an image smaller than it goes through kornia's ``CenterCrop`` (its padding)."""

    size: tuple[int, int]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        (height, width), (h, w) = x.shape[-2:], self.size
        if h > height or w > width:
            return _kornia_center_crop(self.size)(x)
        top, left = (height - h) // 2, (width - w) // 2
        return x[..., top : top + h, left : left + w]


@dataclass(frozen=True)
class RandomResizedCropStep:
    size: tuple[int, int]
    scale: tuple[float, float]
    ratio: tuple[float, float]
    align_corners: bool | None

    def crop_size(self, height: int, width: int) -> tuple[int, int]:
        """A crop's ``(h, w)``: the first of 10 drawn candidates that fits, else the image narrowed to the ratios.

        The float32 products and sums of torch's ops on its draws run by numpy (the same IEEE operations, a
        fraction of the per-op cost), ``exp`` and ``sqrt`` by torch (its own roundings): the crops of the
        torch expression, draw for draw."""
        low, high = math.log(self.ratio[0]), math.log(self.ratio[1])
        area = (torch.rand(_CANDIDATES).numpy() * (self.scale[1] - self.scale[0]) + self.scale[0]) * height * width
        aspect = torch.from_numpy(torch.rand(_CANDIDATES).numpy() * (high - low) + low).exp_().numpy()
        sides = torch.from_numpy(np.stack([area * aspect, area / aspect])).sqrt_().numpy().round()
        for w, h in zip(*sides.tolist()):
            if 0 < w <= width and 0 < h <= height:
                return int(h), int(w)
        image_ratio = width / height
        if image_ratio < min(self.ratio):
            return min(round(width / min(self.ratio)), height), width
        if image_ratio > max(self.ratio):
            return height, min(round(height * max(self.ratio)), width)
        return height, width

    def window(self, height: int, width: int) -> tuple[int, int, int, int]:
        """A drawn crop ``(top, left, h, w)``: :meth:`crop_size`, then ``left``, then ``top``."""
        h, w = self.crop_size(height, width)
        left = int(torch.rand(()).numpy() * np.float32(width - w + 1))  # float32 products, as torch's
        top = int(torch.rand(()).numpy() * np.float32(height - h + 1))
        return top, left, h, w

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        top, left, h, w = self.window(*x.shape[-2:])
        crop = x[..., top : top + h, left : left + w]
        if (h, w) == self.size:
            return crop
        return F.interpolate(crop, size=self.size, mode="bilinear", align_corners=self.align_corners)


@dataclass(frozen=True)
class FlipStep:
    p: float

    def draw(self) -> bool:
        return float(torch.rand(())) < self.p

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x.flip(-1) if self.draw() else x


@dataclass(frozen=True)
class NormalizeStep:
    mean: torch.Tensor  # (1, C, 1, 1)
    std: torch.Tensor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def _channels_last_tensor(image: Image.Image) -> torch.Tensor:
    """RGB PIL image -> ``(1, 3, H, W)`` float in [0, 1] with channels-last strides: the values of
    :func:`~rankopt.data.image_files.pil_to_tensor` without its transposing copy (bilinear interpolation
    runs faster on channels-last images)."""
    pixels = np.asarray(image, dtype=np.float32)  # a new array: scaled in place
    pixels *= np.float32(1 / 255)
    return torch.from_numpy(pixels).permute(2, 0, 1).unsqueeze(0)


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread inside: the ops on one image are too small to share, and with
    several threads each op waits for them all, slow when the cores are busy (measured:
    benchmarks/results/loader.md)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def collate(samples: list[Any]) -> Any:
    """``default_collate`` on one intra-op thread (:func:`one_thread`): stacking a batch is a copy too
    small to share, and a DataLoader without workers stacks in the main process, where torch has
    several threads."""
    with one_thread():
        return default_collate(samples)


@dataclass(frozen=True, eq=False)
class FusedPath:
    """``[Resize] [CenterCrop | RandomResizedCrop] [Flip] [Normalize]`` in one compiled pass from the uint8
    pixels (:mod:`rankopt.data._resample_kernels`): the steps' values (within float32 rounding) and their
    draws from torch's RNG in the same order; no change of torch's thread count, so several threads may
    call it at once."""

    resize: ResizeStep | None
    window: CenterCropStep | RandomResizedCropStep | None
    flip: FlipStep | None
    scale: np.ndarray  # (3,) float32: 1 / (255 std)
    bias: np.ndarray  # (3,) float32: -mean / std

    @property
    def draws(self) -> bool:
        """Whether a call draws from torch's RNG (a random crop or flip); one that draws nothing runs no torch
        operation at all (the pixels go through the compiled kernel, the result is wrapped by ``torch.from_numpy``)."""
        return self.flip is not None or isinstance(self.window, RandomResizedCropStep)

    def __call__(self, image: Image.Image | np.ndarray) -> torch.Tensor | None:
        """RGB image, or its ``(H, W, 3)`` uint8 pixels, -> ``(3, h, w)``; None when a center crop exceeds the
        resized image (the steps' fallback)."""
        from rankopt.data import _resample_kernels as kernels  # noqa: PLC0415 - numba: slow import

        height, width = image.shape[:2] if isinstance(image, np.ndarray) else (image.height, image.width)
        resized, align, blur = (height, width), True, ((1, 0.0), (1, 0.0))
        if self.resize is not None:
            size = self.resize.size
            resized = size if isinstance(size, tuple) else short_side_size(height, width, size)
            align = bool(self.resize.align_corners)
            if blurs(height, width, resized, self.resize.antialias):
                blur = (blur_parameters(height, resized[0]), blur_parameters(width, resized[1]))
        top, left, (h, w), target, align_window = 0, 0, resized, resized, True
        if isinstance(self.window, CenterCropStep):
            h, w = target = self.window.size
            if h > resized[0] or w > resized[1]:
                return None
            top, left = (resized[0] - h) // 2, (resized[1] - w) // 2
        elif self.window is not None:
            top, left, h, w = self.window.window(*resized)
            target, align_window = self.window.size, bool(self.window.align_corners)
        flip = self.flip is not None and self.flip.draw()
        rows = kernels.axis_taps(height, resized[0], *blur[0], align, top, h, target[0], align_window, False)
        cols = kernels.axis_taps(width, resized[1], *blur[1], align, left, w, target[1], align_window, flip)
        pixels = np.ascontiguousarray(image).reshape(height, width * 3)
        return torch.from_numpy(kernels.render(pixels, *rows, *cols, self.scale, self.bias))


def fuse(steps: Sequence[Step]) -> FusedPath | None:
    """The :class:`FusedPath` of ``steps`` when they follow its sequence, else None."""
    rest = list(steps)

    def take(kind: type | tuple[type, ...]) -> Any:
        return rest.pop(0) if rest and isinstance(rest[0], kind) else None

    resize, window = take(ResizeStep), take((CenterCropStep, RandomResizedCropStep))
    flip, normalize = take(FlipStep), take(NormalizeStep)
    if rest:
        return None
    if normalize is None:
        mean, std = np.zeros(3), np.ones(3)
    elif {normalize.mean.numel(), normalize.std.numel()} <= {1, 3}:  # per channel or one for all
        mean, std = (np.broadcast_to(t.double().flatten().numpy(), 3) for t in (normalize.mean, normalize.std))
    else:
        return None
    return FusedPath(resize, window, flip, (1 / (255 * std)).astype(np.float32), (-mean / std).astype(np.float32))


@dataclass(frozen=True)
class FastPath:
    """PIL image (any mode) -> the transform's ``(3, h, w)`` FloatTensor: ``fused`` when the steps have it,
    else op by op in plain torch on one thread (:meth:`stepwise`, the fused kernel's reference)."""

    steps: tuple[Step, ...]
    fused: FusedPath | None = None

    def __call__(self, image: Image.Image | np.ndarray) -> torch.Tensor:
        """A PIL image, or ``(H, W, 3)`` uint8 RGB pixels (:func:`~rankopt.data.decode.decode_jpeg_pixels`)."""
        rgb = image if isinstance(image, np.ndarray) else to_rgb(image)
        out = self.fused(rgb) if self.fused is not None else None
        if out is not None:
            return out
        return self.stepwise(Image.fromarray(rgb) if isinstance(rgb, np.ndarray) else rgb)

    @torch.no_grad()
    def stepwise(self, image: Image.Image) -> torch.Tensor:
        with one_thread():
            x = _channels_last_tensor(to_rgb(image))
            for step in self.steps:
                x = step(x)
            return x[0].contiguous()


def fast_path(steps: Sequence[Step]) -> FastPath:
    """The per-image path of ``steps``: fused when they follow its sequence (:func:`fuse`)."""
    return FastPath(tuple(steps), fuse(steps))
