"""The shared base of every rankopt loss: validation, retrieval set, chunking.

:class:`RankLoss` turns ``(embeddings, labels, ref_embeddings, ref_labels)`` into a
:class:`RetrievalSet` (float32 scores of each batch query against the batch plus the
reference set, relevance levels, and the membership mask that removes each query
from its own retrieval set *by index*), then calls the loss's :meth:`RankLoss.compute`.

Most rank losses are *row-local*: query ``i``'s term depends only on row ``i`` of the
score matrix. :func:`rowwise` evaluates such a term in chunks of queries under a
memory budget (``max_elements`` per chunk) and keeps only the ``(B, M)`` gradient
w.r.t. the scores, never the autograd graph of the whole batch; :func:`rowwise_with_gradient`
does the same for a term that writes its own gradient (recomputed in the backward, nothing kept).
A combination (:class:`~rankopt.losses.combination.ROD`) builds one :class:`RetrievalSet` for all
its terms when they can share it (:meth:`RankLoss.can_share`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import nn

from rankopt import checks
from rankopt import similarity as sim
from rankopt.labels import same_class, self_mask
from rankopt.rank.relevance_input import Relevance, require_class_labels
from rankopt.rank.surrogates import row_counts

DEFAULT_MAX_ELEMENTS = 1 << 24
"""Default memory budget of :func:`rowwise`: elements of the largest per-chunk intermediate."""


@dataclass
class RetrievalSet:
    """What a loss sees for a batch of ``B`` queries and a retrieval set of ``M`` items.

    The retrieval set is the batch followed by the reference set (``M = B + R``);
    query ``i`` is item ``i``.
    """

    scores: torch.Tensor
    """``(B, M)`` float32 (float64 for float64 inputs) similarities (differentiable)."""
    levels: torch.Tensor
    """``(B, M)`` int8 shared hierarchy levels in ``[0, L]`` (``0`` = negative)."""
    valid: torch.Tensor
    """``(B, M)`` bool, membership of item ``j`` in query ``i``'s retrieval set."""
    num_levels: int
    """``L``: 1 for flat labels."""
    embeddings: torch.Tensor
    """``(B, D)`` query embeddings in the compute dtype (not normalised)."""
    labels: torch.Tensor
    """``(B, L)`` int64 query labels."""

    @property
    def positives(self) -> torch.Tensor:
        """``(B, M)`` bool: valid items sharing at least one level with the query."""
        return (self.levels > 0) & self.valid

    @cached_property
    def num_positives(self) -> torch.Tensor:
        """``(B,)`` int64 ``|P_i|`` (computed once, shared by the terms of a combination)."""
        return row_counts(self.positives)

    @cached_property
    def num_members(self) -> torch.Tensor:
        """``(B,)`` int64 ``|Omega_i|``: the size of each query's retrieval set."""
        return row_counts(self.valid)


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for float32 and lower precisions (bf16/fp16), float64 for float64 inputs."""
    return torch.promote_types(x.dtype, torch.float32)


def chunk_rows(max_elements: int, elements_per_row: int) -> int:
    """Rows per chunk under a budget of ``max_elements``: ``max(1, max_elements // elements_per_row)``."""
    return max(1, max_elements // max(1, elements_per_row))


class _CachedRowGrad(torch.autograd.Function):
    """Output ``values``; backward ``grad_out[:, None] * row_grads`` (row-local terms only)."""

    @staticmethod
    def forward(ctx, scores: torch.Tensor, values: torch.Tensor,  # type: ignore[override]
                row_grads: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(row_grads)
        return values.clone()

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        (row_grads,) = ctx.saved_tensors
        return grad_out.unsqueeze(1) * row_grads, None, None


def rowwise(
    fn: Callable[..., torch.Tensor],
    scores: torch.Tensor,
    *row_args: torch.Tensor,
    elements_per_row: int,
    max_elements: int = DEFAULT_MAX_ELEMENTS,
) -> torch.Tensor:
    """Evaluate a row-local per-query term ``fn(scores[c], *[a[c] for a in row_args]) -> (C,)``
    over chunks ``c`` of at most ``max_elements // elements_per_row`` queries.

    Each chunk is differentiated on the spot and only ``d fn_i / d scores_i`` (``(B, M)``)
    is kept, so peak memory is one chunk's autograd graph whatever the batch size.
    ``fn`` must make row ``i`` of its output depend on row ``i`` of the scores only. The
    gradient is computed during the forward when the scores require it (first order only).
    """
    num_rows = scores.shape[0]
    chunk = chunk_rows(max_elements, elements_per_row)
    need_grad = scores.requires_grad and torch.is_grad_enabled()
    values = []
    single = chunk >= num_rows
    grads = torch.empty_like(scores) if need_grad and not single else None  # every row is written below
    for start in range(0, num_rows, chunk):
        rows = slice(start, start + chunk)
        args = [a[rows] for a in row_args]
        block = scores[rows].detach()
        if not need_grad:
            with torch.no_grad():
                values.append(fn(block, *args))
            continue
        block.requires_grad_(True)
        with torch.enable_grad():
            out = fn(block, *args)
            (grad,) = torch.autograd.grad(out.sum(), block, allow_unused=True)
        values.append(out.detach())
        if grad is None:
            grad = torch.zeros_like(block)
        if single:
            grads = grad
        else:
            grads[rows] = grad
    out = torch.cat(values) if values else scores.new_zeros(0)
    if not need_grad:
        return out
    return _CachedRowGrad.apply(scores, out, grads)


class _RecomputedRowGrad(torch.autograd.Function):
    """Output ``fn(scores[c], ..., gradient=False)`` chunk by chunk; backward
    ``grad_out[c, None] * fn(..., gradient=True)`` recomputed chunk by chunk into the one ``(B, M)`` gradient (nothing
    ``(B, M)`` kept between the passes)."""

    @staticmethod
    def forward(ctx, scores: torch.Tensor, fn: Callable[..., torch.Tensor], rows: int,  # type: ignore[override]
                *row_args: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(scores, *row_args)
        ctx.fn, ctx.rows = fn, rows
        chunks = [slice(first, first + rows) for first in range(0, scores.shape[0], rows)]
        values = [fn(scores[c], *[a[c] for a in row_args], gradient=False) for c in chunks]
        return torch.cat(values) if values else scores.new_zeros(0)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # type: ignore[override]
        scores, *row_args = ctx.saved_tensors
        grad = torch.empty_like(scores)
        for first in range(0, scores.shape[0], ctx.rows):
            c = slice(first, first + ctx.rows)
            torch.mul(grad_out[c].unsqueeze(1), ctx.fn(scores[c], *[a[c] for a in row_args], gradient=True),
                      out=grad[c])
        return (grad, None, None, *[None] * len(row_args))


def rowwise_with_gradient(fn: Callable[..., torch.Tensor], scores: torch.Tensor, *row_args: torch.Tensor,
                          rows: int) -> torch.Tensor:
    """:func:`rowwise` for a term that writes its own gradient: ``fn(scores[c], *[a[c] for a in row_args],
    gradient=False) -> (C,)`` values and ``fn(..., gradient=True) -> (C, M)`` the derivative of row ``i``'s value
    w.r.t. row ``i`` of the scores, over chunks of ``rows`` queries. The values are computed in the forward,
    the gradient chunk by chunk in the backward, straight into the ``(B, M)`` gradient of the scores."""
    return _RecomputedRowGrad.apply(scores, fn, max(1, rows), *row_args)


class RankLoss(nn.Module):
    """Base class of every rankopt loss: ``loss(embeddings, labels, ref_embeddings=None, ref_labels=None)``.

    * Each batch item is a query; its retrieval set is the rest of the batch plus the
      reference set (memory bank, other ranks' embeddings). ``include_self=True``
      keeps the query in its own retrieval set as a rank-1 positive, the convention
      of the reference code (anchors §0.1), for comparison only.
    * Computes in float32 with autocast disabled, whatever the input dtype (float64
      inputs compute in float64, which the exactness tests use).
    * Flat losses (``hierarchical = False``) use label column 0 (finest level).
    * Queries without a positive are excluded from the mean and counted in
      ``last_num_queries_without_positive``.
    * ``labels`` may instead be a :class:`~rankopt.rank.Relevance` of ``B x M`` (each batch query against the
      retrieval set: the batch followed by the reference set, ``ref_labels=None``) for the losses with
      ``accepts_relevance``: its grades are the levels (flat losses: ``grade > 0`` is positive).
    """

    accepts_reference: bool = True
    """Whether a memory bank / other ranks' embeddings may be passed as the reference set."""
    hierarchical: bool = False
    """Whether 2-D labels are used as a hierarchy (else column 0 only)."""
    accepts_relevance: bool = False
    """Whether a :class:`~rankopt.rank.Relevance` may replace the labels (multi-label items, a grade matrix)."""

    def __init__(
        self,
        *,
        similarity: str = "cosine",
        include_self: bool = False,
        max_elements: int = DEFAULT_MAX_ELEMENTS,
    ) -> None:
        super().__init__()
        if similarity not in sim.SIMILARITIES:
            raise ValueError(f"unknown similarity {similarity!r}; use one of {', '.join(sim.SIMILARITIES)}")
        if max_elements < 1:
            raise ValueError(f"max_elements must be >= 1, got {max_elements}")
        self.similarity = similarity
        self.include_self = include_self
        self.max_elements = int(max_elements)
        self.last_num_queries_without_positive = 0

    def forward(self, embeddings: torch.Tensor, labels: torch.Tensor | Relevance,
                ref_embeddings: torch.Tensor | None = None, ref_labels: torch.Tensor | None = None) -> torch.Tensor:
        batch = self.retrieval_set(embeddings, labels, ref_embeddings, ref_labels)
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            return self.compute(batch)

    def validate(self, embeddings: torch.Tensor, labels: torch.Tensor, ref_embeddings: torch.Tensor | None = None,
                 ref_labels: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Check the inputs (``rankopt.checks``); return ``(N, L)`` int64 labels and ref labels
        (column 0 only unless ``hierarchical``)."""
        checks.check_embeddings(embeddings, "embeddings", min_rows=2)
        if isinstance(labels, Relevance):
            if not self.accepts_relevance:
                require_class_labels(labels, type(self).__name__)
            if ref_labels is not None:
                raise ValueError("with a Relevance as labels, ref_labels must be None: the Relevance covers the batch "
                                 "followed by the reference set")
            labels = torch.zeros(embeddings.shape[0], 0, dtype=torch.long, device=embeddings.device)
        else:
            labels = checks.check_labels(labels, embeddings.shape[0], "labels")
        if ref_labels is not None and ref_embeddings is None:
            raise ValueError("ref_labels given without ref_embeddings")
        if ref_embeddings is not None:
            if ref_labels is None and labels.shape[1]:
                raise ValueError("ref_embeddings given without ref_labels")
            if not self.accepts_reference:
                raise ValueError(f"{type(self).__name__} does not accept a reference set (ref_embeddings)")
            checks.check_embeddings(ref_embeddings, "ref_embeddings")
            if ref_embeddings.shape[1] != embeddings.shape[1]:
                raise ValueError(f"ref_embeddings have dimension {ref_embeddings.shape[1]} but embeddings have "
                                 f"{embeddings.shape[1]}")
            if ref_labels is not None:
                ref_labels = checks.check_labels(ref_labels, ref_embeddings.shape[0], "ref_labels")
                if ref_labels.shape[1] != labels.shape[1]:
                    raise ValueError(f"ref_labels have {ref_labels.shape[1]} levels but labels have {labels.shape[1]}")
                ref_labels = ref_labels.to(labels.device)
        if not self.hierarchical:
            labels = labels[:, :1]
            ref_labels = None if ref_labels is None else ref_labels[:, :1]
        return labels, ref_labels

    def retrieval_set(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor | Relevance,
        ref_embeddings: torch.Tensor | None = None,
        ref_labels: torch.Tensor | None = None,
    ) -> RetrievalSet:
        """Validate the inputs and build the :class:`RetrievalSet` (float32, autocast off)."""
        given = labels if isinstance(labels, Relevance) else None
        labels, ref_labels = self.validate(embeddings, labels, ref_embeddings, ref_labels)
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            x = embeddings.to(compute_dtype(embeddings))
            items = x if ref_embeddings is None else torch.cat([x, ref_embeddings.to(x.device, x.dtype)])
            item_labels = labels if ref_labels is None else torch.cat([labels, ref_labels])
            r = sim.prepare(items, self.similarity)
            scores = sim.pairwise(r[: x.shape[0]], r, self.similarity, prepared=True)
        if given is None:
            levels, num_levels = self._levels(labels, item_labels), labels.shape[1]
        else:
            levels, num_levels = self._given_levels(given, x.shape[0], items.shape[0], x.device)
        if self.include_self:
            valid = torch.ones_like(levels, dtype=torch.bool)
        else:
            valid = ~self_mask(x.shape[0], items.shape[0], 0, device=x.device)
        return RetrievalSet(scores, levels, valid, num_levels, x, labels)

    def _levels(self, labels: torch.Tensor, item_labels: torch.Tensor) -> torch.Tensor:
        """Shared levels ``l_ij = #{c : labels[i, c] = item_labels[j, c]}`` (:func:`rankopt.labels.relevance_levels`)
        as int8 (``B·M`` bytes), one ``(B, M)`` comparison per label column added in place."""
        levels = same_class(labels, item_labels).to(torch.int8)
        for column in range(1, labels.shape[1]):
            levels += labels[:, column : column + 1] == item_labels[:, column]
        return levels

    def _given_levels(self, relevance: Relevance, batch_size: int, num_items: int,
                      device: torch.device) -> tuple[torch.Tensor, int]:
        """``(levels, L)``: the grades of the ``B x M`` relevance as int8 levels, ``L = G`` (flat losses: ``grade > 0``,
        ``L = 1``)."""
        relevance.check_shape(batch_size, num_items, "the batch x its retrieval set (the batch, then ref_embeddings)")
        grades = relevance.block(slice(None), slice(None)).to(device)
        if not self.hierarchical:
            return (grades > 0).to(torch.int8), 1
        if relevance.grades > torch.iinfo(torch.int8).max:
            raise ValueError(f"a rank loss takes at most {torch.iinfo(torch.int8).max} relevance grades, got "
                             f"{relevance.grades}")
        return grades.to(torch.int8), relevance.grades

    def compute(self, batch: RetrievalSet) -> torch.Tensor:
        """The loss on a validated float32 :class:`RetrievalSet` (a scalar).

        Default, for row-local losses: the mean over queries with a positive of
        :meth:`query_terms`, evaluated by :meth:`rowwise` with :meth:`elements_per_row` elements per row.
        """
        def terms(scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
            return self.query_terms(scores, levels, valid, batch.num_levels)

        per_query = self.rowwise(terms, batch.scores, batch.levels, batch.valid,
                                 elements_per_row=self.elements_per_row(batch))
        return self.average_over_queries(per_query, batch.num_positives > 0)

    def elements_per_row(self, batch: RetrievalSet) -> int:
        """Elements of the largest per-query intermediate of :meth:`query_terms` (the chunking of
        :meth:`compute`): ``max_i |P_i| * M`` by default."""
        return max(1, int(batch.num_positives.max())) * batch.scores.shape[1]

    def query_terms(self, scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor,
                    num_levels: int) -> torch.Tensor:
        """Per-query loss ``(C,)`` of a chunk of full rows (``scores``, ``levels``, ``valid``: ``(C, M)``)."""
        raise NotImplementedError(f"{type(self).__name__} must implement compute() or query_terms()")

    def rowwise(self, fn: Callable[..., torch.Tensor], scores: torch.Tensor, *row_args: torch.Tensor,
                elements_per_row: int) -> torch.Tensor:
        """:func:`rowwise` under this loss's ``max_elements`` budget."""
        return rowwise(fn, scores, *row_args, elements_per_row=elements_per_row, max_elements=self.max_elements)

    def average_over_queries(self, per_query: torch.Tensor, has_positive: torch.Tensor) -> torch.Tensor:
        """Mean of ``per_query`` over queries with a positive; counts the others in
        ``last_num_queries_without_positive``. No such query -> a zero that keeps the graph."""
        self.last_num_queries_without_positive = int((~has_positive).sum())
        if not bool(has_positive.any()):
            return per_query.sum() * 0.0
        return per_query[has_positive].mean()

    def can_share(self, owner: RankLoss, with_reference: bool) -> bool:
        """Whether :meth:`compute` may run on ``owner``'s :class:`RetrievalSet` of the same inputs (a combination
        builds it once for all its terms): same similarity, self-inclusion and label columns, and a reference
        set (``with_reference``) only if this loss accepts one."""
        same = (self.similarity, self.include_self, self.hierarchical) == (owner.similarity, owner.include_self,
                                                                           owner.hierarchical)
        return same and (self.accepts_reference or not with_reference)

    def extra_repr(self) -> str:
        return f"similarity={self.similarity!r}, include_self={self.include_self}"
