"""Pictures of retrieval results, shared by the figures, ``search``'s page and ``serve``: image thumbnails,
relevance-level names and colours (green: same finest class, orange: coarser levels only, red: unrelated)."""

from __future__ import annotations

import zipfile
from collections.abc import Sequence

import numpy as np
from matplotlib.colors import LinearSegmentedColormap, to_rgba
from matplotlib.patches import Patch

from rankopt.data.image_files import load_image

__all__ = ["THUMB_PIXELS", "column_name", "level_colour", "level_name", "relevance_legend", "thumbnail"]

THUMB_PIXELS = 128
"""Longest side of the image thumbnails drawn in retrieval cells."""


def column_name(column: int, level_names: Sequence[str] | None) -> str:
    """Name of label column ``column``: from ``level_names`` (finest first), else ``class`` / ``level c``."""
    if level_names is not None and column < len(level_names):
        return str(level_names[column])
    return "class" if column == 0 else f"level {column}"


def level_name(level: int, num_levels: int, level_names: Sequence[str] | None) -> str:
    """Legend text for a relevance level: ``L`` shared levels = same finest class, ``0`` = unrelated,
    in between = same label at a coarser level only."""
    if level <= 0:
        return "unrelated"
    if level >= num_levels:
        return f"same {column_name(0, level_names)}"
    column = num_levels - level
    return f"same {column_name(column, level_names)}, other {column_name(column - 1, level_names)}"


_SAME_COLOUR, _UNRELATED_COLOUR, _UNLABELLED_COLOUR = "#2ca02c", "#d62728", "#999999"
_COARSER_CMAP = LinearSegmentedColormap.from_list("coarser", ["#ffb266", "#ff7f0e", "#d95f02"])


def level_colour(level: int, num_levels: int) -> tuple[float, float, float, float]:
    """Green: same finest class; red: unrelated; orange: shares only coarser levels
    (darker orange when it shares more of them); grey without labels (``num_levels`` 0)."""
    if num_levels == 0:
        return to_rgba(_UNLABELLED_COLOUR)
    if level >= num_levels:
        return to_rgba(_SAME_COLOUR)
    if level <= 0:
        return to_rgba(_UNRELATED_COLOUR)
    return _COARSER_CMAP((level - 1) / (num_levels - 2) if num_levels > 2 else 0.5)


def relevance_legend(num_levels: int, level_names: Sequence[str] | None) -> list[Patch]:
    """Legend patches of the relevance colours, finest match first, unrelated last (none without labels)."""
    if num_levels == 0:
        return []
    return [Patch(color=level_colour(lv, num_levels), label=level_name(lv, num_levels, level_names))
            for lv in range(num_levels, -1, -1)]


def thumbnail(path: str) -> np.ndarray:
    """RGB thumbnail of an image file or of a zip member (``archive.zip/member.png``, as rankopt datasets list them)."""
    try:
        img = load_image(path)
        img.thumbnail((THUMB_PIXELS, THUMB_PIXELS))
        return np.asarray(img)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as err:
        raise FileNotFoundError(f"cannot read image {path!r}: {err}") from err
