"""``evaluate()``: exact retrieval metrics over a query set and a gallery, in query chunks.

Conventions (see the metric modules for the formulas):

* The retrieval set of a query is the gallery minus the query's own item, excluded by
  index: with ``ref_embeddings=None`` the query set is the gallery and the own item is the
  query itself; with a separate gallery that contains the queries (DyML), ``query_ref_index``
  gives each query's copy (``-1``: none). Exclusion groups (``query_groups``/``ref_groups``, e.g.
  open-metric-learning's ``sequence``) exclude, by index too, every reference of the query's group
  (:mod:`rankopt.metrics.groups`). Retrieval-set sizes may thus differ per query.
* Ties are pessimistic: ``rank(j) = 1 + #{k != j : s_k >= s_j}``, for every metric.
* A query for which a metric is undefined (no positive at the finest level for binary
  metrics, no item at level >= 1 for H-AP/ΣwAP/ASI, zero ideal gain for NDCG, no positive
  at the level for ``ap@level{c}``) is excluded from that metric's average and counted in
  ``num_excluded``; ``num_queries_without_positive`` counts queries without a finest-level positive.
* Top-k metrics alone come from an exact top-``K`` (``K`` = deepest cut-off, ``max R`` for ``map@r``,
  plus one item to resolve boundary ties): per query chunk, or, in self-retrieval, over the tiles
  of the upper triangle of the symmetric score matrix (half the products). With ``map`` or ``mrr``,
  every binary metric, the top-k ones included, is a function of the positives' ranks
  ``#{k : s_k >= t_p}``, and no list is built: each rank is counted (a pass over the row per
  positive, no sort) or, for classes larger than ``MAX_COUNTED_POSITIVES``, read by a binary search
  in the row sorted without indices. On CPU above :data:`~rankopt.kernels.TILED_MIN_SCORES` pairs, all binary
  metrics come from one pass of compiled kernels over tiles of the product
  (:mod:`rankopt.metrics.tiled`). Hierarchical metrics sort each chunk row's values (no indices)
  and rank each query's relevant items in them (the binary ranks then share that sort). The full
  ``Q x R`` matrix is never materialised.
* ``ref_block_size`` (a reference set larger than memory, e.g. a memory-mapped ``.npy``): the
  reference set is read and prepared ``ref_block_size`` rows at a time, for each query chunk;
  top-k lists are merged block by block, and ``map``/``mrr`` gather the positives' scores in a
  first pass over the blocks and count the items scoring at least as high in a second one.
  Hierarchical metrics need whole sorted rows and are refused there.
* ``query_categories``: the values are also averaged over the queries of each category, every query
  retrieving from the whole gallery (``EvaluationResult.by_category``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from rankopt.metrics.binary import from_positive_ranks, sorted_positive_scores, topk_metrics
from rankopt.metrics.given_relevance import GivenRelevance
from rankopt.metrics.groups import CategoryTotals, ExclusionGroups, category_codes
from rankopt.metrics.hierarchical import LevelIndex, RankedLevels, hierarchical_metrics
from rankopt.metrics.ranking import ClassIndex, count_at_least, count_below, list_ranks, sorted_rows
from rankopt import kernels
from rankopt.kernels import TILED_MIN_SCORES
from rankopt.metrics import arguments, tiled
from rankopt.metrics.names import MetricSpec, check_levels, parse_metric
from rankopt.threads import ThreadPool
from rankopt.metrics.topk import (
    CHUNK_BUDGET_BYTES,
    chunk_scorer,
    default_chunk_size,
    faiss_topk,
    merge_topk,
    ref_block_scores,
    self_topk,
)
from rankopt.rank.relevance_input import Relevance
from rankopt.similarity import SIMILARITIES, prepare

DEFAULT_METRICS = ("recall@1", "recall@10", "map@r", "map")
DEFAULT_HIERARCHICAL_METRICS = (*DEFAULT_METRICS, "h-ap", "asi", "ndcg")
ALL_METRICS = ("recall@1", "recall@10", "recall@100", "true_recall@10", "precision@10", "map@r", "map@100",
               "map", "mrr", "h-ap", "sum_wap", "asi", "ndcg")  # fmt: skip
OPTIONS = ("alpha", "weights", "gains")
MAX_COUNTED_POSITIVES = 32  # above this many positives in a chunk, map/mrr sort the chunk instead
COUNTED_TOPK_POSITIVES = 16  # tiled kernels, top-k metrics alone: counted ranks up to this many positives per query,
                             # heaps above (the faster beyond it; measured: benchmarks/results/metrics.md)
SELF_BLOCK = 4096  # tile size of the symmetric self-retrieval top-k


@dataclass
class EvaluationResult:
    """Metric values (averages over the queries where each is defined) and query counts;
    ``by_category``: the same for the queries of each category (``evaluate(..., query_categories=...)``)."""

    metrics: dict[str, float]
    num_queries: int
    num_queries_without_positive: int
    num_excluded: dict[str, int] = field(default_factory=dict)
    by_category: dict[str, EvaluationResult] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        """``{"metrics", "num_queries", "num_queries_without_positive", "num_excluded"}``, plus
        ``"by_category": {name: <the same dict>}`` when there are categories."""
        out: dict[str, object] = {
            "metrics": dict(self.metrics),
            "num_queries": self.num_queries,
            "num_queries_without_positive": self.num_queries_without_positive,
            "num_excluded": dict(self.num_excluded),
        }
        if self.by_category:
            out["by_category"] = {name: sub.to_dict() for name, sub in self.by_category.items()}
        return out

    def to_record(self) -> dict[str, object]:
        """The flat record of a run's ``metrics.json``:
        ``{<metric>: value, "num_queries", "num_queries_without_positive"}``, plus
        ``"by_category": {name: <the same record>}`` when there are categories."""
        record: dict[str, object] = {**self.metrics, "num_queries": self.num_queries,
                                     "num_queries_without_positive": self.num_queries_without_positive}
        if self.by_category:
            record["by_category"] = {name: sub.to_record() for name, sub in self.by_category.items()}
        return record


def _checked_specs(metrics: Sequence[str] | None, num_levels: int, *, similarity: str, backend: str,
                   options: dict[str, object], ref_block_size: int | None, method: str,
                   chunk_size: int | None) -> list[MetricSpec]:
    """The parsed metrics of :func:`evaluate` (its defaults for ``num_levels`` label levels), after refusing every
    argument it cannot serve: unknown options, similarity or backend, a level beyond the labels, non-top-k metrics
    with faiss, ``ref_block_size`` with metrics or a method that need the reference set whole, a chunk size < 1."""
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise TypeError(f"unknown evaluate() option(s) {unknown}; known: {', '.join(OPTIONS)}")
    if similarity not in SIMILARITIES:
        raise ValueError(f"unknown similarity {similarity!r}; use one of {', '.join(SIMILARITIES)}")
    if backend not in ("torch", "faiss"):
        raise ValueError(f"unknown backend {backend!r}; use 'torch' or 'faiss'")
    specs = [parse_metric(m)
             for m in (metrics or (DEFAULT_METRICS if num_levels == 1 else DEFAULT_HIERARCHICAL_METRICS))]
    check_levels(specs, num_levels)
    if backend == "faiss" and any(s.kind != "topk" for s in specs):
        bad = [s.name for s in specs if s.kind != "topk"]
        raise ValueError(f"backend='faiss' serves top-k metrics only; use backend='torch' for {bad}")
    if ref_block_size is not None:
        arguments.check_ref_block_size(ref_block_size, [s.name for s in specs if s.kind == "hierarchical"], backend)
    if kernels.check(method) == "compiled" and ref_block_size is not None:
        raise ValueError(f"method={method!r} holds the reference set whole; use it without ref_block_size")
    return specs


def _exclusions(query_ref_index: torch.Tensor | None, query_groups: torch.Tensor | None,
                ref_groups: torch.Tensor | None, num_queries: int, num_refs: int, self_retrieval: bool, backend: str,
                dev: torch.device) -> tuple[torch.Tensor | None, ExclusionGroups | None]:
    """What each query leaves out of its retrieval set, by index, checked and on ``dev``: its own item (``(Q,)``,
    ``-1`` none; ``None``: no query has one) and the exclusion groups (``None``: none)."""
    groups = arguments.check_exclusion_groups(query_groups, ref_groups, num_queries, num_refs, self_retrieval)
    if groups is not None and backend == "faiss":
        raise ValueError("backend='faiss' cannot exclude groups (query_groups); use backend='torch'")
    if query_ref_index is not None:
        own = arguments.check_query_ref_index(query_ref_index, num_queries, num_refs, self_retrieval).to(dev)
    else:
        own = torch.arange(num_queries, device=dev) if self_retrieval else None
    return own, (None if groups is None else ExclusionGroups(groups[0].to(dev), groups[1].to(dev)))


def _averaged(per_chunk: Iterator[dict[str, torch.Tensor]], specs: list[MetricSpec], ctx: _Context | GivenRelevance,
              num_queries: int, query_categories: Sequence[object] | None) -> EvaluationResult:
    """Each metric averaged over the queries where it is defined (not NaN), from ``per_chunk``'s per-query values
    (every path yields them in query order); per category too with ``query_categories``."""
    sums: dict[str, float] = {s.name: 0.0 for s in specs}
    counts: dict[str, int] = {s.name: 0 for s in specs}
    totals = None if query_categories is None else CategoryTotals(*category_codes(query_categories, num_queries),
                                                                  list(sums))
    start = 0  # every path yields the queries' values in query order
    for per_query in per_chunk:
        rows = slice(start, start + len(next(iter(per_query.values()))))
        for name, values in per_query.items():
            if name in sums:
                defined = ~values.isnan()
                sums[name] += float(values[defined].sum())
                counts[name] += int(defined.sum())
                if totals is not None:
                    totals.add(name, values, rows)
        start = rows.stop

    result = EvaluationResult(
        metrics={name: (sums[name] / counts[name] if counts[name] else math.nan) for name in sums},
        num_queries=num_queries,
        num_queries_without_positive=int((ctx.num_pos <= 0).sum()),
        num_excluded={name: num_queries - counts[name] for name in sums},
    )
    if totals is not None:
        result.by_category = {name: EvaluationResult(*values)
                              for name, values in totals.results(ctx.num_pos <= 0).items()}
    return result


def evaluate(
    query_embeddings: torch.Tensor,
    query_labels: torch.Tensor | None,
    ref_embeddings: torch.Tensor | None = None,
    ref_labels: torch.Tensor | None = None,
    *,
    metrics: Sequence[str] | None = None,
    similarity: str = "cosine",
    chunk_size: int | None = None,
    device: str | torch.device | None = None,
    backend: str = "torch",
    progress: bool = False,
    query_ref_index: torch.Tensor | None = None,
    ref_block_size: int | None = None,
    method: str = "auto",
    query_groups: torch.Tensor | None = None,
    ref_groups: torch.Tensor | None = None,
    query_categories: Sequence[object] | None = None,
    relevance: Relevance | None = None,
    **options: object,
) -> EvaluationResult:
    """Exact retrieval metrics (names: ``recall@K``, ``true_recall@K``, ``precision@K``, ``map@r``,
    ``map``, ``map@K``, ``mrr``, ``h-ap``, ``sum_wap``, ``asi``, ``ndcg``, ``ap@level{c}``).

    ``metrics=None``: :data:`DEFAULT_METRICS` (plus H-AP, ASI, NDCG for 2-D labels).
    ``options``: ``alpha`` (H-AP, Eq. 20), ``weights`` (ΣwAP), ``gains`` (NDCG: ``"exp"``,
    ``"linear"`` or a per-level list). ``backend="faiss"`` serves top-k metrics only.

    ``query_ref_index`` (with a separate gallery that contains the queries, e.g. DyML):
    ``(Q,)`` int64, for each query the index in ``ref_embeddings`` of its own copy, or ``-1``
    when it has none. That item is excluded from the query's retrieval set, by index: not
    ranked, not a positive, not counted in ``R`` or any level count, whatever its score
    and label (a query with a copy retrieves among ``R - 1`` items, one without among ``R``).
    ``ref_embeddings=None`` is the special case ``ref = query``, ``query_ref_index = arange(Q)``.

    ``query_groups``/``ref_groups`` (exclusion groups, e.g. open-metric-learning's ``sequence``):
    ``(Q,)``/``(R,)`` int64 group ids, ``-1`` (any negative) for none; query ``i`` ignores every
    reference ``j`` with ``ref_groups[j] == query_groups[i] >= 0``, by index, as its own item: not
    ranked, not a positive, not counted in ``R``. A query all of whose positives lie in its group has
    no positive (``num_queries_without_positive``). ``ref_embeddings=None``: ``query_groups`` are the
    items' groups (``ref_groups`` stays ``None``). The tiled kernels exclude only the own item:
    ``method="auto"`` takes the chunked path with groups, and ``method="tiled"`` is refused;
    ``backend="faiss"`` is refused too.

    ``query_categories``: a name per query (``None``: none); ``EvaluationResult.by_category[name]``
    then holds every metric averaged over that category's queries, each retrieving from the whole
    gallery (as open-metric-learning does: the same values as evaluating those queries alone).

    ``ref_block_size`` (rows; default ``None``: the reference set is prepared whole, once): the
    reference set (the query set in self-retrieval) is read and prepared that many rows at a time,
    never whole, for sets larger than memory; same results. Top-k metrics, ``map`` and ``mrr``
    (classes of at most :data:`MAX_COUNTED_POSITIVES` items) only.

    ``method`` (:data:`rankopt.kernels.METHODS`; ``"tiled"``/``"chunked"``: earlier names): ``"compiled"`` reads the
    score matrix once, tile by tile, with compiled kernels (:mod:`rankopt.metrics.tiled`; CPU, binary metrics,
    ``map``/``mrr`` with classes of at most :data:`MAX_COUNTED_POSITIVES` items); ``"reference"`` sorts or selects
    per query chunk with torch; ``"auto"`` takes the tiled kernels where they apply and the work reaches
    :data:`~rankopt.kernels.TILED_MIN_SCORES` pairs. Both give the same values.

    ``relevance`` (with ``query_labels=None``, no ``ref_labels``): a :class:`~rankopt.rank.Relevance`, ``Q x R``
    (``Q x Q`` in self-retrieval): multi-label items (``Relevance.multilabel``), a dense or sparse grade matrix
    (``Relevance.matrix``) or a function (``Relevance.function``). Binary metrics take grade ``> 0`` as positive
    (``map@r``: ``R`` = number of relevant items), graded ones (``h-ap``, ``ndcg``, ...) the grade as the level,
    ``L = G`` (:mod:`rankopt.metrics.given_relevance`). The fast paths (compiled tiles, faiss, ``ref_block_size``)
    read class labels: a relevance goes through the exact chunked reference path only.
    """
    if relevance is None:
        query, q_labels, ref, r_labels = arguments.check_inputs(query_embeddings, query_labels, ref_embeddings,
                                                                ref_labels)
    else:
        query, ref, relevance = arguments.check_relevance_inputs(
            query_embeddings, query_labels, ref_embeddings, ref_labels, relevance, method=method, backend=backend,
            ref_block_size=ref_block_size)
    num_levels = q_labels.shape[1] if relevance is None else relevance.grades
    specs = _checked_specs(metrics, num_levels, similarity=similarity, backend=backend, options=options,
                           ref_block_size=ref_block_size, method=method, chunk_size=chunk_size)
    self_retrieval = ref_embeddings is None
    dev = torch.device(device) if device is not None else query.device
    dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    if ref_block_size is None:  # otherwise each block is moved on its own
        query = query.to(dev, dtype)
        ref = query if self_retrieval else ref.to(dev, dtype)
    if relevance is None:
        q_labels = q_labels.to(dev)
        r_labels = q_labels if self_retrieval else r_labels.to(dev)
    own, groups = _exclusions(query_ref_index, query_groups, ref_groups, query.shape[0], ref.shape[0],
                              self_retrieval, backend, dev)
    ctx = (_Context(specs, q_labels, r_labels, own, self_retrieval, options, groups) if relevance is None
           else GivenRelevance(specs, relevance, own, groups, options))
    if isinstance(ctx, GivenRelevance):
        per_chunk = ctx.chunks(query, None if self_retrieval else ref, similarity, chunk_size, progress)
    elif ref_block_size is not None:
        per_chunk = _blocked_metrics(ctx, query, ref, similarity, chunk_size, ref_block_size, progress)
    else:
        per_chunk = _per_query_metrics(ctx, query, ref, similarity, chunk_size, backend, progress, method)
    return _averaged(per_chunk, specs, ctx, query.shape[0], query_categories)


class _Context:
    """What the per-chunk computations need: labels, positives' counts, the metric requests."""

    def __init__(
        self,
        specs: list[MetricSpec],
        q_labels: torch.Tensor,
        r_labels: torch.Tensor,
        own: torch.Tensor | None,
        self_retrieval: bool,
        options: dict[str, object],
        groups: ExclusionGroups | None = None,
    ) -> None:
        self.q_labels, self.r_labels, self.self_retrieval, self.options = q_labels, r_labels, self_retrieval, options
        self.own = own  # (Q,) reference excluded from each query's retrieval set (-1: none), or None
        self.groups = groups  # each query's group of excluded references, or None
        self.num_levels = q_labels.shape[1]
        self.classes = ClassIndex(r_labels[:, 0])
        self.num_pos = self.classes.class_counts(q_labels[:, 0])
        self.sizes = torch.full_like(self.num_pos, r_labels.shape[0])  # retrieval-set size of each query
        if own is not None:
            has_own = own >= 0
            self.sizes -= has_own.long()
            self.num_pos -= (has_own & (r_labels[own.clamp(min=0), 0] == q_labels[:, 0])).long()
        if groups is not None:
            items, positives = groups.excluded_counts(q_labels[:, 0], r_labels[:, 0], own)
            self.sizes -= items
            self.num_pos -= positives
        self.num_refs = int(self.sizes.max())  # the largest retrieval set
        if self.num_refs == 0:
            raise ValueError("every reference lies in its query's exclusion group (query_groups/ref_groups): no query "
                             "has an item to retrieve")
        self.topk = [(s.name, s.family, s.k) for s in specs if s.kind == "topk"]
        self.hierarchical = [(s.name, s.family, s.k) for s in specs if s.kind == "hierarchical"]
        self.full_binary = any(s.kind == "full" for s in specs)
        self.binary = [(s.name, s.family, s.k) for s in specs if s.kind in ("topk", "full")]
        cuts = [s.k for s in specs if s.kind == "topk" and s.family != "map@r"]
        if any(s.family == "map@r" for s in specs):
            cuts.append(int(self.num_pos.max()))
        self.list_len = min(max(cuts, default=0) + 1, self.num_refs)  # one beyond the deepest cut-off
        # the relevant items of each query (hierarchical metrics), built on first use
        self.level_index: LevelIndex | None = None
        self.may_sort = (bool(self.hierarchical)
                         or (self.full_binary and int(self.num_pos.max()) > MAX_COUNTED_POSITIVES))

    def from_lists(self, values: torch.Tensor, idx: torch.Tensor,
                   rows: slice | torch.Tensor) -> dict[str, torch.Tensor]:
        """Top-k metrics from top-``K`` lists (``values`` sorted decreasingly, reference ``idx``).

        A query's excluded reference is in its list only at ``-inf``, hence last, when the list
        holds the whole retrieval set: it is then no positive, and the ranks before it are exact.
        Lists shorter than the largest retrieval set (``num_refs``) are one beyond the deepest
        cut-off, so items tied with their last one rank beyond every cut-off (``BEYOND``) even
        when the list happens to hold a smaller retrieval set whole: no metric changes.
        """
        positive = self.r_labels[:, 0][idx] == self.q_labels[rows, :1]
        if self.own is not None:
            positive &= idx != self.own[rows].unsqueeze(1)
        if self.groups is not None:
            positive &= self.groups.outside(idx, rows)
        ranks = list_ranks(values, complete=values.shape[1] >= self.num_refs)
        return topk_metrics(ranks, positive, self.num_pos[rows], self.topk)

    def from_scores(self, scores: torch.Tensor, start: int) -> dict[str, torch.Tensor]:
        """Every requested metric from one chunk of query rows ``(chunk, R)`` (own items scored ``-inf``; the
        queries' groups are scored ``-inf`` here, in place)."""
        rows = slice(start, start + scores.shape[0])
        num_pos = self.num_pos[rows]
        if self.groups is not None:
            self.groups.exclude(scores, rows)
        per_query: dict[str, torch.Tensor] = {}
        ascending = None  # the rows sorted without indices, where a metric needs them
        if self.hierarchical:  # from each query's relevant items and the sorted rows
            if self.level_index is None:
                self.level_index = LevelIndex(self.r_labels)
            idx, levels = self.level_index.relevant(self.q_labels[rows], None if self.own is None else self.own[rows])
            if self.groups is not None:
                levels = levels * self.groups.outside(idx, rows)
            ranked = RankedLevels.from_scores(scores, idx, levels, self.sizes[rows], self.num_levels)
            per_query |= hierarchical_metrics(ranked, self.hierarchical, **self.options)  # type: ignore[arg-type]
            ascending = ranked.ascending
        if not self.full_binary:
            return per_query | (self.from_lists(*scores.topk(self.list_len, dim=1), rows) if self.topk else {})
        # every binary metric from the positives' ranks #{k : s_k >= t_p}: counted for a few positives,
        # else R minus a binary search in the sorted row (excluded items, at -inf, are never counted)
        idx, valid = self._positives(rows)
        t, ok = sorted_positive_scores(scores.gather(1, idx), valid, scores.dtype)
        if int(num_pos.max()) <= MAX_COUNTED_POSITIVES:
            ranks = count_at_least(scores, t)
        else:
            ranks = scores.shape[1] - count_below(sorted_rows(scores) if ascending is None else ascending, t)
        return per_query | from_positive_ranks(t, ok, ranks, self.binary)

    def _positives(self, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """``(idx, valid)``, both ``(rows, P)``: the references of each query's finest class, valid when
        in its retrieval set (not its own item, not in its group)."""
        idx, valid = self.classes.members(self.q_labels[rows, 0], None if self.own is None else self.own[rows])
        if self.groups is not None:
            valid &= self.groups.outside(idx, rows)
        return idx, valid

    def from_blocks(self, query: torch.Tensor, ref: torch.Tensor, similarity: str, block_size: int,
                    rows: slice) -> dict[str, torch.Tensor]:
        """Top-k metrics, ``map`` and ``mrr`` of the prepared query rows ``rows``, the reference set read in blocks.

        Top-k metrics alone: the per-block top-``K`` lists merged, then :meth:`from_lists`. With
        ``map``/``mrr``, every metric comes from the positives' ranks: a first pass gathers each
        positive's score (its rows known by label), a second counts, block by block,
        ``rank(j) = #{k : s_k >= s_j}`` (excluded items are ``-inf``: never counted).
        """
        own = None if self.own is None else self.own[rows]

        def blocks() -> Iterator[tuple[int, torch.Tensor]]:  # the queries' groups scored -inf in each block
            for start, scores in ref_block_scores(query, ref, similarity=similarity, block_size=block_size,
                                                  exclude=own):
                yield start, scores if self.groups is None else self.groups.exclude(scores, rows, start)

        values = torch.empty((query.shape[0], 0), dtype=query.dtype, device=query.device)
        order = torch.empty((query.shape[0], 0), dtype=torch.long, device=query.device)
        if self.full_binary:
            idx, valid = self._positives(rows)
            pos_scores = torch.zeros(idx.shape, dtype=query.dtype, device=query.device)
        for start, scores in blocks():
            if self.full_binary:
                local = idx - start
                inside = (local >= 0) & (local < scores.shape[1])
                pos_scores = torch.where(inside, scores.gather(1, local.clamp(0, scores.shape[1] - 1)), pos_scores)
            else:
                top, pos = scores.topk(min(self.list_len, scores.shape[1]), dim=1)
                values, order = merge_topk(values, order, top, pos + start, self.list_len)
        if not self.full_binary:
            return self.from_lists(values, order, rows)
        t, ok = sorted_positive_scores(pos_scores, valid, query.dtype)
        counts = sum(count_at_least(scores, t) for _, scores in blocks())
        return from_positive_ranks(t, ok, counts, self.binary)


def _tiled_unavailable(ctx: _Context, query: torch.Tensor, backend: str) -> list[str]:
    """Why the tiled kernels cannot serve this evaluation (empty: they can)."""
    reasons = []
    if backend != "torch":
        reasons.append("backend='torch'")
    if query.device.type != "cpu":
        reasons.append("a CPU device")
    if ctx.hierarchical:
        reasons.append("binary metrics only")
    if ctx.groups is not None:  # the kernels exclude one item per query, by index
        reasons.append("no exclusion groups (query_groups)")
    if ctx.full_binary and int(ctx.num_pos.max()) > MAX_COUNTED_POSITIVES:
        reasons.append(f"map/mrr with at most {MAX_COUNTED_POSITIVES} positives per query")
    if not reasons and not tiled.available():  # importing numba only where the kernels could serve
        reasons.append("numba (pip install numba)")
    return reasons


def _per_query_metrics(
    ctx: _Context, query: torch.Tensor, ref: torch.Tensor, similarity: str, chunk_size: int | None, backend: str,
    progress: bool, method: str,
) -> Iterator[dict[str, torch.Tensor]]:
    """Per-query metric values, chunk after chunk, from the cheapest exact search for the requests."""
    gallery = None if ctx.self_retrieval else ref
    everything = slice(0, query.shape[0])
    use_tiles = kernels.use_compiled(method, lambda: _tiled_unavailable(ctx, query, backend),
                                     work=query.shape[0] * ctx.num_refs, min_work=TILED_MIN_SCORES)
    if use_tiles:
        # with small classes, each positive's rank is counted and every binary metric follows: no top-k lists
        counted = ctx.full_binary or int(ctx.num_pos.max()) <= COUNTED_TOPK_POSITIVES
        found = tiled.tiled_search(query, ctx.q_labels[:, 0], gallery, ctx.r_labels[:, 0], ctx.own,
                                   k=0 if counted else ctx.list_len, count_positives=counted, similarity=similarity)
        if counted:
            yield from_positive_ranks(found.positive_scores, found.positive_valid, found.ranks, ctx.binary)
        else:
            yield ctx.from_lists(found.values, found.indices, everything)
    elif backend == "faiss":
        lists = faiss_topk(query, gallery, ctx.list_len, similarity=similarity, use_gpu=query.device.type == "cuda",
                           exclude=ctx.own)
        yield ctx.from_lists(*lists, everything)
    elif (ctx.self_retrieval and not (ctx.full_binary or ctx.hierarchical) and ctx.groups is None
          and query.shape[0] * ctx.list_len * 12 <= 4 * CHUNK_BUDGET_BYTES):
        # symmetric tiles; the (N, K) candidate lists (12 bytes per entry) must fit 1 GiB
        yield ctx.from_lists(*self_topk(query, ctx.list_len, similarity=similarity, block_size=chunk_size or SELF_BLOCK,
                                        progress=progress), everything)
    else:  # query chunks, each scored and served by one thread of a pool on CPU (numpy's sorts are single-threaded)
        threads = torch.get_num_threads() if query.device.type == "cpu" else 1
        # measured peaks: the scores and their sorted copy, and (hierarchical) each query's relevant items' tensors
        bytes_per_score = 48 if ctx.hierarchical else 16 if ctx.may_sort else 8
        chunk = chunk_size or default_chunk_size(ref.shape[0], bytes_per_score * threads)
        if ctx.hierarchical and ctx.level_index is None:  # built once, before the threads share it
            ctx.level_index = LevelIndex(ctx.r_labels)
        scores_of = chunk_scorer(query, gallery, similarity=similarity, exclude=ctx.own)
        starts = range(0, query.shape[0], chunk)
        with ThreadPool(threads) as pool:
            results = pool.imap(lambda start: ctx.from_scores(scores_of(start, start + chunk), start), starts)
            yield from tqdm(results, total=len(starts), disable=not progress, desc="evaluating", unit="chunk",
                            leave=False)


def _blocked_metrics(
    ctx: _Context, query: torch.Tensor, ref: torch.Tensor, similarity: str, chunk_size: int | None, block_size: int,
    progress: bool
) -> Iterator[dict[str, torch.Tensor]]:
    """Per-query metric values, query chunk after query chunk, each against the reference set read in blocks."""
    if ctx.full_binary and int(ctx.num_pos.max()) > MAX_COUNTED_POSITIVES:
        raise ValueError(
            f"map/mrr under ref_block_size count at most {MAX_COUNTED_POSITIVES} positives per query, but a query has "
            f"{int(ctx.num_pos.max())}; evaluate them without ref_block_size (--ref-block-size)"
        )
    chunk = chunk_size or default_chunk_size(block_size, bytes_per_score=8)
    dtype = torch.float64 if query.dtype == torch.float64 else torch.float32
    starts = range(0, query.shape[0], chunk)
    for start in tqdm(starts, disable=not progress, desc="evaluating", unit="chunk", leave=False):
        rows = slice(start, min(start + chunk, query.shape[0]))
        block = prepare(query[rows].to(ctx.q_labels.device, dtype), similarity)
        yield ctx.from_blocks(block, ref, similarity, block_size, rows)
