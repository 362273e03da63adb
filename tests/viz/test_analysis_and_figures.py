"""Decomposability-gap and sweep plots; the write_figures contract used by ``rankopt train``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankopt.viz import plot_decomposability_gap, plot_sweep, write_figures
from rankopt.viz._common import new_figure, titled
from rankopt.viz.analysis import ANALYSIS_INCHES, _set_scale
from rankopt.viz.retrieval_grid import CELL_INCHES, HEADER_INCHES

from .viz_helpers import clusters, expected_pixels, png_pixels, png_size


def test_decomposability_gap_plot(tmp_path):
    path = plot_decomposability_gap([16, 32, 64, 128], [0.3, 0.2, 0.1, 0.05], tmp_path / "dg.png", title_note="synthetic")
    assert png_size(path) == expected_pixels(*ANALYSIS_INCHES)
    path = plot_decomposability_gap([16, 32], {"pixels": [0.3, 0.2], "trained": [0.1, 0.0]}, tmp_path / "dg2.png")
    assert png_size(path) == expected_pixels(*ANALYSIS_INCHES)
    with pytest.raises(ValueError, match="has 1 values but there are 2"):
        plot_decomposability_gap([16, 32], [0.3], tmp_path / "bad.png")
    with pytest.raises(ValueError, match="batch_sizes must be positive"):
        plot_decomposability_gap([0, 32], [0.3, 0.1], tmp_path / "bad.png")
    with pytest.raises(ValueError, match="batch_sizes is empty"):
        plot_decomposability_gap([], [], tmp_path / "bad.png")


def test_sweep_plot(tmp_path):
    path = plot_sweep("rho", [0, 1, 10, 100, 1000], {"R@1": [0.6, 0.65, 0.7, 0.71, 0.66]}, tmp_path / "rho.png", baselines={"SupAP": 0.6})
    assert png_size(path) == expected_pixels(*ANALYSIS_INCHES)
    with pytest.raises(ValueError, match="metrics is empty"):
        plot_sweep("tau", [0.01], {}, tmp_path / "bad.png")
    with pytest.raises(ValueError, match=r"metrics\['R@1'\] has 2 values but there are 3"):
        plot_sweep("tau", [0.01, 0.1, 1.0], {"R@1": [0.5, 0.6]}, tmp_path / "bad.png")


@pytest.mark.parametrize(
    "xs, log_x, scale",
    [([0.1, 0.3, 0.5], None, "linear"), ([1, 10, 100], None, "log"), ([0, 1, 10, 100, 1000], None, "symlog"), ([0.1, 0.2], True, "log")],
)
def test_sweep_axis_scale(xs, log_x, scale):
    ax = new_figure(2, 2).add_subplot()
    _set_scale(ax, [float(v) for v in xs], log_x)
    assert ax.get_xscale() == scale


def test_write_figures_contract(tmp_path):
    x, labels = clusters(8, 6, coarse=2, seed=5)
    history = [{"epoch": e, "recall@1": 0.5 + 0.1 * e, "map@r": 0.2 + 0.05 * e, "loss": 1.0 - 0.1 * e} for e in range(3)]
    kwargs = dict(query_embeddings=x, query_labels=labels, history=history, level_names=("class", "super"), num_queries=3, top_k=4, seed=2, title_note="synthetic")
    paths = write_figures(tmp_path / "a", **kwargs)
    assert [p.name for p in paths] == ["retrieval_grid.png", "pr_curves.png", "embedding_map.png", "training_curves.png"]
    assert png_size(paths[0]) == expected_pixels(CELL_INCHES * 5, CELL_INCHES * 3 + HEADER_INCHES)
    again = write_figures(tmp_path / "b", **kwargs)
    for p, q in zip(paths, again, strict=True):
        np.testing.assert_array_equal(png_pixels(p), png_pixels(q))
    # separate gallery, numpy input, 1-D labels, no history: three figures
    paths = write_figures(tmp_path / "c", query_embeddings=x[:5].numpy(), query_labels=labels[:5, 0].numpy(), ref_embeddings=x[5:], ref_labels=labels[5:, 0], top_k=3)
    assert [p.name for p in paths] == ["retrieval_grid.png", "pr_curves.png", "embedding_map.png"]
    assert all(png_size(p) for p in paths)


def test_write_figures_rejects_empty_and_bad_input(tmp_path):
    with pytest.raises(ValueError, match="query_embeddings has 0 rows"):
        write_figures(tmp_path, query_embeddings=torch.zeros(0, 3), query_labels=torch.zeros(0, dtype=torch.long))
    with pytest.raises(TypeError, match="query_labels must be an integer tensor"):
        write_figures(tmp_path, query_embeddings=torch.ones(4, 3), query_labels=torch.zeros(4))
    with pytest.raises(ValueError, match="unknown similarity"):
        write_figures(tmp_path, query_embeddings=torch.ones(4, 3), query_labels=torch.zeros(4, dtype=torch.long), similarity="l1")
    assert not list(tmp_path.iterdir())


def test_titles_carry_the_data_note():
    assert titled("PR", None) == "PR"
    assert titled("PR", "synthetic") == "PR (synthetic)"
    assert titled("A long title about precision", "Omniglot pixels, synthetic history", max_chars=40) == "A long title about precision\n(Omniglot pixels, synthetic history)"
    assert "\n" not in titled("A long title about precision", "Omniglot pixels, synthetic history", max_chars=None)
