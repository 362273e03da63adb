"""Brute-force references for the retrieval metrics, written from the definitions.

Python loops over queries and items on float64 numbers; deliberately naive and
independent of rankopt (no shared helpers). Small inputs only.

Tie convention: rank(j) = 1 + #{k != j in Omega : s_k >= s_j}.
"""

from __future__ import annotations

import math

import numpy as np


def scores(query: np.ndarray, ref: np.ndarray, similarity: str) -> np.ndarray:
    q, r = query.astype(np.float64), ref.astype(np.float64)
    if similarity == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        r = r / np.linalg.norm(r, axis=1, keepdims=True)
    if similarity == "neg_l2":
        return -np.sqrt(((q[:, None, :] - r[None, :, :]) ** 2).sum(-1))
    return q @ r.T


def _rank(s: list[float], j: int) -> int:
    return 1 + sum(1 for k in range(len(s)) if k != j and s[k] >= s[j])


def _ap(s: list[float], pos: list[bool]) -> float:
    """TPAMI Eq. 33 with pessimistic ranks; NaN without positives."""
    idx = [j for j in range(len(s)) if pos[j]]
    if not idx:
        return math.nan
    total = 0.0
    for j in idx:
        rank_plus = 1 + sum(1 for k in idx if k != j and s[k] >= s[j])
        total += rank_plus / _rank(s, j)
    return total / len(idx)


def query_metrics(s: list[float], levels: list[int], num_levels: int, names: list[str], alpha: float = 1.0) -> dict[str, float]:
    """Every metric of one query; ``levels[k]`` = number of shared levels (L = same finest label)."""
    n = len(s)
    L = num_levels
    pos = [lv == L for lv in levels]
    P = [j for j in range(n) if pos[j]]
    R = len(P)
    ranks = [_rank(s, j) for j in range(n)]
    out: dict[str, float] = {}
    for name in names:
        value = math.nan
        if name.startswith(("recall@", "precision@", "true_recall@")) or (name.startswith("map@") and name != "map@r"):
            k = int(name.split("@")[1])
            hits = sum(1 for j in P if ranks[j] <= k)
            if R:
                if name.startswith("recall@"):
                    value = 1.0 if hits else 0.0
                elif name.startswith("precision@"):
                    value = hits / k
                elif name.startswith("true_recall@"):
                    value = hits / min(k, R)
                else:
                    value = sum((1 + sum(1 for i in P if i != j and s[i] >= s[j])) / ranks[j] for j in P if ranks[j] <= k) / min(R, k)
        elif name == "map@r":
            if R:
                value = sum((1 + sum(1 for i in P if i != j and s[i] >= s[j])) / ranks[j] for j in P if ranks[j] <= R) / R
        elif name == "map":
            value = _ap(s, pos)
        elif name == "mrr":
            value = 1.0 / min(ranks[j] for j in P) if R else math.nan
        elif name.startswith("ap@level"):
            c = int(name[len("ap@level") :])
            value = _ap(s, [lv >= L - c for lv in levels])
        elif name in ("h-ap", "sum_wap"):
            value = h_ap(s, levels, L, alpha=alpha, kind=name)
        elif name == "ndcg":
            gains = [2.0**lv - 1 for lv in levels]
            ideal = sorted(gains, reverse=True)
            idcg = sum(g / math.log2(1 + i) for i, g in enumerate(ideal, start=1))
            dcg = sum(gains[k] / math.log2(1 + ranks[k]) for k in range(n))
            value = dcg / idcg if idcg > 0 else math.nan
        elif name == "asi":
            value = asi(levels, ranks)
        out[name] = value
    return out


def h_ap(s: list[float], levels: list[int], L: int, alpha: float = 1.0, kind: str = "h-ap", weights: list[float] | None = None) -> float:
    """TPAMI Eq. 18-20 (``kind="h-ap"``) or the Property 1 relevance (``kind="sum_wap"``)."""
    n = len(s)
    size = {lv: sum(1 for x in levels if x == lv) for lv in range(L + 1)}
    at_least = {p: sum(1 for x in levels if x >= p) for p in range(1, L + 1)}
    w = weights or [1.0 / L] * L
    rel = []
    for k in range(n):
        lv = levels[k]
        if lv == 0:
            rel.append(0.0)
        elif kind == "h-ap":
            rel.append((lv / L) ** alpha / size[lv])
        else:
            rel.append(sum(w[p - 1] / at_least[p] for p in range(1, lv + 1)))
    plus = [k for k in range(n) if levels[k] > 0]
    if not plus:
        return math.nan
    total = 0.0
    for k in plus:
        h_rank = rel[k] + sum(min(rel[k], rel[j]) for j in plus if j != k and s[j] >= s[k])
        total += h_rank / _rank(s, k)
    return total / sum(rel[k] for k in plus)


def asi(levels: list[int], ranks: list[int]) -> float:
    """TPAMI Sec. C-A1: mean over n <= N of |top-n ∩ ideal top-n| / n, items interchangeable within a level."""
    N = sum(1 for lv in levels if lv > 0)
    if N == 0:
        return math.nan
    ideal = sorted(levels, reverse=True)
    total = 0.0
    for n in range(1, N + 1):
        top = [levels[k] for k in range(len(levels)) if ranks[k] <= n]
        best = ideal[:n]
        inter = sum(min(top.count(lv), best.count(lv)) for lv in set(levels) if lv > 0)
        total += inter / n
    return total / N


def evaluate(
    query: np.ndarray,
    qlabels: np.ndarray,
    ref: np.ndarray | None,
    rlabels: np.ndarray | None,
    names: list[str],
    similarity: str = "cosine",
    alpha: float = 1.0,
    query_groups: np.ndarray | None = None,
    ref_groups: np.ndarray | None = None,
) -> tuple[dict[str, float], int]:
    """Mean of each metric over the queries where it is defined, and the number of queries without positive.

    ``query_groups``/``ref_groups`` (exclusion groups, -1: none): query i's retrieval set leaves out every
    reference j with ``ref_groups[j] == query_groups[i] >= 0`` (self-retrieval: ``query_groups`` for both)."""
    qlabels = qlabels.reshape(len(qlabels), -1)
    self_retrieval = ref is None
    if self_retrieval:
        ref, rlabels, ref_groups = query, qlabels, query_groups
    rlabels = rlabels.reshape(len(rlabels), -1)
    L = qlabels.shape[1]
    S = scores(query, ref, similarity)
    per: dict[str, list[float]] = {name: [] for name in names}
    without = 0
    for i in range(len(query)):
        omega = [j for j in range(len(ref)) if not (self_retrieval and j == i)
                 and not (query_groups is not None and query_groups[i] >= 0 and ref_groups[j] == query_groups[i])]
        s = [float(S[i, j]) for j in omega]
        levels = [int(sum(qlabels[i, c] == rlabels[j, c] for c in range(L))) for j in omega]
        fine = [qlabels[i, 0] == rlabels[j, 0] for j in omega]
        without += not any(fine)
        for name, value in query_metrics(s, levels, L, names, alpha=alpha).items():
            if not math.isnan(value):
                per[name].append(value)
    return {name: (sum(v) / len(v) if v else math.nan) for name, v in per.items()}, without
