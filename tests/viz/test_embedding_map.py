"""Embedding maps: determinism, subsampling, tiny inputs, cluster preservation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.neighbors import KNeighborsClassifier

from rankopt.viz import embed_2d, plot_embedding_map
from rankopt.viz.embedding_map import MAP_PANEL_INCHES

from .viz_helpers import clusters, expected_pixels, png_pixels, png_size


def test_embed_2d_is_deterministic_given_seed_and_keeps_clusters():
    x, labels = clusters(4, 15, dim=64, noise=0.3, seed=0)
    a, rows_a, method = embed_2d(x, seed=3)
    b, rows_b, _ = embed_2d(x, seed=3)
    assert method == "t-SNE" and a.shape == (60, 2)
    np.testing.assert_array_equal(a, b)
    assert torch.equal(rows_a, torch.arange(60))
    # well separated synthetic clusters stay separated in 2-D: leave-one-out 1-NN is near perfect
    knn = KNeighborsClassifier(n_neighbors=2).fit(a, labels.numpy())
    dist, idx = knn.kneighbors(a)
    assert (labels.numpy()[idx[:, 1]] == labels.numpy()).mean() > 0.95


def test_embed_2d_subsamples_with_seed():
    x, _ = clusters(5, 10, seed=1)
    _, rows0, _ = embed_2d(x, max_points=20, seed=0)
    _, rows0b, _ = embed_2d(x, max_points=20, seed=0)
    _, rows1, _ = embed_2d(x, max_points=20, seed=1)
    assert rows0.numel() == 20 and rows0.unique().numel() == 20
    assert torch.equal(rows0, rows0b) and not torch.equal(rows0, rows1)


@pytest.mark.parametrize("n, dim", [(2, 1), (5, 3)])
def test_embed_2d_tiny_inputs(n, dim):
    coords, rows, method = embed_2d(torch.randn(n, dim), seed=0)
    assert coords.shape == (n, 2) and method == "PCA" and np.isfinite(coords).all()


@pytest.mark.parametrize("x", [torch.randn(1, 8), torch.ones(4, 5), torch.ones(30, 5)])
def test_embed_2d_identical_points_map_to_origin(x):
    """t-SNE's PCA initialisation divides by the spread: identical points must not reach it."""
    coords, _, method = embed_2d(x)
    assert method == "identical points" and coords.shape == (len(x), 2) and not coords.any()


def test_embed_2d_errors():
    with pytest.raises(ValueError, match="embeddings has 0 rows"):
        embed_2d(torch.zeros(0, 4))
    with pytest.raises(TypeError, match="floating"):
        embed_2d(torch.zeros(3, 4, dtype=torch.long))


def test_plot_embedding_map_png_sizes_and_determinism(tmp_path):
    x, labels = clusters(6, 8, coarse=2, seed=2)
    p1 = plot_embedding_map(tmp_path / "a.png", x, labels, level_names=("class", "super"), seed=1, title_note="synthetic")
    p2 = plot_embedding_map(tmp_path / "b.png", x, labels, level_names=("class", "super"), seed=1, title_note="synthetic")
    assert png_size(p1) == expected_pixels(2 * MAP_PANEL_INCHES[0], MAP_PANEL_INCHES[1])
    np.testing.assert_array_equal(png_pixels(p1), png_pixels(p2))
    single = plot_embedding_map(tmp_path / "c.png", x[:8], torch.zeros(8, dtype=torch.long))  # one class, one level
    assert png_size(single) == expected_pixels(*MAP_PANEL_INCHES)
    with pytest.raises(ValueError, match="labels has 7 rows"):
        plot_embedding_map(tmp_path / "d.png", x[:8], labels[:7])
