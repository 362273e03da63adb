"""Figures comparing groups of runs: learning curves averaged over each group's seeds, and the
top-k results of every group for the same queries, side by side."""

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

from rankopt.viz._common import draw_cell, new_figure, note_few_points, save_figure, titled
from rankopt.viz.pictures import level_colour, relevance_legend, thumbnail
from rankopt.viz.curves import _history_series

PANEL_INCHES = (4.6, 3.4)
"""Size of one learning-curve panel (one panel per metric, plus the training loss)."""
CELL_INCHES = 1.2
"""Largest width and height of one retrieval cell."""
MIN_CELL_INCHES = 0.5
"""Smallest cell: a wider or taller figure rather than smaller images."""
FIGURE_INCHES = (10.0, 24.0)
"""The width the retrieval figure is fitted to (about 1000 px: the docs and the compare page show it at its
own size) and its largest height (2400 px); its cells shrink, from :data:`CELL_INCHES`, to fit both."""
SCORE_MIN_CELL_INCHES = 0.8
"""Cells at least this large carry their score above the image."""
QUERY_INCHES = 1.6
"""Width of the query column (the query spans the height of its block)."""
QUERY_TITLE_INCHES = 0.4
GROUP_LABEL_INCHES = 1.4
"""Width of the row labels when the groups are rows (``#r`` labels take :data:`RANK_LABEL_INCHES`)."""
RANK_LABEL_INCHES = 0.35
TOP_INCHES = 0.7
"""Title and relevance legend."""
_BLOCK_GAP_INCHES = 0.3
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
    with a band of ± one sample std where the group has several runs; markers at the evaluations, and a
    note in a panel whose sparsest curve has fewer than :data:`~rankopt.viz._common.MIN_CURVE_POINTS`."""
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
        drawn = {g: c for g, c in by_group.items() if c is not None}
        for group, curve in drawn.items():
            ax.plot(curve.x, curve.mean, marker="o", markersize=4, color=colours[group], linestyle=styles[group],
                    label=f"{group} ({curve.runs})")
            ax.fill_between(curve.x, curve.mean - curve.std, curve.mean + curve.std, color=colours[group], alpha=0.18,
                            linewidth=0)
        ax.set(xlabel="epoch", ylabel=key)
        note_few_points(ax, min(c.x.size for c in drawn.values()))
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


def _shared_suffix(labels: Sequence[str]) -> str:
    """The parenthesised ending every one of two or more labels shares (``" (seed 0)"``), else ``""``."""
    cut = labels[0].rfind(" (")
    suffix = labels[0][cut:] if cut > 0 and labels[0].endswith(")") else ""
    if len(labels) < 2 or not suffix or not all(label.endswith(suffix) and len(label) > len(suffix)
                                                for label in labels):
        return ""
    return suffix


def _wrap(text: str, width: int, max_lines: int) -> str:
    """``text`` on lines of at most ``width`` characters, broken at spaces or after underscores."""
    lines = textwrap.wrap(text.replace("_", "_ "), width + 1, max_lines=max_lines, placeholder="…")
    return "\n".join(line.replace("_ ", "_") for line in lines)


def _image_or_none(path: str, cache: dict[str, np.ndarray | None]) -> np.ndarray | None:
    if path not in cache:
        try:
            cache[path] = thumbnail(path)
        except FileNotFoundError:
            cache[path] = None
    return cache[path]


def _draw_image(ax: Axes, path: str, colour: tuple[float, ...], title: str, cache: dict[str, np.ndarray | None],
                frame: float) -> None:
    """A thumbnail framed by a ``frame``-point line, or a grey cell reading "missing" when the image cannot be read."""
    image = _image_or_none(path, cache)
    draw_cell(ax, image, colour, title, text="missing" if image is None else "", fill=_MISSING_FILL, linewidth=frame)
    if image is None:
        ax.set_box_aspect(1)  # square, like the thumbnails of square images


@dataclass(frozen=True)
class RowsLayout:
    """Where :func:`plot_retrieval_rows` puts things (inches). Each query's block is a matrix of cells, one
    axis the groups and the other the ranks: groups as rows when there are no more groups than ranks,
    else as columns (so 14 losses side by side stay about 1000 px wide), under a header band naming the
    columns; blocks are stacked, the query left of its block."""

    groups_as_rows: bool
    rows: int
    columns: int
    cell: float
    label_width: float
    header: float
    wrap: int
    """Characters per line of the column headers (group names when the groups are columns)."""

    @property
    def block(self) -> float:
        return self.header + self.rows * self.cell

    def size(self, num_queries: int) -> tuple[float, float]:
        return (QUERY_INCHES + self.label_width + self.columns * self.cell,
                TOP_INCHES + num_queries * self.block + (num_queries - 1) * _BLOCK_GAP_INCHES + 0.1)


def rows_layout(num_groups: int, k: int, num_queries: int) -> RowsLayout:
    """The orientation and cell size: cells as large as fit :data:`FIGURE_INCHES`, within
    [:data:`MIN_CELL_INCHES`, :data:`CELL_INCHES`]."""
    as_rows = num_groups <= k
    rows, columns = (num_groups, k) if as_rows else (k, num_groups)
    label = GROUP_LABEL_INCHES if as_rows else RANK_LABEL_INCHES
    header = 0.25 if as_rows else 0.45  # "#r" labels, or group names on up to 3 lines
    fixed_height = TOP_INCHES + num_queries * header + (num_queries - 1) * _BLOCK_GAP_INCHES + 0.1
    fit = min((FIGURE_INCHES[0] - QUERY_INCHES - label) / columns,
              (FIGURE_INCHES[1] - fixed_height) / (num_queries * rows))
    cell = float(min(CELL_INCHES, max(MIN_CELL_INCHES, fit)))
    return RowsLayout(as_rows, rows, columns, cell, label, header, wrap=max(6, int(cell * 16)))


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
    the file name) beside a block holding every group's top-k results: one row per group when the
    groups are no more than k, else one column per group (:func:`rows_layout`), so the figure stays
    about 1000 px wide and at most 2400 px tall whatever the number of groups.

    Frames: green = same finest class, orange/olive = sharing only coarser levels, red =
    unrelated (``num_levels`` label columns; 0: unlabelled photos, grey frames and no legend); scores
    above cells of at least :data:`SCORE_MIN_CELL_INCHES`. Images are read with :func:`rankopt.data.image_files.load_image`
    (zip members too); one that cannot be read is drawn as a grey cell reading "missing".
    """
    if not query_paths or not groups:
        raise ValueError("plot_retrieval_rows needs at least one query and one group")
    num_queries, k = len(query_paths), int(groups[0].levels.shape[1])
    for g in groups:
        if g.levels.shape != (num_queries, k) or g.scores.shape != (num_queries, k) or len(g.paths) != num_queries:
            raise ValueError(f"group {g.label!r}: expected ({num_queries}, {k}) results, got levels {g.levels.shape}")
    titles = list(query_titles) if query_titles is not None else [Path(p).name for p in query_paths]
    lay = rows_layout(len(groups), k, num_queries)
    width, height = lay.size(num_queries)
    fig = new_figure(width, height)

    def axes(left: float, top: float, w: float, h: float) -> Axes:  # inches from the top-left corner
        return fig.add_axes((left / width, 1 - (top + h) / height, w / width, h / height))

    def text(x: float, y: float, s: str, **kw: object) -> None:
        fig.text(x / width, 1 - y / height, s, **kw)

    shared = _shared_suffix([g.label for g in groups])  # said once in the title
    labels = [g.label.removesuffix(shared) for g in groups]
    row_names = labels if lay.groups_as_rows else [f"#{r + 1}" for r in range(k)]
    column_names = [f"#{c + 1}" for c in range(k)] if lay.groups_as_rows else labels
    scores = lay.cell >= SCORE_MIN_CELL_INCHES
    title_space = 0.16 if scores else 0.03
    frame = min(4.0, max(2.0, 4.0 * lay.cell / CELL_INCHES))
    left = QUERY_INCHES + lay.label_width
    cache: dict[str, np.ndarray | None] = {}
    for q in range(num_queries):
        top = TOP_INCHES + q * (lay.block + _BLOCK_GAP_INCHES)
        _draw_image(axes(0.05, top + QUERY_TITLE_INCHES, QUERY_INCHES - 0.15, lay.block - QUERY_TITLE_INCHES),
                    query_paths[q], _QUERY_FRAME,
                    "\n".join(["query", *(_clip(line, 30) for line in titles[q].splitlines())]),
                    cache, 4.0)
        for c, name in enumerate(column_names):
            text(left + (c + 0.5) * lay.cell, top + lay.header - 0.04,
                 name if lay.groups_as_rows else _wrap(name, lay.wrap, 3),
                 ha="center", va="bottom", fontsize=8 if lay.groups_as_rows else 7, fontweight="bold")
        for r, name in enumerate(row_names):
            text(left - 0.08, top + lay.header + (r + 0.5) * lay.cell,
                 _wrap(name, 18, 4) if lay.groups_as_rows else name,
                 ha="right", va="center", fontsize=8, fontweight="bold")
        for g, group in enumerate(groups):
            for c in range(k):
                row, column = (g, c) if lay.groups_as_rows else (c, g)
                ax = axes(left + column * lay.cell + 0.04, top + lay.header + row * lay.cell + title_space,
                          lay.cell - 0.08, lay.cell - title_space - 0.04)
                _draw_image(ax, group.paths[q][c], level_colour(int(group.levels[q, c]), num_levels),
                            f"s={float(group.scores[q, c]):.2f}" if scores else "", cache, frame)
    if num_levels:
        fig.legend(handles=relevance_legend(num_levels, level_names), loc="upper left",
                   bbox_to_anchor=(0.0, 1 - 0.3 / height), ncol=num_levels + 1, fontsize=7, frameon=False)
    fig.suptitle(titled(f"Top-{k} results of each group{shared} for the same {num_queries} queries", title_note,
                        max_chars=None),
                 x=0.01, y=1 - 0.05 / height, ha="left", va="top", fontsize=9)
    return save_figure(fig, out_path)
