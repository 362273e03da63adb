"""``write_figures``: every figure of a trained model, called at the end of ``rankopt train``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from rankopt.viz._common import ArrayLike, retrieval_inputs
from rankopt.viz.curves import plot_pr_curves, plot_training_curves, precision_recall
from rankopt.viz.embedding_map import MAX_POINTS, plot_embedding_map
from rankopt.viz.retrieval_grid import plot_retrieval_grid

PR_MAX_QUERIES = 2000
"""PR curves average over at most this many queries (drawn with ``seed``): each costs a sort of the gallery."""


def write_figures(
    out_dir: str | Path,
    *,
    query_embeddings: ArrayLike,
    query_labels: ArrayLike,
    ref_embeddings: ArrayLike | None = None,
    ref_labels: ArrayLike | None = None,
    query_paths: Sequence[str] | None = None,
    ref_paths: Sequence[str] | None = None,
    history: Sequence[Mapping[str, object]] | None = None,
    level_names: Sequence[str] | None = None,
    num_queries: int = 8,
    map_points: int = MAX_POINTS,
    top_k: int = 8,
    similarity: str = "cosine",
    seed: int = 0,
    title_note: str | None = None,
) -> list[Path]:
    """Write ``retrieval_grid.png``, ``pr_curves.png``, ``embedding_map.png`` and, when
    ``history`` is given, ``training_curves.png`` into ``out_dir``; return their paths.

    ``ref_embeddings=None``: the queries are the gallery, each excluded from its own
    results by index. The embedding map shows the gallery (t-SNE of at most ``map_points``
    points). ``title_note`` (e.g. ``"synthetic"``) is appended to every title.
    Deterministic given ``seed``.
    """
    data = retrieval_inputs(query_embeddings, query_labels, ref_embeddings, ref_labels, similarity)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    grid = plot_retrieval_grid(
        out / "retrieval_grid.png", query_embeddings, query_labels, ref_embeddings, ref_labels,
        query_paths=query_paths, ref_paths=ref_paths, level_names=level_names, num_queries=num_queries,
        top_k=top_k, similarity=similarity, seed=seed, title_note=title_note,
    )
    curves = precision_recall(
        query_embeddings, query_labels, ref_embeddings, ref_labels,
        similarity=similarity, max_queries=PR_MAX_QUERIES, seed=seed, level_names=level_names,
    )
    paths = [grid.path, plot_pr_curves(curves, out / "pr_curves.png", title_note=title_note)]
    paths.append(
        plot_embedding_map(
            out / "embedding_map.png", data.ref, data.ref_labels,
            level_names=level_names, similarity=similarity, max_points=map_points, seed=seed, title_note=title_note,
        )
    )
    if history:
        paths.append(plot_training_curves(history, out / "training_curves.png", title_note=title_note))
    return paths
