"""Retrieval grids: each row is a query followed by its top-k results, every result
framed in the colour of its relevance level (number of shared hierarchy levels: green =
same finest class, orange = same coarser label only, red = unrelated),
as in the qualitative figures of ROADMAP (Fig. 16) and TPAMI (Figs. 9c-d, 15)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from rankopt.viz._common import (
    ArrayLike,
    RetrievalInputs,
    draw_cell,
    new_figure,
    retrieval_inputs,
    sample_indices,
    save_figure,
    score_chunks,
    titled,
)
from rankopt.viz.pictures import level_colour, relevance_legend, thumbnail

CELL_INCHES = 1.4
"""Width and height of one grid cell; the figure is ``CELL*(k+1)`` by ``CELL*rows + HEADER``."""
HEADER_INCHES = 0.8


@dataclass(frozen=True)
class Neighbours:
    """Top-k results of some queries: ``(Q,)`` query rows and ``(Q, k)`` indices, scores, levels."""

    query_indices: torch.Tensor
    indices: torch.Tensor
    scores: torch.Tensor
    levels: torch.Tensor


@dataclass(frozen=True)
class RetrievalGrid:
    """What :func:`plot_retrieval_grid` drew and where."""

    path: Path
    neighbours: Neighbours


def _top_k(data: RetrievalInputs, query_indices: torch.Tensor, top_k: int) -> Neighbours:
    """Exact top-k, chunked over queries. Order: decreasing score, ties by increasing reference index."""
    k = min(top_k, data.ref.shape[0] - int(data.same_set))
    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    for scores, levels in score_chunks(data, query_indices):
        order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
        parts.append((order, scores.gather(1, order), levels.gather(1, order)))
    idx, sc, lv = (torch.cat(p) for p in zip(*parts, strict=True))
    return Neighbours(query_indices, idx, sc, lv)


def _pick_queries(data: RetrievalInputs, num_queries: int, seed: int) -> torch.Tensor:
    """``num_queries`` query rows drawn with ``seed``, among those with a same-class item in the gallery if any."""
    fine_q, fine_r = data.query_labels[:, 0], data.ref_labels[:, 0]
    classes, counts = torch.unique(fine_r, return_counts=True)
    needed = 2 if data.same_set else 1
    has_positive = torch.isin(fine_q, classes[counts >= needed])
    candidates = has_positive.nonzero().flatten() if bool(has_positive.any()) else torch.arange(fine_q.numel())
    return candidates[sample_indices(candidates.numel(), num_queries, seed)]


def retrieval_neighbours(
    query_embeddings: ArrayLike,
    query_labels: ArrayLike,
    ref_embeddings: ArrayLike | None = None,
    ref_labels: ArrayLike | None = None,
    *,
    query_indices: Sequence[int] | torch.Tensor | None = None,
    top_k: int = 8,
    similarity: str = "cosine",
) -> Neighbours:
    """Exact top-``k`` references of each query (all queries unless ``query_indices``).

    With ``ref_embeddings=None`` the queries are the gallery and each query is excluded
    from its own results by index. Results are ordered by decreasing similarity, equal
    scores by increasing reference index; ``k`` is clipped to the gallery size.
    ``levels`` is the number of hierarchy levels each result shares with its query.
    """
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    data = retrieval_inputs(query_embeddings, query_labels, ref_embeddings, ref_labels, similarity)
    n = data.query.shape[0]
    rows = torch.arange(n) if query_indices is None else torch.as_tensor(query_indices, dtype=torch.long).flatten()
    if rows.numel() == 0 or int(rows.min()) < 0 or int(rows.max()) >= n:
        raise ValueError(f"query_indices must be non-empty and lie in [0, {n}), got {rows.tolist()[:5]}")
    return _top_k(data, rows, top_k)


def _check_paths(paths: Sequence[str] | None, n: int, name: str) -> Sequence[str] | None:
    if paths is not None and len(paths) != n:
        raise ValueError(f"{name} has {len(paths)} entries but there are {n} embeddings")
    return paths


def plot_retrieval_grid(
    out_path: str | Path,
    query_embeddings: ArrayLike,
    query_labels: ArrayLike,
    ref_embeddings: ArrayLike | None = None,
    ref_labels: ArrayLike | None = None,
    *,
    query_paths: Sequence[str] | None = None,
    ref_paths: Sequence[str] | None = None,
    level_names: Sequence[str] | None = None,
    num_queries: int = 8,
    top_k: int = 8,
    similarity: str = "cosine",
    seed: int = 0,
    title_note: str | None = None,
) -> RetrievalGrid:
    """Draw ``num_queries`` queries (drawn with ``seed``) and their top-``k`` results.

    Cells show image thumbnails when paths are given, otherwise a cell coloured by
    relevance with the score and fine label. Frames: green = same finest class, orange =
    shares only a coarser level (darker when it shares more levels), red = unrelated.
    """
    if num_queries < 1 or top_k < 1:
        raise ValueError(f"num_queries and top_k must be >= 1, got {num_queries} and {top_k}")
    data = retrieval_inputs(query_embeddings, query_labels, ref_embeddings, ref_labels, similarity)
    query_paths = _check_paths(query_paths, data.query.shape[0], "query_paths")
    ref_paths = query_paths if data.same_set else _check_paths(ref_paths, data.ref.shape[0], "ref_paths")
    nb = _top_k(data, _pick_queries(data, num_queries, seed), top_k)
    rows, k, num_levels = nb.indices.shape[0], nb.indices.shape[1], data.num_levels

    fig = new_figure(CELL_INCHES * (k + 1), CELL_INCHES * rows + HEADER_INCHES)
    axes = fig.subplots(rows, k + 1, squeeze=False)
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=1 - HEADER_INCHES / fig.get_figheight(), wspace=0.08,
                        hspace=0.3)
    grey = (0.5, 0.5, 0.5, 1.0)
    for r in range(rows):
        q = int(nb.query_indices[r])
        q_label = int(data.query_labels[q, 0])
        draw_cell(axes[r, 0], thumbnail(query_paths[q]) if query_paths else None, grey, f"query {q} (class {q_label})",
                  text=f"class {q_label}")
        for c in range(k):
            j, level = int(nb.indices[r, c]), int(nb.levels[r, c])
            text = f"s={float(nb.scores[r, c]):.3f}\nclass {int(data.ref_labels[j, 0])}"
            draw_cell(axes[r, c + 1], thumbnail(ref_paths[j]) if ref_paths else None, level_colour(level, num_levels),
                      f"#{c + 1}  s={float(nb.scores[r, c]):.2f}", text=text)
    handles = relevance_legend(num_levels, level_names)
    legend_top = 1 - 0.3 / fig.get_figheight()
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, legend_top), ncol=len(handles), fontsize=7,
               frameon=False)
    gallery = "query set, self excluded" if data.same_set else f"gallery of {data.ref.shape[0]}"
    fig.suptitle(titled(f"Top-{k} retrieval ({gallery}, {data.similarity})", title_note, max_chars=None), x=0.01,
                 y=0.995, ha="left", va="top", fontsize=9)
    return RetrievalGrid(save_figure(fig, out_path), nb)
