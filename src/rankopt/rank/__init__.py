"""The rank machinery written once: relevance of retrieved items, step and
smooth surrogates of the Heaviside, and score differences. Every loss and metric
of rankopt uses these pieces."""

from rankopt.rank.differences import difference_summary, operating_fraction, score_differences
from rankopt.rank.levels import level_counts, ndcg_gains, relevance
from rankopt.rank.relevance_input import Relevance
from rankopt.rank.surrogates import Pivots, default_delta, heaviside, sigmoid_sums, sup_rank_sums, sup_step

__all__ = [
    "Pivots",
    "Relevance",
    "default_delta",
    "difference_summary",
    "heaviside",
    "level_counts",
    "ndcg_gains",
    "operating_fraction",
    "relevance",
    "score_differences",
    "sigmoid_sums",
    "sup_rank_sums",
    "sup_step",
]
