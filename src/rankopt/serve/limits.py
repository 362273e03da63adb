"""The service's input limits (:class:`Limits`): sizes, pixels, results, formats, JSON shape. The requests are
checked within them by :mod:`rankopt.serve.requests` and uploaded images by :mod:`rankopt.serve.images`."""

from __future__ import annotations

from dataclasses import dataclass


DEFAULT_FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
"""Image formats (Pillow's names) an upload may be in by default; nothing else is even opened."""


@dataclass(frozen=True)
class Limits:
    """``max_upload_bytes``: a request body (an upload, a JSON query); ``max_pixels``: an image's
    ``width x height`` (Pillow's ``MAX_IMAGE_PIXELS`` idea, checked on the header); ``max_k``: results
    per query (a larger ``k`` is refused; one above the index size is capped to it); ``formats``: the
    image formats accepted (Pillow's names); ``max_json_bytes``: a JSON body or form field without an image
    (a JSON query with ``image_base64`` may take ``max_upload_bytes``); ``max_json_values``: values
    (numbers, strings, keys) in one; ``max_json_depth``: nesting of arrays and objects in one;
    ``max_filter_values``: the values a filter names, all conditions together; ``max_images``: images in one
    ``POST /embed`` (all within ``max_upload_bytes``, each within ``max_pixels``)."""

    max_upload_bytes: int = 20 * 2**20
    max_pixels: int = 50_000_000
    max_k: int = 1000
    formats: tuple[str, ...] = DEFAULT_FORMATS
    max_json_bytes: int = 1 * 2**20
    max_json_values: int = 100_000
    max_json_depth: int = 8
    max_filter_values: int = 1000
    max_images: int = 64

    def __post_init__(self) -> None:
        for name in ("max_upload_bytes", "max_pixels", "max_k", "max_json_bytes", "max_json_values",
                     "max_json_depth", "max_filter_values", "max_images"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.formats:
            raise ValueError("formats must name at least one image format")
