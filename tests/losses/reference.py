"""Brute-force references for the rank losses, written from the papers' equations.

Explicit Python loops over queries and items on float64 torch scalars (autograd gives the
reference gradient). Deliberately naive and independent of rankopt's implementation.
Small inputs only. Every query-level function takes ``s`` (scores of the retrieval set,
1-D tensor), ``lv`` (list of relevance levels) and ``omega`` (indices of the retrieval set).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

TAU, RHO = 0.01, 100.0
DELTA = TAU * math.log(0.99 / 0.01)


def step(t) -> float:
    """Pessimistic Heaviside: ties count."""
    return 1.0 if float(t.detach() if torch.is_tensor(t) else t) >= 0 else 0.0


def sig(t, tau: float = TAU):
    """``1 / (1 + exp(-t / tau))`` (torch's stable form: no inf/inf in the gradient)."""
    return torch.sigmoid(torch.as_tensor(t, dtype=torch.float64) / tau)


def h_minus(t, tau=TAU, rho=RHO, delta=DELTA, start=0.5):
    """ROADMAP Eq. 4, branch chosen from the value; ties (t = 0) on the middle branch."""
    tv = float(t.detach()) if torch.is_tensor(t) else float(t)
    if tv < 0:
        return sig(t, tau)
    if tv <= delta:
        return sig(t, tau) + start
    return rho * (t - delta) + 1.0 / (1.0 + math.exp(-delta / tau)) + start


def shared_levels(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.reshape(-1) == b.reshape(-1)).sum())


def per_query(x, lab, query_fn: Callable, ref_x=None, ref_lab=None, include_self=False) -> torch.Tensor:
    """Mean of ``query_fn(s, lv, omega)`` over the queries for which it is not None."""
    items = x if ref_x is None else torch.cat([x, ref_x])
    item_lab = lab if ref_lab is None else torch.cat([lab, ref_lab])
    xn = x / x.norm(dim=1, keepdim=True)
    rn = items / items.norm(dim=1, keepdim=True)
    scores = xn @ rn.T
    terms = []
    for i in range(x.shape[0]):
        lv = [shared_levels(lab[i], item_lab[j]) for j in range(items.shape[0])]
        omega = [j for j in range(items.shape[0]) if include_self or j != i]
        t = query_fn(scores[i], lv, omega)
        if t is not None:
            terms.append(t)
    return torch.stack([torch.as_tensor(t, dtype=torch.float64) for t in terms]).mean()


def exact_rank(s, omega, k) -> float:
    """``1 + #{j != k in Omega : s_j >= s_k}`` (pessimistic ties)."""
    return 1.0 + sum(step(s[j] - s[k]) for j in omega if j != k)


def sup_ranks(s, lv, omega, **hkw) -> dict[int, tuple]:
    """``{k: (rank^+(k), rank_s^-(k))}`` for every ``k in Omega^+`` (TPAMI Eq. 3-5)."""
    out = {}
    for k in omega:
        if lv[k] == 0:
            continue
        rp = 1.0 + sum(step(s[j] - s[k]) for j in omega if j != k and lv[j] >= lv[k])
        rm = sum((h_minus(s[j] - s[k], **hkw) for j in omega if lv[j] < lv[k]), torch.zeros((), dtype=s.dtype))
        out[k] = (rp, rm)
    return out


def sup_ap_query(s, lv, omega, **hkw):
    """ROADMAP Eq. 5, one query."""
    r = sup_ranks(s, lv, omega, **hkw)
    return None if not r else 1 - sum(rp / (rp + rm) for rp, rm in r.values()) / len(r)


def smooth_ap_query(s, lv, omega, tau=TAU):
    """Smooth-AP Eq. 6-7, one query."""
    pos = [k for k in omega if lv[k] > 0]
    if not pos:
        return None
    total = 0
    for j in pos:
        rank = 1 + sum(sig(s[k] - s[j], tau) for k in omega if k != j)
        rank_plus = 1 + sum((sig(s[k] - s[j], tau) for k in pos if k != j), torch.zeros((), dtype=s.dtype))
        total = total + rank_plus / rank
    return 1 - total / len(pos)


def recall_query(s, lv, omega, rank_of: Callable, ks=(1, 2, 4, 8, 16), tau_star=1.0):
    """TPAMI Eq. 16 averaged over ks, one query; ``rank_of(k)`` is the (smooth) rank of positive ``k``."""
    pos = [k for k in omega if lv[k] > 0]
    if not pos:
        return None
    ranks = {p: rank_of(p) for p in pos}
    recalls = [sum(sig(kk - ranks[p], tau_star) for p in pos) / min(len(pos), kk) for kk in ks]
    return 1 - sum(recalls) / len(ks)


def sup_recall_query(s, lv, omega, **kw):
    r = sup_ranks(s, lv, omega)
    return recall_query(s, lv, omega, lambda p: r[p][0] + r[p][1], **kw)


def smooth_recall_query(s, lv, omega, tau=TAU, **kw):
    return recall_query(s, lv, omega, lambda p: 1 + sum(sig(s[j] - s[p], tau) for j in omega if j != p), **kw)


def hap_relevance(lv, omega, num_levels, alpha=1.0) -> dict[int, float]:
    """TPAMI Eq. 20: ``(l/L)^alpha / |Omega^(l)|``."""
    counts = {}
    for j in omega:
        counts[lv[j]] = counts.get(lv[j], 0) + 1
    return {j: ((lv[j] / num_levels) ** alpha / counts[lv[j]] if lv[j] > 0 else 0.0) for j in omega}


def sum_wap_relevance(lv, omega, num_levels) -> dict[int, float]:
    """TPAMI Property 1 with uniform weights: ``sum_{p <= l} (1/L) / |{j : l_j >= p}|``."""
    at_least = {p: sum(1 for j in omega if lv[j] >= p) for p in range(1, num_levels + 1)}
    return {j: sum(1.0 / num_levels / at_least[p] for p in range(1, lv[j] + 1)) for j in omega}


def hap_query(s, lv, omega, num_levels, rel_fn=hap_relevance, smooth=True):
    """TPAMI Eq. 21 (``smooth=True``) or the exact H-AP of Eq. 19 (``smooth=False``), one query."""
    rel = rel_fn(lv, omega, num_levels)
    pos = [k for k in omega if lv[k] > 0]
    if not pos:
        return None
    r = sup_ranks(s, lv, omega)
    total = 0.0
    for k in pos:
        h_rank = rel[k] + sum(min(rel[k], rel[j]) * step(s[j] - s[k]) for j in pos if j != k)
        rank = r[k][0] + r[k][1] if smooth else exact_rank(s, omega, k)
        total = total + h_rank / rank
    return 1 - total / sum(rel[k] for k in pos)


def ndcg_query(s, lv, omega, smooth=True):
    """TPAMI Eq. 24 (``smooth=True``) or 1 - NDCG (Eq. 23), gains ``2^l - 1``, one query."""
    pos = [k for k in omega if lv[k] > 0]
    if not pos:
        return None
    r = sup_ranks(s, lv, omega)
    dcg = 0.0
    for k in pos:
        rank = r[k][0] + r[k][1] if smooth else exact_rank(s, omega, k)
        dcg = dcg + (2.0 ** lv[k] - 1) / torch.log2(1 + torch.as_tensor(rank, dtype=torch.float64))
    gains = sorted((2.0 ** lv[k] - 1 for k in pos), reverse=True)
    idcg = sum(g / math.log2(1 + r_) for r_, g in enumerate(gains, start=1))
    return 1 - dcg / idcg


def ap_query(s, lv, omega):
    """Exact ``1 - AP`` with pessimistic ties, one query."""
    pos = [k for k in omega if lv[k] > 0]
    if not pos:
        return None
    total = 0.0
    for k in pos:
        rank_plus = 1 + sum(step(s[j] - s[k]) for j in pos if j != k)
        total += rank_plus / exact_rank(s, omega, k)
    return 1 - total / len(pos)


def calibration_query(s, lv, omega, alpha=0.9, beta=0.6):
    """ROADMAP Eq. 7, one query."""
    pos = [j for j in omega if lv[j] > 0]
    neg = [j for j in omega if lv[j] == 0]
    if not pos:
        return None
    t = sum(torch.clamp(alpha - s[j], min=0) for j in pos) / len(pos)
    if neg:
        t = t + sum(torch.clamp(s[j] - beta, min=0) for j in neg) / len(neg)
    return t


def calibration_violating_pairs(x, lab, alpha=0.9, beta=0.6):
    """The reference code's averaging: mean over violating positive pairs + over violating negative pairs."""
    xn = x / x.norm(dim=1, keepdim=True)
    s = xn @ xn.T
    pos_terms, neg_terms = [], []
    for i in range(x.shape[0]):
        for j in range(x.shape[0]):
            if i == j:
                continue
            if shared_levels(lab[i], lab[j]) > 0:
                v = alpha - s[i, j]
                if v > 0:
                    pos_terms.append(v)
            else:
                v = s[i, j] - beta
                if v > 0:
                    neg_terms.append(v)
    mean = lambda t: sum(t) / len(t) if t else torch.zeros((), dtype=x.dtype)  # noqa: E731
    return mean(pos_terms) + mean(neg_terms)


def proxy_dg(x, lab, proxies, temperature=0.05):
    """TPAMI Eq. 8, loops over samples and proxies."""
    total = 0.0
    for i in range(x.shape[0]):
        v = x[i] / x[i].norm()
        logits = [torch.dot(v, p / p.norm()) / temperature for p in proxies]
        y = int(lab[i].reshape(-1)[0])
        total = total - (logits[y] - torch.logsumexp(torch.stack(logits), 0))
    return total / x.shape[0]
