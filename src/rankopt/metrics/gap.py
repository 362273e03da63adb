"""The decomposability gap of a rank metric (ROADMAP Eq. 6; TPAMI Eq. 6 with the opposite sign)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from rankopt.checks import check_embeddings, check_labels
from rankopt.metrics.evaluation import evaluate, parse_metric


@dataclass(frozen=True)
class DecomposabilityGap:
    """``gap = batch_mean - whole``; ``float(result)`` is the gap."""

    gap: float
    batch_mean: float
    whole: float
    num_batches: int

    def __float__(self) -> float:
        return self.gap


def decomposability_gap(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    batch_size: int,
    metric: str = "ap",
    seed: int = 0,
    *,
    num_repeats: int = 1,
    similarity: str = "cosine",
    device: str | torch.device | None = None,
    **options: object,
) -> DecomposabilityGap:
    """``DG = (1/K) sum_b M(B_b) - M(whole set)`` (ROADMAP Eq. 6).

    The set is split by a seeded random permutation into ``K = N // batch_size`` batches
    (the ``N mod batch_size`` left-over items are dropped), ``num_repeats`` times. ``M(B_b)``
    is the metric with every batch item as a query and the batch as its retrieval set
    (self excluded); batches where no query has a positive are skipped. ``M(whole)`` is
    the same over the whole set. ``metric`` is an :func:`evaluate` name (``"ap"`` = ``"map"``).
    The gap is usually positive (batches are easier) but can be negative: the bound of
    ROADMAP Eq. 8 assumes a perfect ranking inside each batch.
    """
    embeddings = check_embeddings(embeddings, "embeddings", min_rows=2)
    labels = check_labels(labels, embeddings.shape[0])
    name = "map" if metric.lower() == "ap" else parse_metric(metric).name
    if not 2 <= batch_size <= embeddings.shape[0]:
        raise ValueError(f"batch_size must be in [2, {embeddings.shape[0]}] (the number of embeddings), got "
                         f"{batch_size}")
    if num_repeats < 1:
        raise ValueError(f"num_repeats must be >= 1, got {num_repeats}")
    kwargs = {"metrics": [name], "similarity": similarity, "device": device, **options}
    whole = evaluate(embeddings, labels, **kwargs).metrics[name]  # type: ignore[arg-type]
    generator = torch.Generator().manual_seed(seed)
    num_batches = embeddings.shape[0] // batch_size
    batch_values = []
    for _ in range(num_repeats):
        perm = torch.randperm(embeddings.shape[0], generator=generator)[: num_batches * batch_size]
        for batch in perm.view(num_batches, batch_size).to(embeddings.device):
            value = evaluate(embeddings[batch], labels[batch], **kwargs).metrics[name]  # type: ignore[arg-type]
            if not math.isnan(value):
                batch_values.append(value)
    if not batch_values:
        raise ValueError(f"no batch of {batch_size} items contains a query with a positive; use larger batches")
    batch_mean = sum(batch_values) / len(batch_values)
    return DecomposabilityGap(gap=batch_mean - whole, batch_mean=batch_mean, whole=whole, num_batches=len(batch_values))
