"""Image bytes -> Pillow image: EXIF orientation applied, and JPEGs decoded straight at reduced size.

A JPEG stores 8 x 8 DCT blocks, and libjpeg can decode them at 1/2, 1/4 or 1/8 of the size by DCT
scaling (Pillow's ``Image.draft``), skipping most of the inverse DCT and colour conversion. With
``min_side`` :func:`decode_image` asks for the largest such reduction whose shorter side stays
``>= DRAFT_GAP * min_side`` (``min_side``: what the transform's first resize brings the shorter side
to, :func:`rankopt.data.fast_transform.decode_min_side`), so the resize still only reduces. Pillow
picks the scale ``s`` in {1, 2, 4, 8} with ``s <= min(W // m, H // m)`` (``m`` the requested side)
and decodes ``ceil(W / s) x ceil(H / s)``; orientation swaps the sides, not the shorter one.
Other formats ignore ``min_side``.
"""

from __future__ import annotations

import io
import math

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
