"""Figures comparing groups of runs: learning curves averaged over each group's seeds, and the
top-k results of every group for the same queries, one row per group."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator

from rankopt.viz._common import draw_cell, level_colour, new_figure, relevance_legend, save_figure, thumbnail, titled
from rankopt.viz.curves import _history_series

PANEL_INCHES = (4.6, 3.4)
"""Size of one learning-curve panel (one panel per metric, plus the training loss)."""
CELL_INCHES = 1.2
"""Width and height of one retrieval cell."""
QUERY_INCHES = 1.6
"""Width of the query column (the query spans the height of its block of group rows)."""
LABEL_INCHES = 1.4
"""Width of the column holding each row's group label."""
HEADER_INCHES = 0.8
_BLOCK_GAP = 0.35
"""Space between the blocks of two queries, in cells."""
_MISSING_FILL = (0.82, 0.82, 0.82, 1.0)
_QUERY_FRAME = (0.5, 0.5, 0.5, 1.0)


@dataclass(frozen=True)
class GroupCurve:
    """Mean and sample std (ddof=1; NaN with one run) over a group's runs, per evaluation epoch."""

    x: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    runs: int


def mean_curve(histories: Sequence[Sequence[Mapping[str, object]]], key: str) -> GroupCurve | None:
    """``key`` of ``metrics.json`` histories averaged over runs at each epoch: ``mean_e = Σ_r v_{r,e} / n_e``
    over the runs with a finite value at epoch ``e``; None when no run has one."""
    values: dict[float, list[float]] = {}
    for history in histories:
        x, _, series = _history_series(history)
        for epoch, v in zip(x, series.get(key, np.full(len(x), np.nan)), strict=True):
            if math.isfinite(v):
                values.setdefault(float(epoch), []).append(float(v))
    if not values:
        return None
    x = np.array(sorted(values))
    mean = np.array([np.mean(values[e]) for e in x])
    std = np.array([np.std(values[e], ddof=1) if len(values[e]) > 1 else np.nan for e in x])
    return GroupCurve(x, mean, std, len(histories))


def plot_learning_curves_by_group(
    histories: Mapping[str, Sequence[Sequence[Mapping[str, object]]]],
    out_path: str | Path,
    *,
    metrics: Sequence[str],
    loss_key: str | None = "loss",
    title_note: str | None = None,
) -> Path:
    """One panel per metric (and one for ``loss_key``), one line per group: the mean over the
    group's runs (``histories[group]``, each a ``metrics.json`` list) at each evaluation epoch,
    with a band of ± one sample std where the group has several runs."""
    if not histories:
        raise ValueError("histories is empty: nothing to plot")
    keys = list(metrics) + ([loss_key] if loss_key else [])
    curves = {key: {g: mean_curve(h, key) for g, h in histories.items()} for key in keys}
    panels = {key: c for key, c in curves.items() if any(v is not None for v in c.values())}
    if not panels:
        raise ValueError(f"no run has any of {keys} in its history")
    legend_inches = 2.4
    width = PANEL_INCHES[0] * len(panels) + legend_inches
    fig = new_figure(width, PANEL_INCHES[1])
    palette = matplotlib.colormaps["tab20" if len(histories) > 10 else "tab10"]
    colours = {g: palette(i % palette.N) for i, g in enumerate(histories)}  # distinct for up to 20 groups
    styles = {g: ("-", "--", ":")[i // palette.N % 3] for i, g in enumerate(histories)}
    axes = fig.subplots(1, len(panels), squeeze=False, sharex=True)[0]  # the same epochs in every panel
    for ax, (key, by_group) in zip(axes, panels.items(), strict=True):
        for group, curve in by_group.items():
            if curve is None:
                continue
            ax.plot(curve.x, curve.mean, marker="o", markersize=3, color=colours[group], linestyle=styles[group],
                    label=f"{group} ({curve.runs})")
            ax.fill_between(curve.x, curve.mean - curve.std, curve.mean + curve.std, color=colours[group], alpha=0.18, linewidth=0)
        ax.set(xlabel="epoch", ylabel=key)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(titled(f"training {key}" if key == loss_key else key, title_note), fontsize=10)
        ax.grid(alpha=0.3)
    right = 1.0 - legend_inches / width  # the legend gets its own column right of the panels
    fig.legend(*axes[0].get_legend_handles_labels(), fontsize=7, title="group (runs)", title_fontsize=7,
               loc="center left", bbox_to_anchor=(right, 0.5))
    fig.tight_layout(rect=(0.0, 0.0, right, 1.0))
    return save_figure(fig, out_path)


@dataclass(frozen=True)
class GroupNeighbours:
    """One group's top-k results for the shared queries (the same query order for every group):
    ``(Q, k)`` reference image paths, shared hierarchy levels with the query and scores."""

    label: str
    paths: Sequence[Sequence[str]]
    levels: np.ndarray
    scores: np.ndarray


def _clip(text: str, width: int) -> str:
    """``text``, or its last ``width - 1`` characters after an ellipsis (a path's end says the most)."""
    return text if len(text) <= width else "…" + text[-(width - 1):]


def _image_or_none(path: str, cache: dict[str, np.ndarray | None]) -> np.ndarray | None:
    if path not in cache:
        try:
            cache[path] = thumbnail(path)
        except FileNotFoundError:
            cache[path] = None
    return cache[path]


def _draw_image(ax: Axes, path: str, colour: tuple[float, ...], title: str, cache: dict[str, np.ndarray | None]) -> None:
    """A framed thumbnail, or a grey cell reading "missing" when the image cannot be read."""
    image = _image_or_none(path, cache)
    draw_cell(ax, image, colour, title, text="missing" if image is None else "", fill=_MISSING_FILL)
    if image is None:
        ax.set_box_aspect(1)  # square, like the thumbnails of square images


def plot_retrieval_rows(
    out_path: str | Path,
    query_paths: Sequence[str],
    groups: Sequence[GroupNeighbours],
    *,
    num_levels: int,
    level_names: Sequence[str] | None = None,
    query_titles: Sequence[str] | None = None,
    title_note: str | None = None,
) -> Path:
    """For each query, its image (titled by ``query_titles``, lines clipped to 30 characters; default
    the file name) then one row per group with that group's top-k results.

    Frames: green = same finest class, orange/olive = sharing only coarser levels, red =
    unrelated (``num_levels`` label columns). Images are read with
    :func:`rankopt.data.base.load_image` (zip members too); one that cannot be read is
    drawn as a grey cell reading "missing".
    """
    if not query_paths or not groups:
        raise ValueError("plot_retrieval_rows needs at least one query and one group")
    num_queries, k = len(query_paths), int(groups[0].levels.shape[1])
    for g in groups:
        if g.levels.shape != (num_queries, k) or g.scores.shape != (num_queries, k) or len(g.paths) != num_queries:
            raise ValueError(f"group {g.label!r}: expected ({num_queries}, {k}) results, got levels {g.levels.shape}")
    titles = list(query_titles) if query_titles is not None else [Path(p).name for p in query_paths]
    n_groups = len(groups)
    heights = []
    for q in range(num_queries):
        heights += [1.0] * n_groups + ([_BLOCK_GAP] if q < num_queries - 1 else [])
    width = QUERY_INCHES + LABEL_INCHES + CELL_INCHES * k
    fig = new_figure(width, CELL_INCHES * sum(heights) + HEADER_INCHES)
    grid = fig.add_gridspec(len(heights), k + 2, height_ratios=heights,
                            width_ratios=[QUERY_INCHES, LABEL_INCHES] + [CELL_INCHES] * k,
                            left=0.01, right=0.99, bottom=0.01, top=1 - HEADER_INCHES / fig.get_figheight(),
                            wspace=0.08, hspace=0.3)
    cache: dict[str, np.ndarray | None] = {}
    for q in range(num_queries):
        top = q * (n_groups + 1)
        _draw_image(fig.add_subplot(grid[top : top + n_groups, 0]), query_paths[q], _QUERY_FRAME,
                    "\n".join(["query", *(_clip(line, 30) for line in titles[q].splitlines())]), cache)
        for r, g in enumerate(groups):
            label_ax = fig.add_subplot(grid[top + r, 1])
            label_ax.axis("off")
            label_ax.text(0.95, 0.5, "\n".join(textwrap.wrap(g.label, 18)), ha="right", va="center", fontsize=8,
                          fontweight="bold", transform=label_ax.transAxes)
            for c in range(k):
                _draw_image(fig.add_subplot(grid[top + r, c + 2]), g.paths[q][c], level_colour(int(g.levels[q, c]), num_levels),
                            f"#{c + 1}  s={float(g.scores[q, c]):.2f}", cache)
    fig.legend(handles=relevance_legend(num_levels, level_names), loc="upper left",
               bbox_to_anchor=(0.0, 1 - 0.3 / fig.get_figheight()), ncol=num_levels + 1, fontsize=7, frameon=False)
    fig.suptitle(titled(f"Top-{k} results of each group for the same {num_queries} queries", title_note, max_chars=None),
                 x=0.01, y=1 - 0.05 / fig.get_figheight(), ha="left", va="top", fontsize=9)
    return save_figure(fig, out_path)
