"""Revisited Oxford/Paris protocol against a hand-computed case and a brute-force
transcription of revisitop's loops (anchors §2), on random synthetic rankings."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankopt.metrics.landmarks import revisited_map

SETS = {"easy": (["easy"], ["junk", "hard"]), "medium": (["easy", "hard"], ["junk"]), "hard": (["hard"], ["junk", "easy"])}


def brute_force(order: list[list[int]], gnd, protocol: str, kappas):
    ok_keys, junk_keys = SETS[protocol]
    aps, prs = [], []
    for i, ranking in enumerate(order):
        ok = [x for key in ok_keys for x in gnd[i][key]]
        junk = [x for key in junk_keys for x in gnd[i][key]]
        if not ok:
            continue
        pos = sorted(ranking.index(x) for x in ok)
        junk_pos = sorted(ranking.index(x) for x in junk if x not in ok)
        shifted = [p - sum(1 for q in junk_pos if q < p) for p in pos]
        ap = 0.0
        for j, rank in enumerate(shifted):
            p0 = 1.0 if rank == 0 else j / rank
            p1 = (j + 1) / (rank + 1)
            ap += (p0 + p1) / 2 / len(shifted)
        aps.append(ap)
        one_based = [p + 1 for p in shifted]
        prs.append([sum(1 for p in one_based if p <= min(max(one_based), k)) / min(max(one_based), k) for k in kappas])
    return np.mean(aps), np.mean(prs, axis=0), len(order) - len(aps)


def test_hand_computed():
    scores = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0]])
    gnd = [{"easy": [1], "hard": [3], "junk": [0]}]
    out = revisited_map(scores, gnd, kappas=(1, 5))
    assert out["medium/map"] == pytest.approx(0.5 + (0.5 + 2 / 3) / 4)
    assert out["easy/map"] == pytest.approx(1.0)
    assert out["hard/map"] == pytest.approx(0.25)
    assert out["medium/mp@1"] == pytest.approx(1.0)
    assert out["medium/mp@5"] == pytest.approx(2 / 3)
    assert out["hard/num_queries_without_positive"] == 0


def test_ties_are_pessimistic():
    scores = torch.tensor([[1.0, 1.0, 0.0]])
    out = revisited_map(scores, [{"easy": [0], "hard": [], "junk": []}], protocols=("easy",))
    assert out["easy/map"] == pytest.approx((0.0 + 0.5) / 2)  # the positive is ranked second


@pytest.mark.parametrize("seed", range(20))
def test_random_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    nq, n = 6, 30
    gnd = []
    for _ in range(nq):
        perm = rng.permutation(n)
        a, b, c = rng.integers(0, 5, size=3)
        gnd.append({"easy": perm[:a].tolist(), "hard": perm[a : a + b].tolist(), "junk": perm[a + b : a + b + c].tolist()})
    scores = torch.as_tensor(rng.normal(size=(nq, n)))
    order = [np.argsort(-scores[i].numpy(), kind="stable").tolist() for i in range(nq)]
    kappas = (1, 5, 10)
    out = revisited_map(scores, gnd, kappas=kappas, chunk_size=4)
    from_ranks = revisited_map(None, gnd, ranks=torch.as_tensor(order), kappas=kappas)
    for protocol in SETS:
        ap, pr, skipped = brute_force(order, gnd, protocol, kappas)
        assert out[f"{protocol}/map"] == pytest.approx(ap, abs=1e-12)
        assert from_ranks[f"{protocol}/map"] == pytest.approx(ap, abs=1e-12)
        for k, value in zip(kappas, pr):
            assert out[f"{protocol}/mp@{k}"] == pytest.approx(value, abs=1e-12)
        assert out[f"{protocol}/num_queries_without_positive"] == skipped


def test_bad_input():
    with pytest.raises(ValueError, match="exactly one"):
        revisited_map(None, [{}])
    with pytest.raises(ValueError, match="shape"):
        revisited_map(torch.zeros(2, 3), [{}])
    with pytest.raises(ValueError, match="protocol"):
        revisited_map(torch.zeros(1, 3), [{"easy": [0]}], protocols=("extreme",))
