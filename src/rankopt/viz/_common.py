"""Shared plumbing of the figures: validated retrieval inputs, chunked query-vs-gallery
scores with self-exclusion by index, framed image cells and headless figure saving
(thumbnails and relevance colours: :mod:`rankopt.viz.pictures`).

Figures are built with :class:`matplotlib.figure.Figure` directly (no ``pyplot``), so
nothing touches the global backend: rendering is Agg, headless and thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from rankopt import checks, similarity as sim
from rankopt.labels import relevance_levels
from rankopt.metrics import topk

DPI = 100
"""Every PNG is written at this resolution, so its size in pixels is ``figsize * DPI``."""

_CHUNK_ELEMENTS = 1 << 22
"""At most this many query-reference scores are held at once (16 MiB of float32)."""

ArrayLike = torch.Tensor | np.ndarray


def as_tensor(x: ArrayLike | None, name: str) -> torch.Tensor | None:
    """Accept numpy arrays as well as tensors (rankopt's checks then validate them)."""
    if x is None or isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray):
        return torch.from_numpy(x)
    raise TypeError(f"{name} must be a torch.Tensor or numpy array, got {type(x).__name__}")


@dataclass(frozen=True)
class RetrievalInputs:
    """Validated query and gallery; ``same_set`` when the queries are the gallery."""

    query: torch.Tensor
    query_labels: torch.Tensor
    ref: torch.Tensor
    ref_labels: torch.Tensor
    same_set: bool
    similarity: str

    @property
    def num_levels(self) -> int:
        return int(self.query_labels.shape[1])


def retrieval_inputs(
    query_embeddings: ArrayLike,
    query_labels: ArrayLike,
    ref_embeddings: ArrayLike | None = None,
    ref_labels: ArrayLike | None = None,
    similarity: str = "cosine",
) -> RetrievalInputs:
    """Check shapes, dtypes and finiteness; ``ref_embeddings=None`` means self-retrieval,
    which needs at least two items (every query is excluded from its own results)."""
    same_set = ref_embeddings is None
    if same_set and ref_labels is not None:
        raise ValueError("ref_labels given without ref_embeddings")
    q = checks.check_embeddings(as_tensor(query_embeddings, "query_embeddings"), "query_embeddings",
                                min_rows=2 if same_set else 1)
    ql = checks.check_labels(as_tensor(query_labels, "query_labels"), q.shape[0], "query_labels")
    if same_set:
        r, rl = q, ql
    else:
        if ref_labels is None:
            raise ValueError("ref_embeddings given without ref_labels")
        r = checks.check_embeddings(as_tensor(ref_embeddings, "ref_embeddings"), "ref_embeddings")
        rl = checks.check_labels(as_tensor(ref_labels, "ref_labels"), r.shape[0], "ref_labels")
        if r.shape[1] != q.shape[1]:
            raise ValueError(f"ref_embeddings have dimension {r.shape[1]} but query_embeddings have {q.shape[1]}")
        if rl.shape[1] != ql.shape[1]:
            raise ValueError(f"ref_labels have {rl.shape[1]} levels but query_labels have {ql.shape[1]}")
    q = sim.prepare(q.detach().float().cpu(), similarity)
    r = q if same_set else sim.prepare(r.detach().float().cpu(), similarity)
    return RetrievalInputs(q, ql.cpu(), r, rl.cpu(), same_set, similarity)


def score_chunks(data: RetrievalInputs, query_indices: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Yield ``(scores, levels)`` for consecutive blocks of the selected queries.

    The exact chunked search of :func:`rankopt.metrics.topk.score_chunks`: ``scores`` is
    ``(q, R)`` with ``-inf`` at the query itself (same-set case, excluded by index), ``levels``
    the shared hierarchy levels (``0`` at the query itself). Never more than
    ``_CHUNK_ELEMENTS`` scores are materialised at once.
    """
    num_refs = data.ref.shape[0]
    exclude = query_indices if data.same_set else None
    chunks = topk.score_chunks(data.query[query_indices], data.ref, similarity=data.similarity,
                                 chunk_size=max(1, _CHUNK_ELEMENTS // num_refs), exclude=exclude)
    for start, scores in chunks:
        rows = query_indices[start : start + scores.shape[0]]
        levels = relevance_levels(data.query_labels[rows], data.ref_labels)
        if data.same_set:
            levels[torch.arange(rows.numel()), rows] = 0
        yield scores, levels


def sample_indices(n: int, k: int | None, seed: int) -> torch.Tensor:
    """``min(n, k)`` sorted distinct indices of ``range(n)`` drawn with ``seed`` (all when ``k`` is None)."""
    if k is None or k >= n:
        return torch.arange(n)
    gen = torch.Generator().manual_seed(seed)
    return torch.randperm(n, generator=gen)[:k].sort().values


def draw_cell(ax: Axes, image: np.ndarray | None, colour: tuple[float, ...], title: str, *,
              text: str = "", fill: tuple[float, ...] | None = None, linewidth: float = 4.0) -> None:
    """One grid cell framed in ``colour`` (a ``linewidth``-point line): ``image``, or ``text`` on ``fill``
    (default: ``colour``, light)."""
    if image is not None:
        ax.imshow(image, interpolation="nearest")
    else:
        ax.set_facecolor(fill if fill is not None else (*colour[:3], 0.35))
        ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=8, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_color(colour)
        spine.set_linewidth(linewidth)
    ax.set_title(title, fontsize=7, pad=2)


def titled(text: str, title_note: str | None, max_chars: int | None = 60) -> str:
    """Append the data description (e.g. ``"synthetic"``) to a title, on a second line when
    the result would exceed ``max_chars`` (never when ``None``)."""
    if not title_note:
        return text
    one_line = f"{text} ({title_note})"
    return one_line if max_chars is None or len(one_line) <= max_chars else f"{text}\n({title_note})"


MIN_CURVE_POINTS = 4
"""A learning curve with fewer evaluations than this gets a note in its panel (two points joined by a line
say nothing of the path between them)."""


def note_few_points(ax: Axes, points: int) -> str | None:
    """Add "only N point(s) per curve" under the x label of ``ax`` (set it first) when its sparsest curve has
    fewer than :data:`MIN_CURVE_POINTS` measured points (evaluations, drawn as markers); returns the note, or None."""
    if points >= MIN_CURVE_POINTS:
        return None
    text = f"only {points} point{'s' if points != 1 else ''} per curve (markers): lines join them"
    ax.set_xlabel(f"{ax.get_xlabel()}\n{text}")
    return text


def new_figure(width: float, height: float) -> Figure:
    return Figure(figsize=(width, height), dpi=DPI)


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as a PNG of exactly ``figsize * DPI`` pixels; create parent folders."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, format="png")
    return out
