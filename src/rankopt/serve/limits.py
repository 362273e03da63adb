"""The service's input limits and checks: every bad input becomes an :class:`ApiError` (an HTTP 4xx
status and a message naming the item at fault), never an exception that reaches the server.

Images are decoded as ``rankopt search`` decodes image files (:func:`rankopt.data.decode.decode_image`,
EXIF orientation, reduced JPEG decode for the transform's first resize, :func:`rankopt.data.base.to_rgb`),
after the header's ``width x height`` is checked against :attr:`Limits.max_pixels` (a decompression
bomb is refused before a pixel is decoded).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError

from rankopt.data.base import to_rgb
from rankopt.data.decode import decode_image

QUERY_KINDS = ("image_base64", "vector", "id")
"""A JSON query names exactly one of these."""
JSON_KEYS = frozenset({*QUERY_KINDS, "k", "filter"})


class ApiError(Exception):
    """A request the service refuses: ``status`` (4xx) and ``message`` go back as ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class Limits:
    """``max_upload_bytes``: a request body (an upload, a JSON query); ``max_pixels``: an image's
    ``width x height`` (Pillow's ``MAX_IMAGE_PIXELS`` idea, checked on the header); ``max_k``: results
    per query (a larger ``k`` is refused; one above the index size is capped to it)."""

    max_upload_bytes: int = 20 * 2**20
    max_pixels: int = 50_000_000
    max_k: int = 1000

    def __post_init__(self) -> None:
        for name in ("max_upload_bytes", "max_pixels", "max_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")


def check_k(value: Any, limits: Limits) -> int:
    """``value`` (an int, or its decimal text from a query string or form) as ``k`` in ``[1, max_k]``."""
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise ApiError(400, f"k must be an integer, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"k must be an integer, got {value!r}")
    if not 1 <= value <= limits.max_k:
        raise ApiError(400, f"k must be between 1 and {limits.max_k}, got {value}")
    return value


def decode_upload(data: bytes, limits: Limits, min_side: int | None = None, name: str = "the upload") -> Image.Image:
    """``data`` as an RGB image, decoded like an image file of ``rankopt search`` (``min_side``: the
    transform's ``decode_min_side``). Empty, unreadable, truncated or too many pixels: 4xx (its size in
    bytes is bounded by the request body's limit)."""
    if not data:
        raise ApiError(400, f"{name} is empty")
    try:
        with Image.open(io.BytesIO(data)) as probe:  # reads the header only
            width, height = probe.size
    except Image.DecompressionBombError as err:  # over twice Pillow's own MAX_IMAGE_PIXELS
        raise ApiError(413, f"{name} has too many pixels, over the limit of {limits.max_pixels} ({err})") from None
    except UnidentifiedImageError:
        raise ApiError(400, f"{name} is not an image Pillow can read") from None
    except Exception as err:  # noqa: BLE001 - Pillow raises many types for damaged headers
        raise ApiError(400, f"{name} is not an image Pillow can read ({type(err).__name__}: {err})") from None
    if width * height > limits.max_pixels:
        raise ApiError(413, f"{name} is {width} x {height} = {width * height} pixels, over the limit of "
                            f"{limits.max_pixels} (a decompression bomb?)")
    try:
        return to_rgb(decode_image(data, min_side))
    except Exception as err:  # noqa: BLE001 - truncated or damaged data: OSError, SyntaxError, ValueError, ...
        raise ApiError(400, f"{name} cannot be decoded ({type(err).__name__}: {err})") from None


def decode_base64(text: Any) -> bytes:
    """The bytes of a JSON query's ``image_base64`` (standard alphabet, padding required)."""
    if not isinstance(text, str):
        raise ApiError(400, f"image_base64 must be a string, got {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ApiError(400, f"image_base64 is not valid base64: {err}") from None


def check_vector(value: Any, dim: int) -> torch.Tensor:
    """A JSON query's ``vector`` as a ``(1, dim)`` float32 tensor: ``dim`` finite numbers."""
    if not isinstance(value, list):
        raise ApiError(400, f"vector must be a list of {dim} numbers, got {type(value).__name__}")
    if len(value) != dim:
        raise ApiError(400, f"vector has {len(value)} values but the index holds {dim}-d embeddings")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ApiError(400, f"vector[{i}] is {v!r}, not a number")
        if not math.isfinite(v):
            raise ApiError(400, f"vector[{i}] is {v!r}: values must be finite")
    return torch.tensor([value], dtype=torch.float32)


def check_filter(value: Any) -> Mapping[str, Any] | str | list[str] | None:
    """A query's ``filter`` in a form :meth:`rankopt.search.Index.search` takes (its keys are checked
    there): a JSON object ``{column: value or [values]}``, a string ``"column=value"`` or a list of them."""
    if value is None or isinstance(value, str) and not value.strip():
        return None
    if isinstance(value, str) or isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    if isinstance(value, Mapping) and all(isinstance(key, str) for key in value):
        return value
    raise ApiError(400, f"filter must be a JSON object, a string or a list of strings, got {value!r}")


def check_json_query(body: Any) -> tuple[str, Any]:
    """``(kind, value)`` of a JSON query: an object with exactly one of :data:`QUERY_KINDS` and no
    keys outside :data:`JSON_KEYS`."""
    if not isinstance(body, Mapping):
        raise ApiError(400, f"the JSON body must be an object, got {type(body).__name__}")
    unknown = sorted(set(body) - JSON_KEYS)
    if unknown:
        raise ApiError(400, f"unknown key(s) {', '.join(map(repr, unknown))}; a query has {', '.join(sorted(JSON_KEYS))}")
    given = [kind for kind in QUERY_KINDS if kind in body]
    if len(given) != 1:
        raise ApiError(400, f"a query gives exactly one of {', '.join(QUERY_KINDS)}; got "
                            f"{', '.join(given) if given else 'none'}")
    return given[0], body[given[0]]
