"""Nested mappings (configs, JSON records) as flat ``{"dotted.key": value}`` tables, without importing torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``tree`` as ``{"dotted.key": value}`` (an empty mapping is a value)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
