"""Uploaded image bytes -> the RGB image the transform takes: :func:`decode_upload`, at a cost bounded before decoding.

What it guarantees for every upload (each refusal an :class:`~rankopt.serve.errors.ApiError`):

- **Only accepted formats are opened.** The format is told by the first bytes (Pillow's own ``accept`` tests) and
  only that format's plugin runs (``Image.open(..., formats=[it])``), if it is in ``Limits.formats`` and in
  :data:`CHECKABLE_FORMATS`; another format (EPS, ICO, ...) is 415 and none of its code runs (no Ghostscript).
- **The decoded size is checked before a pixel is.** Only the first frame is decoded, at the size Pillow reports
  once the header is read: a JPEG's frame header (an MPO's first image), a PNG's IHDR (an APNG's frames lie inside
  it), a GIF's screen grown to its first frame, a BMP's header, a TIFF's first directory (other pages and sub-IFDs
  are never read). A WebP's canvas and a TIFF's first directory are read here before Pillow opens the file (libwebp
  allocates the canvas on opening; Pillow builds one tile per strip), and a TIFF whose tiles, blocks or tag arrays
  do not fit its size is refused. ``width x height`` above ``Limits.max_pixels`` is 413.
- **Memory and time grow with the pixels only.** Any mode is converted as :func:`rankopt.data.image_files.to_rgb` does
  (same pixels), a tile of :data:`TILE_PIXELS` at a time into the RGB output: beyond the decoded image it holds
  that output (4 bytes a pixel in Pillow) and one tile's intermediates, never a float64 copy of the image.
- **Heavy uploads decode one at a time, and small.** A decode of more than :data:`HEAVY_PIXELS` pixels holds
  :data:`HEAVY_LANE`, so heavy uploads wait for each other and for nothing else; smaller ones never wait for it.
  With ``min_side`` a JPEG is decoded reduced as ``rankopt search`` decodes it (the draft of
  :func:`rankopt.data.decode.decode_image`); a heavy image of another format is box-reduced by the largest integer
  factor keeping its shorter side ``>= DRAFT_GAP * min_side`` (the draft's rule; ``Image.reduce`` tile by tile),
  so it reaches the transform small. Only heavy images are reduced, so the others give ``rankopt search``'s pixels
  exactly; on photos the reduction changes the embedding less than the JPEG draft does (MobileNetV2, test transform
  at 224 px: the 9 Caltech-101 photos with a shorter side >= 1024 px, as PNG: cosine to the full decode >= 0.984,
  mean 0.994; as JPEG, drafted: >= 0.972, mean 0.993).
"""

from __future__ import annotations

import contextlib
import io
import math
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from PIL import Image, UnidentifiedImageError

from rankopt.data.decode import DRAFT_GAP
from rankopt.data.image_files import high_bit_top, to_rgb
from rankopt.serve.errors import ApiError
from rankopt.serve.limits import Limits

CHECKABLE_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
"""Formats (Pillow's names) whose decoded size this module knows before decoding; ``Limits.formats`` may name these."""
HEAVY_PIXELS = 8_000_000
"""Decodes of more pixels than this (after a JPEG's draft) hold :data:`HEAVY_LANE` and are reduced."""
HEAVY_LANE = threading.Lock()
"""Held by a heavy decode: they run one at a time (on the worker thread that asked), the others beside them."""
TILE_PIXELS = 1 << 20
"""About how many pixels are converted to RGB at a time."""
TIFF_MAX_BLOCKS = 1 << 16
"""Most strips or tiles (all planes) a TIFF may have."""
TIFF_MAX_VALUES = 3 << 16
"""Most values in a TIFF tag other than bytes, text and block offsets (a 16-bit colour map has this many)."""
TIFF_MAX_TAGS = 1024
"""Most entries in a TIFF's first directory."""

_TIFF_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4, 16: 8, 17: 8, 18: 8}
_TIFF_TEXT = (1, 2, 7)  # BYTE, ASCII, UNDEFINED: Pillow keeps their values as bytes or text
_TIFF_BLOCK_TAGS = (273, 279, 324, 325)  # strip offsets and byte counts, tile offsets and byte counts
_ORIENTATIONS = {2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180, 4: Image.Transpose.FLIP_TOP_BOTTOM,
                 5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_270, 7: Image.Transpose.TRANSVERSE,
                 8: Image.Transpose.ROTATE_90}  # EXIF orientation -> ImageOps.exif_transpose's method


def check_formats(formats: str | Iterable[str]) -> tuple[str, ...]:
    """``formats`` (Pillow's names in any case, or one comma-separated string) upper-cased, in order, without
    repeats; ValueError naming those not in :data:`CHECKABLE_FORMATS`, or when none is given."""
    if isinstance(formats, str):
        formats = formats.split(",")
    names = tuple(dict.fromkeys(name.strip().upper() for name in formats if name.strip()))
    unknown = [name for name in names if name not in CHECKABLE_FORMATS]
    if unknown:
        raise ValueError(f"image format(s) {', '.join(unknown)} cannot be accepted (their decoded size is not known "
                         f"before decoding, or Pillow has no such format); choose among {', '.join(CHECKABLE_FORMATS)}")
    if not names:
        raise ValueError("at least one image format must be accepted")
    return names


@dataclass(frozen=True)
class OpenedUpload:
    """An upload whose header passed every check (:func:`open_upload`), not decoded yet; ``heavy``: its decode
    (more than :data:`HEAVY_PIXELS` pixels) is to run while no other heavy one does."""

    image: Image.Image
    factor: int
    heavy: bool
    name: str

    def decode(self) -> Image.Image:
        """The RGB image (orientation applied, reduced by ``factor``); damaged data: 400."""
        try:
            self.image.load()
            method = _ORIENTATIONS.get(self.image.getexif().get(0x0112, 1))
            rgb = _to_rgb(self.image, self.factor)
            return rgb if method is None else rgb.transpose(method)
        except Exception as err:  # noqa: BLE001 - truncated or damaged data: OSError, SyntaxError, ValueError, ...
            raise ApiError(400, f"{self.name} cannot be decoded ({type(err).__name__}: {err})") from None


def open_upload(data: bytes, limits: Limits, min_side: int | None = None, name: str = "the upload") -> OpenedUpload:
    """``data``'s header read and checked, nothing decoded (``min_side``: the transform's ``decode_min_side``: a JPEG
    is then decoded reduced, a heavy image of another format box-reduced). Empty or unreadable: 400; a format not
    accepted: 415; too many pixels: 413 (see the module docstring)."""
    if not data:
        raise ApiError(400, f"{name} is empty")
    fmt = _format(data, limits, name)
    if fmt == "WEBP":
        _check_pixels(_webp_size(data, name), limits, name)
    elif fmt == "TIFF":
        _check_tiff(data, limits, name)
    try:
        img = Image.open(io.BytesIO(data), formats=[fmt])  # reads the header only
    except Image.DecompressionBombError as err:  # over twice Pillow's own MAX_IMAGE_PIXELS
        raise ApiError(413, f"{name} has too many pixels, over the limit of {limits.max_pixels} ({err})") from None
    except UnidentifiedImageError:
        raise ApiError(400, f"{name} is not a {fmt} image Pillow can read") from None
    except Exception as err:  # noqa: BLE001 - Pillow raises many types for damaged headers
        raise ApiError(400, f"{name} is not an image Pillow can read ({type(err).__name__}: {err})") from None
    _check_pixels(img.size, limits, name)
    side = None if min_side is None else math.ceil(DRAFT_GAP * min_side)
    if side is not None and fmt == "JPEG":
        img.draft(None, (side, side))  # as decode_image: img.size is now the reduced size it decodes
    heavy = img.width * img.height > HEAVY_PIXELS
    factor = max(1, min(img.size) // side) if heavy and side is not None and fmt != "JPEG" else 1
    return OpenedUpload(img, factor, heavy, name)


def decode_upload(data: bytes, limits: Limits, min_side: int | None = None, name: str = "the upload") -> Image.Image:
    """``data`` as an RGB image, decoded like an image file of ``rankopt search``: :func:`open_upload`, then
    :meth:`OpenedUpload.decode`, a heavy one holding :data:`HEAVY_LANE` (the service waits for its own lane
    without holding a thread)."""
    upload = open_upload(data, limits, min_side, name)
    with HEAVY_LANE if upload.heavy else contextlib.nullcontext():
        return upload.decode()


def _format(data: bytes, limits: Limits, name: str) -> str:
    """The accepted format whose plugin takes ``data``'s first bytes; else 415 naming the format found, or 400."""
    Image.init()
    head = data[:16]  # what Image.open shows the plugins
    accepted = [fmt for fmt in (f.upper() for f in limits.formats) if fmt in CHECKABLE_FORMATS]
    found = next((fmt for fmt in accepted if _accepts(fmt, head)), None)
    if found is not None:
        return found
    found = next((fmt for fmt in Image.ID if _accepts(fmt, head)), None)
    if found is None:
        raise ApiError(400, f"{name} is not an image Pillow can read (accepted formats: {', '.join(accepted)})")
    raise ApiError(415, f"{name} is in the {found} format, which is not accepted (accepted formats: "
                        f"{', '.join(accepted)})")


def _accepts(fmt: str, head: bytes) -> bool:
    accept = Image.OPEN[fmt][1] if fmt in Image.OPEN else None
    try:
        return bool(accept and accept(head))
    except (SyntaxError, IndexError, TypeError, struct.error):  # as Image.open: too short for this test
        return False


def _check_pixels(size: tuple[int, int], limits: Limits, name: str) -> None:
    width, height = size
    if width * height > limits.max_pixels:
        raise ApiError(413, f"{name} is {width} x {height} = {width * height} pixels, over the limit of "
                            f"{limits.max_pixels} (a decompression bomb?)")


def _to_rgb(img: Image.Image, factor: int) -> Image.Image:
    """``to_rgb(img).reduce(factor)``, converted and reduced a tile (its sides multiples of ``factor``) at a time."""
    if img.mode == "RGB" and factor == 1:
        return img
    width, height = img.size
    top = high_bit_top(img)  # to_rgb's 8-bit scale, of the whole image (float64 on one tile at a time)
    step = max(1, math.isqrt(TILE_PIXELS) // factor) * factor
    out = Image.new("RGB", (-(-width // factor), -(-height // factor)))
    for y in range(0, height, step):
        for x in range(0, width, step):
            tile = to_rgb(img.crop((x, y, min(x + step, width), min(y + step, height))), top)
            out.paste(tile.reduce(factor) if factor > 1 else tile, (x // factor, y // factor))
    return out


def _webp_size(data: bytes, name: str) -> tuple[int, int]:
    """A WebP's canvas, from its first chunk (a VP8X header, or the frame header of a still image)."""
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a" and len(data) >= 30:
        return int.from_bytes(data[26:28], "little") & 0x3FFF, int.from_bytes(data[28:30], "little") & 0x3FFF
    if chunk == b"VP8L" and data[20:21] == b"\x2f" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    raise ApiError(400, f"{name} is a WebP file whose canvas size cannot be read")


def _check_tiff(data: bytes, limits: Limits, name: str) -> None:
    """The first directory of a TIFF: its size within the limit, tiles no larger than the image (or a megapixel),
    at most :data:`TIFF_MAX_BLOCKS` strips or tiles, no tag holding more values than those need or
    :data:`TIFF_MAX_VALUES` (Pillow reads them all on opening)."""
    tags = _tiff_directory(data)
    if tags is None:
        raise ApiError(400, f"{name} is a TIFF file whose first directory cannot be read")

    def scalar(tag: int, default: int = 0) -> int:
        kind, count, value = tags.get(tag, (4, 1, default))
        return value if count == 1 and kind in (3, 4, 16) else 0

    width, height = scalar(256), scalar(257)
    if not width or not height:
        raise ApiError(400, f"{name} is a TIFF file without a readable width and height")
    _check_pixels((width, height), limits, name)
    planes = scalar(277, 1) if scalar(284, 1) == 2 else 1
    if 322 in tags or 323 in tags:
        tile_width, tile_height = scalar(322), scalar(323)
        if not tile_width or not tile_height or tile_width * tile_height > max((width + 15) * (height + 15), 1 << 20):
            raise ApiError(400, f"{name} has TIFF tiles of {tile_width} x {tile_height} for a {width} x {height} image")
        blocks = -(-width // tile_width) * -(-height // tile_height) * planes
    else:
        rows = min(scalar(278, height), height) or height
        blocks = -(-height // rows) * planes
    if blocks > TIFF_MAX_BLOCKS:
        raise ApiError(400, f"{name} is a TIFF of {blocks} strips or tiles, over {TIFF_MAX_BLOCKS}")
    for tag, (kind, count, _) in tags.items():
        most = blocks if tag in _TIFF_BLOCK_TAGS else TIFF_MAX_VALUES
        if kind not in _TIFF_TEXT and count > most:
            raise ApiError(400, f"{name} is a TIFF whose tag {tag} holds {count} values, over {most}")


def _tiff_directory(data: bytes) -> dict[int, tuple[int, int, int]] | None:
    """``{tag: (type, count, value)}`` of the first directory of a TIFF or BigTIFF (``value``: the entry's value
    field read as one value of its type); None where malformed or of over :data:`TIFF_MAX_TAGS` entries."""
    order = {b"II": "little", b"MM": "big"}.get(data[:2])
    if order is None or len(data) < 16:
        return None

    def number(at: int, size: int) -> int:
        return int.from_bytes(data[at : at + size], order)

    magic = number(2, 2)
    if magic not in (42, 43):
        return None
    field, count_size = (8, 8) if magic == 43 else (4, 2)  # BigTIFF: 8-byte counts and offsets
    start = number(8, 8) if magic == 43 else number(4, 4)
    entries = number(start, count_size)
    first, step = start + count_size, 4 + 2 * field
    if entries > TIFF_MAX_TAGS or first + entries * step > len(data):
        return None
    tags = {}
    for at in range(first, first + entries * step, step):
        kind = number(at + 2, 2)
        value = number(at + 4 + field, min(_TIFF_SIZES.get(kind, 1), field))  # a lone value is left-justified
        tags[number(at, 2)] = (kind, number(at + 4, field), value)
    return tags
