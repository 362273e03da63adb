"""2-D maps of an embedding space (t-SNE, as in TPAMI Fig. 9a-b), coloured by class."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from matplotlib import colormaps

from rankopt import checks, similarity as sim
from rankopt.viz._common import ArrayLike, as_tensor, new_figure, sample_indices, save_figure, titled
from rankopt.viz.pictures import column_name

MAP_PANEL_INCHES = (6.0, 5.5)
"""One panel per label level shown: the finest, plus the coarsest when ``L > 1``."""
MAX_POINTS = 5000
_MIN_TSNE_POINTS = 10
_PCA_DIMS = 50
_MAX_LEGEND = 20


def embed_2d(
    embeddings: ArrayLike, *, similarity: str = "cosine", max_points: int | None = MAX_POINTS, seed: int = 0
) -> tuple[np.ndarray, torch.Tensor, str]:
    """2-D coordinates of (a seeded subsample of at most ``max_points``) embeddings.

    Embeddings are prepared for ``similarity`` (L2-normalised for cosine), reduced to
    50 dimensions by PCA, then mapped by t-SNE (perplexity ``min(30, (n-1)/3)``, PCA
    init, ``random_state=seed``); fewer than 10 points are mapped by PCA alone, identical
    points (or a single one) to the origin.
    Returns ``(coords (n, 2), row indices (n,), method name)``; deterministic given ``seed``.
    """
    from sklearn.decomposition import PCA  # scikit-learn takes seconds to import: loaded when a map is drawn
    from sklearn.manifold import TSNE
    from threadpoolctl import threadpool_limits

    x = checks.check_embeddings(as_tensor(embeddings, "embeddings"), "embeddings")
    rows = sample_indices(x.shape[0], max_points, seed)
    feats = sim.prepare(x[rows].detach().float().cpu(), similarity).numpy().astype(np.float64)
    n, dim = feats.shape
    if not np.ptp(feats, axis=0).any():  # one point, or all identical: t-SNE's PCA init would divide by 0
        return np.zeros((n, 2)), rows, "identical points"
    if n < _MIN_TSNE_POINTS:
        coords = np.zeros((n, 2))
        k = min(2, dim)
        coords[:, :k] = PCA(n_components=k, random_state=seed).fit_transform(feats)
        return coords, rows, "PCA"
    if dim > _PCA_DIMS:
        feats = PCA(n_components=min(_PCA_DIMS, n), random_state=seed).fit_transform(feats)
    tsne = TSNE(n_components=2, perplexity=min(30.0, (n - 1) / 3), init="pca", learning_rate="auto", random_state=seed)
    # torch and scikit-learn each ship an OpenMP runtime; their spinning threads starve each
    # other on a machine with few cores, so t-SNE runs on one OpenMP thread.
    with threadpool_limits(limits=1, user_api="openmp"):
        return tsne.fit_transform(feats), rows, "t-SNE"


def _class_colours(labels: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``(classes, (C, 4) RGBA)``: ``tab10``/``tab20`` for few classes, else ``turbo`` in a seeded random order."""
    classes = np.unique(labels)
    c = classes.size
    if c <= _MAX_LEGEND:
        cmap = colormaps["tab10" if c <= 10 else "tab20"]
        return classes, cmap(np.arange(c))
    order = np.random.default_rng(seed).permutation(c)
    return classes, colormaps["turbo"](order / max(c - 1, 1))


def plot_embedding_map(
    out_path: str | Path,
    embeddings: ArrayLike,
    labels: ArrayLike,
    *,
    level_names: Sequence[str] | None = None,
    similarity: str = "cosine",
    max_points: int | None = MAX_POINTS,
    seed: int = 0,
    title_note: str | None = None,
) -> Path:
    """Scatter :func:`embed_2d` coordinates coloured by the finest class and, when the
    labels have ``L > 1`` levels, a second panel coloured by the coarsest class."""
    x = checks.check_embeddings(as_tensor(embeddings, "embeddings"), "embeddings")
    lab = checks.check_labels(as_tensor(labels, "labels"), x.shape[0], "labels").numpy()
    coords, rows, method = embed_2d(x, similarity=similarity, max_points=max_points, seed=seed)
    lab = lab[rows.numpy()]
    columns = [0] if lab.shape[1] == 1 else [0, lab.shape[1] - 1]
    fig = new_figure(MAP_PANEL_INCHES[0] * len(columns), MAP_PANEL_INCHES[1])
    size = float(np.clip(3000 / len(coords), 2, 30))
    shown = f"{len(coords)} of {x.shape[0]} points" if len(coords) < x.shape[0] else f"{len(coords)} points"
    for ax, column in zip(fig.subplots(1, len(columns), squeeze=False)[0], columns, strict=True):
        name = column_name(column, level_names)
        classes, colours = _class_colours(lab[:, column], seed)
        colour_of = colours[np.searchsorted(classes, lab[:, column])]
        ax.scatter(coords[:, 0], coords[:, 1], c=colour_of, s=size, linewidths=0)
        if classes.size <= _MAX_LEGEND:
            for cls, colour in zip(classes, colours, strict=True):
                ax.scatter([], [], color=colour, s=20, label=f"{name} = {cls}")
            ax.legend(fontsize=7, loc="best", markerscale=1.0, ncol=2 if classes.size > 10 else 1)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(titled(f"{method} of {shown}, colour = {name} ({classes.size})", title_note), fontsize=9)
    fig.tight_layout()
    return save_figure(fig, out_path)
