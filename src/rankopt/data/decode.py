"""Image bytes -> Pillow image: EXIF orientation applied, and JPEGs decoded straight at reduced size.

A JPEG stores 8 x 8 DCT blocks, and libjpeg can decode them at 1/2, 1/4 or 1/8 of the size by DCT
scaling (Pillow's ``Image.draft``), skipping most of the inverse DCT and colour conversion. With
``min_side`` :func:`decode_image` asks for the largest such reduction whose shorter side stays
``>= DRAFT_GAP * min_side`` (``min_side``: what the transform's first resize brings the shorter side
to, :func:`rankopt.data.fast_transform.decode_min_side`), so the resize still only reduces. Pillow
picks the scale ``s`` in {1, 2, 4, 8} with ``s <= min(W // m, H // m)`` (``m`` the requested side)
and decodes ``ceil(W / s) x ceil(H / s)``; orientation swaps the sides, not the shorter one.
Other formats ignore ``min_side``.

:func:`decode_jpeg_pixels` decodes the common JPEGs (YCbCr or grayscale) with libjpeg-turbo through
simplejpeg straight into a numpy array, with the scale and libjpeg settings Pillow uses (accurate DCT,
fancy upsampling), so the pixels are those of :func:`decode_image` (tests), at a lower cost and without the
copy out of a Pillow image (measured: benchmarks/results/pretrained_loading.md, table (d)); everything else
returns None and takes :func:`decode_image`.
"""

from __future__ import annotations

import io
import math

import numpy as np
from PIL import Image, ImageOps

DRAFT_GAP = 2.0
"""The reduced decode keeps at least ``DRAFT_GAP`` times the resize target on its shorter side, so the
anti-aliasing resize still averages over >= 2 x 2 decoded pixels per output pixel, as it does on the
full decode (measured: see benchmarks/results/pretrained_loading.md)."""


def decode_image(data: bytes, min_side: int | None = None) -> Image.Image:
    """Decode ``data`` (any format Pillow reads) and apply its EXIF orientation, in the file's own mode.

    ``min_side``: a JPEG is decoded at the smallest 1/2, 1/4, 1/8 scale keeping its shorter side
    ``>= ceil(DRAFT_GAP * min_side)``; None: full size.
    """
    with Image.open(io.BytesIO(data)) as img:
        if min_side is not None:
            side = math.ceil(DRAFT_GAP * min_side)
            img.draft(None, (side, side))
        img.load()
        return ImageOps.exif_transpose(img)


def draft_scale(width: int, height: int, min_side: int | None) -> int:
    """The JPEG reduction ``s`` in {1, 2, 4, 8} :func:`decode_image` asks Pillow for: the largest with
    ``s <= min(W // m, H // m)``, ``m = ceil(DRAFT_GAP * min_side)`` (1 without ``min_side``)."""
    if min_side is None:
        return 1
    side = math.ceil(DRAFT_GAP * min_side)
    fits = min(width // side, height // side)
    return next((scale for scale in (8, 4, 2) if fits >= scale), 1)


def decode_jpeg_pixels(data: bytes, min_side: int | None = None) -> np.ndarray | None:
    """``to_rgb(decode_image(data, min_side))`` as a ``(H, W, 3)`` uint8 array, for a JPEG in YCbCr or grayscale:
    libjpeg-turbo (simplejpeg) decodes into the array at :func:`draft_scale`, accurate DCT and fancy upsampling
    as Pillow's decode, and the EXIF orientation (:func:`exif_orientation`) is applied as
    ``ImageOps.exif_transpose`` does. None where :func:`decode_image` must decide (its errors name the
    problem): not a JPEG, another colour space, an orientation this cannot read, over Pillow's
    ``MAX_IMAGE_PIXELS``, any complaint of the decoder, or simplejpeg not installed."""
    if not data.startswith(b"\xff\xd8"):
        return None
    try:
        import simplejpeg  # noqa: PLC0415 - optional: without it every image takes decode_image

        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except (ImportError, ValueError):
        return None
    limit = Image.MAX_IMAGE_PIXELS
    if colorspace not in ("YCbCr", "Gray") or (limit is not None and width * height > limit):
        return None
    orientation = exif_orientation(data)
    if orientation is None:
        return None
    scale = draft_scale(width, height, min_side)
    shape = (-(-height // scale), -(-width // scale), 3)
    try:
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", min_factor=scale, min_height=shape[0],
                                        min_width=shape[1])
    except (ValueError, RuntimeError, OSError):  # truncated or damaged data
        return None
    if pixels.shape != shape:
        return None
    return pixels if orientation == 1 else np.ascontiguousarray(_ORIENTED.get(orientation, lambda x: x)(pixels))


_ORIENTED = {  # EXIF orientation -> the array op of ImageOps.exif_transpose's Image.Transpose method
    2: lambda x: x[:, ::-1],  # FLIP_LEFT_RIGHT
    3: lambda x: x[::-1, ::-1],  # ROTATE_180
    4: lambda x: x[::-1],  # FLIP_TOP_BOTTOM
    5: lambda x: x.transpose(1, 0, 2),  # TRANSPOSE
    6: lambda x: x.transpose(1, 0, 2)[:, ::-1],  # ROTATE_270 (clockwise)
    7: lambda x: x[::-1, ::-1].transpose(1, 0, 2),  # TRANSVERSE
    8: lambda x: x.transpose(1, 0, 2)[::-1],  # ROTATE_90 (counter-clockwise)
}


def exif_orientation(data: bytes) -> int | None:
    """The EXIF orientation Pillow finds in JPEG ``data``: tag 0x0112 (one SHORT) of IFD0 in the ``Exif`` APP1
    segment before the scan, 1 without one. None where this cannot tell: a second Exif segment, another APP1
    segment (XMP, from which Pillow may read an orientation too), bytes between segments, a malformed segment
    or TIFF header, another type or count."""
    pos, end, orientation = 2, len(data), 1
    found = False
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0xDA:  # start of scan: no metadata segment after it counts
            return orientation
        if 0xD0 <= marker <= 0xD9 or marker == 0x01:  # markers without a length have no place here
            return None
        length = int.from_bytes(data[pos + 2 : pos + 4], "big")
        if length < 2 or pos + 2 + length > end:
            return None
        if marker == 0xE1:
            segment = data[pos + 4 : pos + 2 + length]
            if not segment.startswith(b"Exif\x00\x00") or found:  # Pillow joins a second Exif segment to the first
                return None
            found, orientation = True, _tiff_orientation(segment[6:])
            if orientation is None:
                return None
        pos += 2 + length
    return None  # no scan: a damaged file


def _tiff_orientation(tiff: bytes) -> int | None:
    """Tag 0x0112 of the first IFD of a TIFF structure (1 when absent; None when malformed or not one SHORT)."""
    order = {b"II": "little", b"MM": "big"}.get(tiff[:2])
    if order is None or len(tiff) < 8 or int.from_bytes(tiff[2:4], order) != 42:
        return None
    ifd = int.from_bytes(tiff[4:8], order)
    if ifd + 2 > len(tiff):
        return None
    entries = int.from_bytes(tiff[ifd : ifd + 2], order)
    if ifd + 2 + 12 * entries > len(tiff):
        return None
    for first in range(ifd + 2, ifd + 2 + 12 * entries, 12):
        if int.from_bytes(tiff[first : first + 2], order) == 0x0112:
            kind, count = (int.from_bytes(tiff[first + 2 : first + 4], order),
                           int.from_bytes(tiff[first + 4 : first + 8], order))
            return int.from_bytes(tiff[first + 8 : first + 10], order) if (kind, count) == (3, 1) else None
    return 1
