"""Image files as the datasets read them: plain files or members of ``.zip`` archives (``archive.zip/member``),
decoded to RGB (:func:`load_image`) and turned into tensors (:func:`pil_to_tensor`)."""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from rankopt.data.decode import decode_image

_ZIP_MARK = ".zip" + os.sep


def _split_zip_path(path: str) -> tuple[str, str] | None:
    """``/a/b.zip/x/y.png`` -> (``/a/b.zip``, ``x/y.png``); None for plain files."""
    cut = path.find(_ZIP_MARK)
    if cut < 0:
        return None
    return path[: cut + 4], path[cut + 5 :].replace(os.sep, "/")


_ZIP_HANDLES: dict[tuple[int, str], zipfile.ZipFile] = {}


def _zip_handle(archive: str) -> zipfile.ZipFile:
    """One open ZipFile per (process, archive): safe with forked DataLoader workers."""
    key = (os.getpid(), archive)
    handle = _ZIP_HANDLES.get(key)
    if handle is None:
        handle = _ZIP_HANDLES[key] = zipfile.ZipFile(archive)
    return handle


def image_exists(path: str) -> bool:
    """True if ``path`` (a file, or a member inside a ``.zip`` as ``archive.zip/member``) exists."""
    parts = _split_zip_path(path)
    if parts is None:
        return os.path.isfile(path)
    archive, member = parts
    if not os.path.isfile(archive):
        return False
    try:
        _zip_handle(archive).getinfo(member)
    except KeyError:
        return False
    return True


def read_bytes(path: str) -> bytes:
    """The bytes of the image file ``path`` (or ``archive.zip/member``)."""
    parts = _split_zip_path(path)
    if parts is None:
        with open(path, "rb") as fh:
            return fh.read()
    archive, member = parts
    return _zip_handle(archive).read(member)


CHECK_SIDE = 64
"""A JPEG is decoded for the check at the 1/2 .. 1/8 scale keeping its shorter side >= this: every compressed byte
is still read (a truncated or corrupt file fails), most of the inverse DCT is skipped."""


def decode_problem(path: str) -> str | None:
    """Why the image file ``path`` cannot be used, in words, or ``None``: missing or unreadable, empty, not an image
    Pillow reads, or its data broken (decoded whole, :data:`CHECK_SIDE`: a truncated file is caught, which
    Pillow's header check, ``Image.verify``, lets through)."""
    try:
        data = read_bytes(path)
    except (OSError, KeyError) as err:
        return f"cannot be read ({getattr(err, 'strerror', None) or err})"
    if not data:
        return "empty file (0 bytes)"
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.draft(None, (CHECK_SIDE, CHECK_SIDE))
            img.load()
            _HASHES[_hash_key(path)] = difference_hash(img)
    except UnidentifiedImageError:
        return "not an image file Pillow can read"
    except Exception as err:  # noqa: BLE001 - any decoder failure means a broken file
        return f"broken image data ({err})"
    return None


HASH_SIDE = 16
"""A difference hash compares :data:`HASH_SIDE` × :data:`HASH_SIDE` neighbouring pixel pairs: 256 bits (8 × 8, the
usual 64 bits, put three quarters of Extended Yale B's faces within 6 bits of another lighting of the same person:
``benchmarks/results/near_duplicates_64.md``)."""


def difference_hash(img: Image.Image) -> bytes:
    """The difference hash of ``img`` (Krawetz's dHash, :data:`HASH_SIDE`² bits): grey, EXIF orientation applied,
    resized to ``(side + 1) × side``; bit ``side·r + c`` set where pixel ``(r, c)`` is brighter than ``(r, c + 1)``.
    Copies, re-encodings and resized versions of a photo differ in a few bits, unrelated photos in about half."""
    side = HASH_SIDE
    grey = to_rgb(ImageOps.exif_transpose(img), high_bit_top(img)).convert("L").resize((side + 1, side),
                                                                                        Image.BILINEAR)
    pixels = np.asarray(grey, dtype=np.int16)
    return np.packbits((pixels[:, :-1] > pixels[:, 1:]).ravel()).tobytes()


def hash_distance(a: bytes, b: bytes) -> int:
    """Bits that differ between two :func:`difference_hash` values."""
    return (int.from_bytes(a, "big") ^ int.from_bytes(b, "big")).bit_count()


_HASHES: dict[tuple, bytes] = {}
"""Each image's :func:`difference_hash`, remembered by :func:`decode_problem` (keyed by path, size and time of last
change), so that :func:`image_hash` needs no second decode of a checked folder."""


def _hash_key(path: str) -> tuple:
    try:
        stat = os.stat(path)
    except OSError:  # a zip member: its archive's entry
        return (path,)
    return path, stat.st_size, stat.st_mtime_ns


def image_hash(path: str) -> bytes | None:
    """The :func:`difference_hash` of the image file ``path`` (remembered from its decode check, else decoded at
    :data:`CHECK_SIDE`); ``None`` when it cannot be decoded."""
    key = _hash_key(path)
    if key not in _HASHES and decode_problem(path) is not None:
        return None
    return _HASHES.get(key)


def undecodable(paths: Sequence[str], threads: int | None = None) -> dict[int, str]:
    """``{position: problem}`` of the ``paths`` whose :func:`decode_problem` is not ``None``, decoded on
    ``threads`` threads (default: one per core; Pillow's decoders release the GIL)."""
    if not paths:
        return {}
    with ThreadPoolExecutor(max(1, threads or os.cpu_count() or 1)) as pool:
        problems = list(pool.map(decode_problem, paths, chunksize=64))
    return {i: problem for i, problem in enumerate(problems) if problem is not None}


def high_bit_top(img: Image.Image) -> float | None:
    """The value :func:`to_rgb` maps to 255 in a 16/32-bit or float grey image (65535 for 16-bit, else its
    maximum, at least 1); None for other modes."""
    if not (img.mode.startswith("I") or img.mode == "F"):
        return None
    return 65535.0 if img.mode.startswith("I;16") else max(float(img.getextrema()[1]), 1.0)


def to_rgb(img: Image.Image, top: float | None = None) -> Image.Image:
    """Any Pillow mode -> RGB: 1-bit/L/P/CMYK/YCbCr via ``convert``, alpha composited on white,
    16/32-bit and float grayscale rescaled to 8 bits (``top`` -> 255; default :func:`high_bit_top`, so a tile
    of a larger image takes the whole image's)."""
    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA", "PA", "RGBa", "La") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    if img.mode.startswith("I") or img.mode == "F":
        top = high_bit_top(img) if top is None else top
        arr = np.clip(np.asarray(img, dtype=np.float64) / top * 255.0, 0, 255).astype(np.uint8)
        return Image.fromarray(arr, mode="L").convert("RGB")
    return img.convert("RGB")


def load_image(path: str, min_side: int | None = None) -> Image.Image:
    """Decode an image with Pillow, apply its EXIF orientation and convert it to RGB; ``min_side``: a JPEG
    may be decoded at 1/2, 1/4 or 1/8 size keeping enough pixels for a resize of its shorter side to
    ``min_side`` (:func:`rankopt.data.decode.decode_image`); None, the reference: full size."""
    return to_rgb(decode_image(read_bytes(path), min_side))


def pil_to_tensor(img: Image.Image) -> torch.Tensor:
    """RGB PIL image -> FloatTensor (3, H, W) in [0, 1] (numpy, so no intra-op thread pool is woken)."""
    arr = np.asarray(img, dtype=np.float32) * np.float32(1 / 255)
    return torch.from_numpy(np.ascontiguousarray(arr.transpose(2, 0, 1)))
