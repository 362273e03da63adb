"""Score differences entering the rank of a positive (rankopt.rank.differences) against a loop."""

from __future__ import annotations

import pytest
import torch

from rankopt.rank import default_delta, difference_summary, operating_fraction, score_differences


def _brute_force(emb: torch.Tensor, labels: torch.Tensor) -> list[float]:
    x = torch.nn.functional.normalize(emb.double(), dim=1)
    s = x @ x.T
    out = []
    for i in range(len(labels)):
        for j in range(len(labels)):
            if j == i or labels[j] != labels[i]:
                continue
            out += [float(s[i, k] - s[i, j]) for k in range(len(labels)) if k not in (i, j)]
    return sorted(out)


def test_all_differences_of_a_small_batch_match_a_loop():
    gen = torch.Generator().manual_seed(3)
    emb = torch.randn(12, 5, generator=gen)
    labels = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 4, 4])
    got = sorted(score_differences(emb, labels).tolist())
    assert got == pytest.approx(_brute_force(emb, labels), abs=1e-6)


def test_query_sampling_summary_and_operating_fraction():
    gen = torch.Generator().manual_seed(0)
    emb, labels = torch.randn(200, 16, generator=gen), torch.arange(50).repeat_interleave(4)
    d = score_differences(emb, labels, max_queries=10, generator=torch.Generator().manual_seed(1))
    assert d.numel() == 10 * 3 * 198  # 10 queries, 3 positives each, every other item
    summary = difference_summary(d)
    assert summary["min"] <= summary["q01"] <= summary["q50"] <= summary["q99"] <= summary["max"]
    assert summary["q50"] == pytest.approx(float(d.double().median()), abs=1e-2)
    half = default_delta(0.01)
    assert operating_fraction(d, half) == pytest.approx(sum(abs(v) < half for v in d.tolist()) / d.numel())
    assert operating_fraction(d, 10.0) == 1.0
    empty = score_differences(emb[:3], torch.tensor([0, 1, 2]))
    assert empty.numel() == 0 and torch.isnan(torch.tensor(operating_fraction(empty, 0.1)))
    assert all(v != v for v in difference_summary(empty).values())
