"""The metrics of :func:`rankopt.metrics.evaluate` under a given relevance (``relevance=``, a
:class:`rankopt.rank.relevance_input.Relevance`: multi-label items, a ``(Q, N)`` grade matrix, a function).

The reference path only (torch, query chunks): each chunk's ``(q, R)`` grades come from
:meth:`Relevance.block`; the items excluded by index (own item, exclusion groups: scored ``-inf``)
get grade 0 and leave the retrieval set. The positives of the binary metrics (``recall@K``,
``precision@K``, ``map@r`` with ``R = #{j : g_ij > 0}``, ``map``, ``mrr``, ...) are the items with
``g_ij > 0``, ranked pessimistically, ``rank(j) = #{k in Omega : s_k >= s_j}``
(:func:`rankopt.metrics.binary.from_positive_ranks`); the graded metrics (``h-ap``, ``ndcg``, ``asi``,
``sum_wap``, ``ap@level{c}``) take the grade as the level ``l`` with ``L = G``
(:mod:`rankopt.metrics.hierarchical`). With class labels as the relevance the values equal the label path's.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from tqdm.auto import tqdm

from rankopt.metrics.binary import from_positive_ranks, sorted_positive_scores
from rankopt.metrics.groups import ExclusionGroups
from rankopt.metrics.hierarchical import RankedLevels, hierarchical_metrics
from rankopt.metrics.names import MetricSpec
from rankopt.metrics.ranking import count_below, sorted_rows
from rankopt.metrics.topk import chunk_scorer, default_chunk_size
from rankopt.rank.relevance_input import Relevance
from rankopt.rank.surrogates import padded_columns


class GivenRelevance:
    """Per-chunk metric values under ``relevance``; ``num_pos`` (``(Q,)``, ``#{j in Omega_i : g_ij > 0}``) is
    filled as the chunks are served."""

    def __init__(self, specs: list[MetricSpec], relevance: Relevance, own: torch.Tensor | None,
                 groups: ExclusionGroups | None, options: dict[str, object]) -> None:
        self.relevance, self.own, self.groups, self.options = relevance, own, groups, options
        self.binary = [(s.name, s.family, s.k) for s in specs if s.kind in ("topk", "full")]
        self.hierarchical = [(s.name, s.family, s.k) for s in specs if s.kind == "hierarchical"]
        self.num_pos = torch.zeros(relevance.num_queries, dtype=torch.long)

    def chunks(self, query: torch.Tensor, gallery: torch.Tensor | None, similarity: str, chunk_size: int | None,
               progress: bool) -> Iterator[dict[str, torch.Tensor]]:
        """Per-query values, query chunk after query chunk (``gallery=None``: self-retrieval)."""
        scores_of = chunk_scorer(query, gallery, similarity=similarity, exclude=self.own)
        chunk = chunk_size or default_chunk_size(self.relevance.num_items, bytes_per_score=64)
        starts = range(0, query.shape[0], chunk)
        for start in tqdm(starts, disable=not progress, desc="evaluating", unit="chunk", leave=False):
            yield self.from_scores(scores_of(start, start + chunk), start)

    def from_scores(self, scores: torch.Tensor, start: int) -> dict[str, torch.Tensor]:
        """Every requested metric of the query rows ``[start, start + q)`` from their ``(q, R)`` scores (own items
        at ``-inf``; the queries' groups are scored ``-inf`` here, in place)."""
        rows = slice(start, start + scores.shape[0])
        if self.groups is not None:
            self.groups.exclude(scores, rows)
        excluded = scores == float("-inf")
        grades = self.relevance.block(rows).to(scores.device).masked_fill_(excluded, 0)
        idx, valid = padded_columns(grades > 0)  # each query's relevant items, left-aligned, then padding
        self.num_pos[rows] = valid.sum(dim=1).cpu()
        per_query: dict[str, torch.Tensor] = {}
        ascending = None
        if self.hierarchical:
            ranked = RankedLevels.from_scores(scores, idx, grades.gather(1, idx) * valid, (~excluded).sum(dim=1),
                                              self.relevance.grades)
            per_query |= hierarchical_metrics(ranked, self.hierarchical, **self.options)  # type: ignore[arg-type]
            ascending = ranked.ascending
        if self.binary:
            t, ok = sorted_positive_scores(scores.gather(1, idx), valid, scores.dtype)
            ranks = scores.shape[1] - count_below(sorted_rows(scores) if ascending is None else ascending, t)
            per_query |= from_positive_ranks(t, ok, ranks, self.binary)
        return per_query
