"""A request's parts checked within the service's :class:`~rankopt.serve.limits.Limits`: ``k``, base64, a vector,
a filter, a JSON query or embed body; anything bad is an :class:`~rankopt.serve.errors.ApiError` naming the item."""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from rankopt.search.metadata import LABEL_KEY, check_columns, conditions
from rankopt.serve.errors import ApiError
from rankopt.serve.limits import Limits

if TYPE_CHECKING:
    from rankopt.search import Index

QUERY_KINDS = ("image_base64", "vector", "id")
"""A JSON query names exactly one of these."""
JSON_KEYS = frozenset({*QUERY_KINDS, "k", "filter"})
EMBED_JSON_KEYS = frozenset({"images_base64", "names"})
"""The keys of a JSON body of ``POST /embed``."""
DIGITS = re.compile(r"[0-9]+")
MAX_FILTER_TEXT = 1000
"""Characters of one filter condition or value."""


def check_k(value: Any, limits: Limits) -> int:
    """``value`` (a JSON integer, or ASCII digits from a query string or form field) as ``k`` in ``[1, max_k]``."""
    if isinstance(value, str):
        if not DIGITS.fullmatch(value):
            raise ApiError(400, f"k must be an integer written in digits 0-9, got {value[:40]!r}")
        value = int(value[:12])  # more digits than this are over any limit anyway
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"k must be an integer, got {_shown(value)}")
    if not 1 <= value <= limits.max_k:
        raise ApiError(400, f"k must be between 1 and {limits.max_k}, got {value}")
    return value


def decode_base64(text: Any, what: str = "image_base64") -> bytes:
    """The bytes of a JSON query's ``image_base64`` (standard alphabet, padding required); ``what`` names it in
    errors."""
    if not isinstance(text, str):
        raise ApiError(400, f"{what} must be a string, got {type(text).__name__}")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as err:
        raise ApiError(400, f"{what} is not valid base64: {err}") from None


def check_vector(value: Any, dim: int) -> torch.Tensor:
    """A JSON query's ``vector`` as a ``(1, dim)`` float32 tensor: ``dim`` finite numbers."""
    if not isinstance(value, list):
        raise ApiError(400, f"vector must be a list of {dim} numbers, got {type(value).__name__}")
    if len(value) != dim:
        raise ApiError(400, f"vector has {len(value)} values but the index holds {dim}-d embeddings")
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ApiError(400, f"vector[{i}] is {_shown(v)}, not a number")
        if not math.isfinite(v if isinstance(v, float) else _as_float(v)):
            raise ApiError(400, f"vector[{i}] is {_shown(v)}: values must be finite float32 numbers")
    vector = torch.tensor([[float(v) for v in value]], dtype=torch.float64)
    if vector.abs().max() > torch.finfo(torch.float32).max:
        raise ApiError(400, "vector has a value beyond float32's range: values must be finite float32 numbers")
    return vector.float()


def check_filter(value: Any, index: Index, limits: Limits) -> Mapping[str, Any] | str | list[str] | None:
    """A query's ``filter`` checked completely against ``index`` (every condition well formed, at most
    ``max_filter_values`` values, every column the index's): a JSON object ``{column: value or [values]}``, a
    string ``"column=value"`` / ``"column in [a, b]"`` or a list of them; None or blank: no filter."""
    if value is None or isinstance(value, str) and not value.strip():
        return None
    if isinstance(value, str):
        named = [value]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        named = value
    elif isinstance(value, Mapping):
        named = [v for values in value.values() for v in (values if isinstance(values, list) else [values])]
    else:
        raise ApiError(400, f"filter must be a JSON object, a string or a list of strings, got {_shown(value)}")
    if len(named) > limits.max_filter_values:
        raise ApiError(413, f"the filter names {len(named)} values, over the limit of {limits.max_filter_values}")
    if any(isinstance(v, str) and len(v) > MAX_FILTER_TEXT for v in named):
        raise ApiError(413, f"a filter condition or value is over {MAX_FILTER_TEXT} characters")
    try:
        check_columns(conditions(value), [*index.metadata, LABEL_KEY])
    except ValueError as err:
        raise ApiError(400, str(err)) from None
    return value


def _check_object(body: Any, keys: frozenset[str], what: str) -> None:
    """A JSON body that is an object with no key outside ``keys`` (400 naming the first unknown ones)."""
    if not isinstance(body, Mapping):
        raise ApiError(400, f"the JSON body must be an object, got {type(body).__name__}")
    unknown = sorted(set(body) - keys)
    if unknown:
        shown = ", ".join(repr(key[:40]) for key in unknown[:5]) + (", ..." if len(unknown) > 5 else "")
        raise ApiError(400, f"unknown key(s) {shown}; {what} has {', '.join(sorted(keys))}")


def check_json_query(body: Any) -> tuple[str, Any]:
    """``(kind, value)`` of a JSON query: an object with exactly one of :data:`QUERY_KINDS` and no
    keys outside :data:`JSON_KEYS`; an ``id`` is a string (or an integer, as its text)."""
    _check_object(body, JSON_KEYS, "a query")
    given = [kind for kind in QUERY_KINDS if kind in body]
    if len(given) != 1:
        raise ApiError(400, f"a query gives exactly one of {', '.join(QUERY_KINDS)}; got "
                            f"{', '.join(given) if given else 'none'}")
    kind, value = given[0], body[given[0]]
    if kind == "id":
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ApiError(400, f"id must be a string (an item's id), got {_shown(value)}")
        value = str(value)
    return kind, value


def check_embed_json(body: Any, limits: Limits) -> list[tuple[str, Any]]:
    """``(name, base64 text)`` of each image of a JSON body of ``POST /embed``: an object with ``images_base64`` (a
    list of 1 to ``max_images`` values; more: 413) and optionally ``names`` (as many strings; default
    ``images_base64[i]``), no other key. The texts are decoded by :func:`decode_base64`."""
    _check_object(body, EMBED_JSON_KEYS, "a body")
    images = body.get("images_base64")
    if not isinstance(images, list) or not images:
        raise ApiError(400, f"images_base64 must be a non-empty list of base64 images, got {_shown(images)}")
    if len(images) > limits.max_images:
        raise ApiError(413, f"images_base64 holds {len(images)} images, over the limit of {limits.max_images}")
    names = body.get("names")
    if names is None:
        names = [f"images_base64[{i}]" for i in range(len(images))]
    elif not isinstance(names, list) or len(names) != len(images) or not all(isinstance(n, str) for n in names):
        raise ApiError(400, f"names must be a list of {len(images)} strings (one per image), got {_shown(names)}")
    return [(name[:200], text) for name, text in zip(names, images)]


def parse_json(data: bytes, limits: Limits, what: str, *, max_bytes: int | None = None) -> Any:
    """``data`` parsed as JSON within the limits: at most ``max_bytes`` (default ``max_json_bytes``; 413),
    ``max_json_values`` values (counted on the bytes before parsing; 413) and ``max_json_depth`` levels of
    nesting (400); invalid JSON is a 400 naming ``what``."""
    max_bytes = limits.max_json_bytes if max_bytes is None else max_bytes
    if len(data) > max_bytes:
        raise ApiError(413, f"{what} ({len(data)} bytes) is over the limit of {max_bytes} bytes")
    values = data.count(b",") + data.count(b":") + 1  # an upper bound (separators in strings count too)
    if values > limits.max_json_values:
        raise ApiError(413, f"{what} holds about {values} values, over the limit of {limits.max_json_values}")
    try:
        value = json.loads(data)
    except RecursionError:
        raise ApiError(400, f"{what} is nested deeper than {limits.max_json_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError, integers of over 4300 digits, bad UTF-8
        raise ApiError(400, f"{what} is not valid JSON: {str(err)[:200]}") from None
    if _depth(value, limits.max_json_depth) > limits.max_json_depth:
        raise ApiError(400, f"{what} is nested deeper than {limits.max_json_depth} levels")
    return value


def _depth(value: Any, limit: int) -> int:
    """The nesting depth of a parsed JSON value (a scalar: 0), counted up to ``limit + 1``."""
    if limit < 0 or not isinstance(value, (list, dict)):
        return 0
    children = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(child, limit - 1) for child in children), default=0)


def _as_float(value: int) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _shown(value: Any) -> str:
    """``repr(value)`` cut to 60 characters (an error message never echoes a whole body)."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."
