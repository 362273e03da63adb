"""Score differences ``d = s_k - s_j`` that enter the rank of a positive ``j`` (TPAMI Eq. 3).

For a query, ``rank(j) = 1 + sum_{k != j} H(s_k - s_j)``: every surrogate of the step ``H``
(Smooth-AP's sigmoid, SupRank's H⁻, soft binning) is evaluated at these differences. Where
they fall decides whether a surrogate is informative: the sigmoid ``sigma(d / tau)`` has a
non-negligible slope only for ``|d| < delta(tau)`` (Smooth-AP supp. Fig. S7; ``delta``:
:func:`rankopt.rank.surrogates.default_delta`). These functions measure that on a batch.
"""

from __future__ import annotations

import torch

from rankopt import similarity as sim
from rankopt.labels import same_class

QUANTILES = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
"""The quantiles of :func:`difference_summary` (``q01`` ... ``q99``)."""


@torch.no_grad()
def score_differences(
    embeddings: torch.Tensor,
    labels: torch.Tensor,
    *,
    similarity: str = "cosine",
    max_queries: int = 64,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """All ``d = s_k - s_j`` of a batch, flattened: for each query ``i`` (at most ``max_queries``,
    drawn with ``generator``), each positive ``j != i`` and each item ``k`` not in ``{i, j}``.

    Self-retrieval within the batch: the query is excluded from its retrieval set by index.
    Labels: ``(B,)`` or ``(B, L)``; positives share the finest class.
    """
    x = sim.prepare(embeddings.detach().float(), similarity)
    n = x.shape[0]
    queries = torch.arange(n, device=x.device)
    if n > max_queries:
        queries = torch.randperm(n, generator=generator)[:max_queries].to(x.device)
    scores = sim.pairwise(x[queries], x, similarity, prepared=True)  # (Q, B)
    positive = same_class(labels[queries], labels).to(x.device)
    valid = torch.ones_like(positive)
    valid[torch.arange(queries.numel(), device=x.device), queries] = False
    positive &= valid
    q, j = positive.nonzero(as_tuple=True)
    if q.numel() == 0:
        return x.new_zeros(0)
    diffs = scores[q] - scores[q, j].unsqueeze(1)  # (pairs, B): s_k - s_j
    keep = valid[q].clone()
    keep[torch.arange(j.numel(), device=x.device), j] = False
    return diffs[keep]

QUANTILE_INPUT_LIMIT = 1 << 24
"""Values ``torch.quantile`` takes: :func:`difference_summary` subsamples evenly above."""


def difference_summary(diffs: torch.Tensor) -> dict[str, float]:
    """``min``, ``q01`` ... ``q99`` (:data:`QUANTILES`) and ``max`` of ``diffs`` (NaN when empty)."""
    names = ["min", *(f"q{round(q * 100):02d}" for q in QUANTILES), "max"]
    if diffs.numel() == 0:
        return dict.fromkeys(names, float("nan"))
    d = diffs.double()
    if d.numel() > QUANTILE_INPUT_LIMIT:
        d = d[torch.linspace(0, d.numel() - 1, QUANTILE_INPUT_LIMIT).long()]
    values = [d.min(), *torch.quantile(d, torch.tensor(QUANTILES, dtype=d.dtype, device=d.device)), d.max()]
    return {name: float(v) for name, v in zip(names, values, strict=True)}


def operating_fraction(diffs: torch.Tensor, half_width: float) -> float:
    """Fraction of ``diffs`` with ``|d| < half_width``: the sigmoid's sensitive range for
    ``half_width = delta(tau)`` (NaN when empty)."""
    if diffs.numel() == 0:
        return float("nan")
    return float((diffs.abs() < half_width).double().mean())
