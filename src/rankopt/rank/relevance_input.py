"""How the relevance of item ``j`` to query ``i`` is given, beyond one class label per item.

Relevance is an integer *grade* ``g_ij in {0, ..., G}`` (0: not relevant), the level ``l`` of the
hierarchical metrics and losses (TPAMI Eq. 20, 23: ``rel(k) = (g/G)^alpha / |Omega^(g)|``, NDCG gain
``2^g - 1``); binary metrics and flat losses take ``g_ij > 0`` as positive. :class:`Relevance` is built from

* class labels ``(N,)``/``(N, L)``: ``g_ij`` = shared label columns (:func:`rankopt.labels.relevance_levels`), ``G = L``;
* a 0/1 multi-label matrix ``(N, C)``: ``g_ij = 1[sum_c y_ic y_jc > 0]`` (``G = 1``) or, graded,
  ``g_ij = sum_c y_ic y_jc`` (``G`` = the most labels an item has);
* a dense or sparse ``(Q, N)`` tensor of grades, or a function ``(query_rows, item_rows) -> (q, n)`` grades.

:meth:`Relevance.block` serves the ``(q, n)`` grades of any rows, so the full matrix is never needed.
Excluding the query's own item stays the caller's job, by index, as for labels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rankopt.labels import relevance_levels

GradeFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``fn(query_rows, item_rows) -> (q, n)`` grades: rows are int64 index tensors."""


@dataclass(frozen=True)
class Relevance:
    """The grade ``g_ij in {0, ..., grades}`` of item ``j`` for query ``i``, ``num_queries x num_items``."""

    num_queries: int
    num_items: int
    grades: int
    kind: str  # "labels", "multilabel", "graded multilabel", "matrix", "function"
    _block: GradeFunction = field(repr=False, compare=False)

    @classmethod
    def labels(cls, query_labels: torch.Tensor, item_labels: torch.Tensor | None = None) -> Relevance:
        """Class labels (the default relevance): ``g_ij`` = shared label columns, ``G = L``."""
        q = _as_matrix(query_labels, "query_labels", integer=True)
        items = q if item_labels is None else _as_matrix(item_labels, "item_labels", integer=True)
        if items.shape[1] != q.shape[1]:
            raise ValueError(f"query labels have {q.shape[1]} levels but item labels have {items.shape[1]}")
        return cls(q.shape[0], items.shape[0], q.shape[1], "labels",
                   lambda rows, cols: relevance_levels(q[rows.to(q.device)], items[cols.to(q.device)]))

    @classmethod
    def multilabel(cls, query_matrix: torch.Tensor, item_matrix: torch.Tensor | None = None, *,
                   graded: bool = False, grades: int | None = None) -> Relevance:
        """Multi-hot ``(Q, C)``/``(N, C)`` 0/1 matrices (bool, int or float; ``item_matrix=None``: the queries'):
        any shared label is relevant (``graded=False``), or the number shared is the grade. ``grades`` (graded only;
        default: the most labels an item of these matrices has) fixes ``G``, e.g. a whole training set's for its
        batches, so that a grade weighs the same in every batch."""
        q = _multi_hot(query_matrix, "query_matrix")
        items = q if item_matrix is None else _multi_hot(item_matrix, "item_matrix")
        if items.shape[1] != q.shape[1]:
            raise ValueError(f"query_matrix has {q.shape[1]} label columns but item_matrix has {items.shape[1]}")
        if grades is not None and not graded:
            raise ValueError("grades= goes with graded=True (binary multi-label relevance has one grade)")
        most = min(int(q.sum(1).max()), int(items.sum(1).max())) if q.numel() and items.numel() else 0

        def shared(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
            counts = q[rows.to(q.device)].double() @ items[cols.to(q.device)].double().T  # exact integers
            return counts.long() if graded else (counts > 0).long()

        return cls(q.shape[0], items.shape[0], _grade_count(most, grades) if graded else 1,
                   "graded multilabel" if graded else "multilabel", shared)

    @classmethod
    def matrix(cls, values: torch.Tensor, *, grades: int | None = None) -> Relevance:
        """A dense or sparse (COO/CSR) ``(Q, N)`` tensor of non-negative integer grades (floats with integer
        values accepted); ``grades`` (default: the largest value, at least 1) is ``G``."""
        if not isinstance(values, torch.Tensor):
            raise TypeError(f"relevance matrix must be a torch.Tensor (dense or sparse), got {type(values).__name__}")
        if values.ndim != 2:
            raise ValueError(f"relevance matrix must have shape (Q, N) (queries x items), got {tuple(values.shape)}")
        if values.layout != torch.strided:
            values = values.to_sparse_coo().coalesce()
            stored = values.values()
        else:
            stored = values
        top = _check_grades(stored, "relevance matrix")
        grades = _grade_count(top, grades)

        def block(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
            picked = values.index_select(0, rows.to(values.device))
            picked = picked.to_dense() if picked.layout != torch.strided else picked
            return picked.index_select(1, cols.to(values.device)).long()

        return cls(values.shape[0], values.shape[1], grades, "matrix", block)

    @classmethod
    def function(cls, fn: GradeFunction, num_queries: int, num_items: int, *, grades: int = 1) -> Relevance:
        """``fn(query_rows, item_rows) -> (q, n)`` grades in ``[0, grades]``, checked on every block."""
        if not callable(fn):
            raise TypeError(f"relevance function must be callable, got {type(fn).__name__}")

        def block(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
            out = torch.as_tensor(fn(rows, cols))
            if tuple(out.shape) != (rows.numel(), cols.numel()):
                raise ValueError(f"relevance function returned shape {tuple(out.shape)} for {rows.numel()} query rows "
                                 f"and {cols.numel()} item rows; expected ({rows.numel()}, {cols.numel()})")
            if _check_grades(out, "relevance function's block") > grades:
                raise ValueError(f"relevance function returned grades above grades={grades}")
            return out.long()

        return cls(int(num_queries), int(num_items), _grade_count(0, grades), "function", block)

    def block(self, query_rows: torch.Tensor | slice, item_rows: torch.Tensor | slice | None = None) -> torch.Tensor:
        """``(q, n)`` int64 grades of the query rows against the item rows (index tensors or slices; ``None``: all)."""
        rows = _indices(query_rows, self.num_queries)
        cols = _indices(slice(None) if item_rows is None else item_rows, self.num_items)
        return self._block(rows, cols)

    def check_shape(self, num_queries: int, num_items: int, what: str) -> Relevance:
        """``self`` if it is ``num_queries x num_items`` (``what`` names both sets in the error)."""
        if (self.num_queries, self.num_items) != (num_queries, num_items):
            raise ValueError(f"relevance is {self.num_queries} x {self.num_items} ({self.kind}) but {what} need "
                             f"{num_queries} x {num_items}")
        return self


RELEVANCE_LOSSES = ("sup_ap", "smooth_ap", "hap", "sup_ndcg")
"""The losses that take a :class:`Relevance` instead of class labels."""


def require_class_labels(labels: object, what: str) -> None:
    """A ``TypeError`` naming ``what`` when ``labels`` is a :class:`Relevance`: proxies, classifiers, pairs and
    combinations need class labels."""
    if isinstance(labels, Relevance):
        raise TypeError(f"{what} takes class labels, not a Relevance (the losses that do: {', '.join(RELEVANCE_LOSSES)})")


def _indices(rows: torch.Tensor | slice, size: int) -> torch.Tensor:
    if isinstance(rows, slice):
        return torch.arange(size)[rows]
    return rows.long()


def _as_matrix(x: torch.Tensor, name: str, *, integer: bool) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if integer and (x.dtype.is_floating_point or x.dtype == torch.bool):
        raise TypeError(f"{name} must be an integer tensor, got {x.dtype}")
    x = x.unsqueeze(1) if x.ndim == 1 and integer else x
    if x.ndim != 2:
        raise ValueError(f"{name} must have shape (N, C), got {tuple(x.shape)}")
    return x.long() if integer else x


def _multi_hot(x: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` as a ``(N, C)`` uint8 0/1 matrix, or an error naming the bad rows."""
    x = _as_matrix(x, name, integer=False)
    bad = ((x != 0) & (x != 1)).any(dim=1).nonzero().flatten()
    if bad.numel():
        raise ValueError(f"{name} must be a 0/1 multi-hot (N, C) matrix; rows {bad[:5].tolist()} hold other values")
    return x.to(torch.uint8)


def _check_grades(values: torch.Tensor, name: str) -> int:
    """The largest grade of ``values`` (0 when empty), after checking they are finite non-negative integers."""
    if values.dtype.is_complex:
        raise TypeError(f"{name} must hold real grades, got {values.dtype}")
    if values.numel() == 0:
        return 0
    v = values.double()
    if not bool(torch.isfinite(v).all()) or bool((v < 0).any()) or bool((v != v.round()).any()):
        raise ValueError(f"{name} must hold non-negative integer grades (0: not relevant), got values such as "
                         f"{v[(v < 0) | (v != v.round()) | ~torch.isfinite(v)][:3].tolist()}")
    return int(v.max())


def _grade_count(top: int, grades: int | None) -> int:
    """``G``: ``grades`` if given (at least the largest value ``top``), else ``max(top, 1)``."""
    if grades is None:
        return max(top, 1)
    if int(grades) < max(top, 1):
        raise ValueError(f"grades={grades} is below the largest grade {top} (and must be >= 1)")
    return int(grades)
