"""The rank machinery written once: relevance of retrieved items, step and
smooth surrogates of the Heaviside, and score differences. Every loss and metric
of rankopt uses these pieces."""

from rankopt.rank.relevance import level_counts, ndcg_gains, relevance

__all__ = ["level_counts", "ndcg_gains", "relevance"]
