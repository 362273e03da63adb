"""Comparison figures (rankopt.viz.comparison): the retrieval figure's layout stays legible at its
displayed width whatever the number of groups, and learning curves say when they have too few points."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from rankopt.viz import comparison, curves, training
from rankopt.viz._common import DPI, MIN_CURVE_POINTS
from rankopt.viz.comparison import (CELL_INCHES, FIGURE_INCHES, MIN_CELL_INCHES, QUERY_INCHES, TOP_INCHES,
                                    _BLOCK_GAP_INCHES, GroupNeighbours, _shared_suffix, _wrap, plot_learning_curves_by_group,
                                    plot_retrieval_rows, rows_layout)

from .viz_helpers import expected_pixels, png_pixels, png_size


@pytest.mark.parametrize(("groups", "k", "queries"), [(14, 6, 4), (3, 6, 4), (6, 6, 4), (1, 1, 1), (40, 6, 4), (7, 6, 8)])
def test_rows_layout_fits_the_displayed_width_and_height(groups, k, queries):
    lay = rows_layout(groups, k, queries)
    assert lay.groups_as_rows == (groups <= k)
    assert (lay.rows, lay.columns) == ((groups, k) if groups <= k else (k, groups))
    assert MIN_CELL_INCHES <= lay.cell <= CELL_INCHES
    width, height = lay.size(queries)
    if lay.cell > MIN_CELL_INCHES:  # not at the floor: both limits hold, and one of them (or the largest cell) binds
        assert width <= FIGURE_INCHES[0] + 1e-9 and height <= FIGURE_INCHES[1] + 1e-9
        assert lay.cell == CELL_INCHES or math.isclose(width, FIGURE_INCHES[0]) or math.isclose(height, FIGURE_INCHES[1])
    else:  # 40 groups, or 8 queries of 7 groups: cells at the floor, a wider or taller figure
        assert width > FIGURE_INCHES[0] or height > FIGURE_INCHES[1]


def test_the_benchmark_figure_is_about_1000_px_wide_and_under_2500_tall():
    """14 losses x 4 queries x top-6 (the Omniglot benchmark's compare page): formerly 1020 x 6926 px."""
    width, height = rows_layout(14, 6, 4).size(4)
    assert round(width * DPI) == 1000 and height * DPI < 2500


def _solid(path, colour):
    Image.new("RGB", (32, 32), colour).save(path)
    return str(path)


@pytest.mark.parametrize("num_groups", [3, 9])
def test_each_cell_shows_its_group_and_rank(tmp_path, num_groups):
    """Every result image is a solid colour unique to its (group, rank): the centre of each cell, placed
    by the layout (groups as rows for 3 groups, as columns for 9), shows that colour."""
    k, queries = 4, 2
    palette = {(g, c): (20 + 20 * g, 40 + 50 * c, 200 - 15 * g) for g in range(num_groups) for c in range(k)}
    images = {key: _solid(tmp_path / f"r{key[0]}_{key[1]}.png", colour) for key, colour in palette.items()}
    query = [_solid(tmp_path / f"q{q}.png", (250, 250, 0)) for q in range(queries)]
    groups = [GroupNeighbours(f"loss{g} (seed 0)", [[images[g, c] for c in range(k)] for _ in range(queries)],
                              np.full((queries, k), 2), np.full((queries, k), 0.5)) for g in range(num_groups)]
    out = plot_retrieval_rows(tmp_path / "rows.png", query, groups, num_levels=2)
    lay = rows_layout(num_groups, k, queries)
    assert np.abs(np.subtract(png_size(out), expected_pixels(*lay.size(queries)))).max() <= 1  # Agg truncates
    pixels = png_pixels(out).astype(int)
    for q in range(queries):
        top = TOP_INCHES + q * (lay.block + _BLOCK_GAP_INCHES) + lay.header
        for (g, c), colour in palette.items():
            row, column = (g, c) if lay.groups_as_rows else (c, g)
            x = (QUERY_INCHES + lay.label_width + (column + 0.5) * lay.cell) * DPI
            y = (top + (row + 0.55) * lay.cell) * DPI
            assert np.abs(pixels[round(y), round(x)] - colour).max() <= 3, (q, g, c)


def test_shared_suffix_and_wrap():
    assert _shared_suffix(["a (seed 0)", "bb (seed 0)"]) == " (seed 0)"
    assert _shared_suffix(["a (seed 0)", "bb (seed 1)"]) == ""
    assert _shared_suffix(["a (seed 0)"]) == ""  # one group: nothing to factor out
    assert _shared_suffix(["(seed 0)", "b (seed 0)"]) == ""
    assert _wrap("normalized_softmax", 11, 3) == "normalized_\nsoftmax"
    assert _wrap("rod_recall", 9, 3) == "rod_\nrecall"
    cut = _wrap("alpha beta gamma delta", 5, 2)
    assert cut.count("\n") == 1 and cut.endswith("…") and cut.startswith("alpha\n")


def _texts(monkeypatch, module):
    """Capture the texts of the figure ``module`` saves next."""
    seen: list[str] = []

    def keep(fig, path):
        seen.extend(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))
        return path

    monkeypatch.setattr(module, "save_figure", keep)
    return seen


def _history(points: int) -> list[dict]:
    return [{"epoch": e, "loss": math.nan if e == 0 else 1.0 / e, "map@r": 0.1 * e} for e in range(points)]


@pytest.mark.parametrize("points", [2, MIN_CURVE_POINTS + 1])
def test_learning_curves_note_fewer_than_four_evaluations(monkeypatch, tmp_path, points):
    texts = _texts(monkeypatch, comparison)
    plot_learning_curves_by_group({"a": [_history(points)] * 2, "b": [_history(points)]}, tmp_path / "c.png",
                                  metrics=["map@r"])
    notes = [t for t in texts if "only " in t]
    if points < MIN_CURVE_POINTS:  # map@r has 2 points, the loss (NaN untrained) 1
        assert sorted(notes) == ["epoch\nonly 1 point per curve (markers): lines join them",
                                 "epoch\nonly 2 points per curve (markers): lines join them"]
    else:
        assert notes == []


@pytest.mark.parametrize(("module", "plot"), [(curves, curves.plot_training_curves),
                                              (training, training.plot_metric_history)])
def test_run_curves_note_fewer_than_four_evaluations(monkeypatch, tmp_path, module, plot):
    texts = _texts(monkeypatch, module)
    plot(_history(3), tmp_path / "c.png")
    assert any(t.endswith("\nonly 3 points per curve (markers): lines join them") for t in texts)
    texts.clear()
    plot(_history(MIN_CURVE_POINTS + 1), tmp_path / "c.png")
    assert not any("only " in t for t in texts)
