"""Exact, chunked retrieval metrics: :func:`evaluate`, the Revisited Oxford/Paris protocol
(:mod:`rankopt.metrics.landmarks`) and the decomposability gap (:func:`decomposability_gap`).

Ties are pessimistic everywhere: ``rank(j) = 1 + #{k != j : s_k >= s_j}``.
"""

from rankopt.metrics.evaluation import (
    ALL_METRICS,
    DEFAULT_HIERARCHICAL_METRICS,
    DEFAULT_METRICS,
    METRICS,
    EvaluationResult,
    MetricSpec,
    evaluate,
    parse_metric,
)
from rankopt.metrics.gap import DecomposabilityGap, decomposability_gap
from rankopt.metrics.landmarks import revisited_map

__all__ = [
    "ALL_METRICS",
    "DEFAULT_HIERARCHICAL_METRICS",
    "DEFAULT_METRICS",
    "METRICS",
    "DecomposabilityGap",
    "EvaluationResult",
    "MetricSpec",
    "decomposability_gap",
    "evaluate",
    "parse_metric",
    "revisited_map",
]
