"""Exact, chunked retrieval metrics: :func:`evaluate`, the Revisited Oxford/Paris protocol
(:mod:`rankopt.metrics.landmarks`), the decomposability gap (:func:`decomposability_gap`) and
1:1 template verification, TAR at fixed FARs (:mod:`rankopt.metrics.verification`).

Ties are pessimistic everywhere: ``rank(j) = 1 + #{k != j : s_k >= s_j}``.
"""

from rankopt.metrics.evaluation import (
    ALL_METRICS,
    DEFAULT_HIERARCHICAL_METRICS,
    DEFAULT_METRICS,
    EvaluationResult,
    evaluate,
)
from rankopt.metrics.gap import DecomposabilityGap, decomposability_gap
from rankopt.metrics.landmarks import revisited_map
from rankopt.metrics.names import METRICS, MetricSpec, check_metrics, parse_metric
from rankopt.metrics.verification import (
    DEFAULT_FARS,
    group_mean,
    roc_points,
    tar_at_far,
    template_embeddings,
    verification_metrics,
)

__all__ = [
    "ALL_METRICS",
    "DEFAULT_FARS",
    "DEFAULT_HIERARCHICAL_METRICS",
    "DEFAULT_METRICS",
    "METRICS",
    "DecomposabilityGap",
    "EvaluationResult",
    "MetricSpec",
    "check_metrics",
    "decomposability_gap",
    "evaluate",
    "group_mean",
    "parse_metric",
    "revisited_map",
    "roc_points",
    "tar_at_far",
    "template_embeddings",
    "verification_metrics",
]
