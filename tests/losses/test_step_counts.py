"""The sorted exact step counts (``step_counts="sorted"``) against brute force and the pairwise path.

Ties are made exact on purpose: dyadic embeddings with ``similarity="dot"`` (exact scores) and
duplicated embeddings; hierarchies whose coarsest level holds every item (every item a pivot).
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

import rankopt.losses as L
from rankopt.rank.surrogates import has_lower_item, level_step_counts, level_step_sums, pairwise_step_counts, positive_rank_weights

from . import reference as R
from .test_exactness import check

HIERARCHICAL = ["hap", "hap_sum_wap", "sup_ndcg", "happier", "rod_ndcg"]
FLAT = ["sup_ap", "sup_recall", "rod_ap"]


def build(case: str, step_counts: str, **kwargs) -> torch.nn.Module:
    """Loss ``case`` (``hap_sum_wap``: hap with the ΣwAP relevance); proxies drawn from a fixed seed."""
    name, extra = ("hap", dict(relevance="sum_wap")) if case == "hap_sum_wap" else (case, {})
    if name in ("happier", "rod_ndcg", "rod_ap"):
        extra.update(num_classes=40, embedding_dim=kwargs.pop("dim"))
    kwargs.pop("dim", None)
    torch.manual_seed(0)
    return L.build(name, step_counts=step_counts, **extra, **kwargs)


def tied_batch(seed: int, n: int, dim: int = 4, shared_top: bool = True, dtype=torch.float32):
    """Embeddings in multiples of 1/8 (dot products: exact multiples of 1/64, many ties, differences
    of the order of ``tau`` and ``delta``) with duplicates; labels ``(n, 3)``, the coarsest level
    shared by every item when ``shared_top``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, (n, dim), generator=g).to(dtype) / 8
    x[1], x[3] = x[0], x[2]
    fine = torch.randint(0, 8, (n,), generator=g)
    fine[:2] = 8  # items 0 and 1 (the first pivots) alone at levels 2-3: rows with fewer H^- pivots than others
    coarse = torch.zeros_like(fine) if shared_top else fine // 4
    return x, torch.stack([fine, fine // 2, coarse], dim=1)


def brute_counts(scores: torch.Tensor, levels: torch.Tensor, num_levels: int) -> torch.Tensor:
    out = torch.zeros(*scores.shape, num_levels, dtype=torch.float64)
    for c in range(scores.shape[0]):
        for k in range(scores.shape[1]):
            for j in range(scores.shape[1]):
                if levels[c, j] > 0 and float(scores[c, j]) >= float(scores[c, k]):
                    out[c, k, int(levels[c, j]) - 1] += 1
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_level_step_counts_match_brute_force_with_ties_and_padding(dtype):
    g = torch.Generator().manual_seed(0)
    scores = (torch.randint(0, 5, (6, 11), generator=g) / 4).to(dtype)  # quantised: many exact ties
    scores[0, :] = 0.25  # a row of equal scores
    levels = torch.randint(0, 4, (6, 11), generator=g)  # 0 = padding, counted nowhere
    counts = level_step_counts(scores, levels, 3)
    assert counts.dtype == dtype and counts.shape == (6, 11, 3)
    torch.testing.assert_close(counts.double(), brute_counts(scores, levels, 3), rtol=0, atol=0)
    assert counts[0].sum(1).tolist() == [float((levels[0] > 0).sum())] * 11  # all tied: every item counts
    one_hot = torch.nn.functional.one_hot(levels, 4)[..., 1:].to(dtype)
    for m in range(3):  # the pairwise reference, one level at a time
        pairwise = pairwise_step_counts(scores, scores, one_hot[..., m].unsqueeze(1).expand(-1, 11, -1))
        torch.testing.assert_close(counts[..., m], pairwise, rtol=0, atol=0)


def brute_sums(scores: torch.Tensor, levels: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum_{j : l_j > 0, s_j >= s_k} weights[c, l_k, l_j - 1, q]`` from the definition, float64."""
    weights = weights.double().expand(scores.shape[0], -1, -1, -1)
    out = torch.zeros(*scores.shape, weights.shape[3], dtype=torch.float64)
    for c in range(scores.shape[0]):
        for k in range(scores.shape[1]):
            for j in range(scores.shape[1]):
                if levels[c, j] > 0 and float(scores[c, j]) >= float(scores[c, k]):
                    out[c, k] += weights[c, int(levels[c, k]), int(levels[c, j]) - 1]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_level_step_sums_match_brute_force(dtype):
    """Per-row weights (one row shared too), ties, -0.0 next to +0.0, padding, a row of equal scores, an all-padding
    row; float32 takes the compiled walk (float64 sums), float64 the torch path; both against the float64 definition."""
    g = torch.Generator().manual_seed(1)
    scores = (torch.randint(-3, 4, (7, 13), generator=g) / 4).to(dtype)
    scores[1, :4] = torch.tensor([0.0, -0.0, 0.0, -0.0], dtype=dtype)
    scores[0] = 0.5
    levels = torch.randint(0, 4, (7, 13), generator=g)
    levels[6] = 0
    weights = torch.rand(7, 4, 3, 2, generator=g, dtype=torch.float64)
    for w in (weights, weights[:1]):
        sums = level_step_sums(scores, levels, w)
        assert sums.dtype == dtype and sums.shape == (7, 13, 2)
        torch.testing.assert_close(sums.double(), brute_sums(scores, levels, w), rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=0)
        torch.testing.assert_close(sums, level_step_sums(scores, levels, w, method="torch"), rtol=1e-6, atol=0)
    assert level_step_sums(scores, levels, weights)[6].abs().sum() == 0  # nothing counted in an all-padding row
    rank = level_step_sums(scores, levels, positive_rank_weights(3))[..., 0]  # counts: exact
    torch.testing.assert_close(rank.double(), brute_sums(scores, levels, positive_rank_weights(3)).squeeze(2), rtol=0, atol=0)
    assert rank[0, levels[0] > 0].tolist() == [float((levels[0] >= lvl).sum()) for lvl in levels[0, levels[0] > 0].tolist()]


def test_level_step_sums_refuse_bad_input():
    scores, levels = torch.zeros(2, 5), torch.ones(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"weights must be \(C or 1, L \+ 1, L, Q\)"):
        level_step_sums(scores, levels, torch.zeros(2, 3, 3, 1))
    with pytest.raises(ValueError, match="weights must be"):
        level_step_sums(scores, levels, torch.zeros(3, 4, 3, 1))
    with pytest.raises(ValueError, match="float32 CPU"):
        level_step_sums(scores.double(), levels, torch.zeros(1, 4, 3, 1), method="compiled")
    with pytest.raises(ValueError, match="256 levels"):
        level_step_sums(scores, levels, torch.zeros(1, 257, 256, 1), method="compiled")


def test_has_lower_item():
    levels = torch.tensor([[3, 2, 1, 1], [1, 1, 1, 0], [2, 2, 2, 2]], dtype=torch.int8)
    valid = torch.tensor([[True, True, True, True], [True, True, True, False], [True] * 4])
    expected = [[True, True, False, False], [False, False, False, False], [False] * 4]
    assert has_lower_item(levels, valid).tolist() == expected
    assert has_lower_item(levels, torch.ones_like(valid))[1].tolist() == [True, True, True, False]


@pytest.mark.parametrize("shared_top", [True, False])
@pytest.mark.parametrize("case", HIERARCHICAL + FLAT)
def test_sorted_matches_pairwise_with_ties(case, shared_top):
    """Same values and gradients as the pairwise path, float32, exact score ties, with and without chunking."""
    x, lab = tied_batch(1, 24, shared_top=shared_top)
    rx, rlab = tied_batch(2, 9, shared_top=shared_top)
    for kwargs, refs in [(dict(max_elements=1 << 20), ()), (dict(max_elements=64), (rx, rlab)), (dict(include_self=True), ())]:
        values, grads = [], []
        for mode in ("pairwise", "sorted"):
            xg = x.clone().requires_grad_(True)
            rg = [r.clone().requires_grad_(r.is_floating_point()) for r in refs]
            value = build(case, mode, similarity="dot", dim=x.shape[1], **kwargs)(xg, lab, *rg)
            value.backward()
            values.append(value)
            grads.append(torch.cat([xg.grad] + [r.grad for r in rg if r.is_floating_point()]))
        torch.testing.assert_close(values[1], values[0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)
        assert grads[1].abs().sum() > 0


@pytest.mark.parametrize(
    "case, ref_fn",
    [("hap", partial(R.hap_query, num_levels=3)), ("hap_sum_wap", partial(R.hap_query, num_levels=3, rel_fn=R.sum_wap_relevance)), ("sup_ndcg", R.ndcg_query)],
)
def test_shared_top_level_matches_brute_force(case, ref_fn):
    """float64 brute force (tests/losses/reference.py), coarsest level shared by every item, duplicated items."""
    x, lab = tied_batch(3, 14, dim=6, dtype=torch.float64)
    x = x + 0.1 * torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    x[1] = x[0]
    check(build(case, "sorted"), ref_fn, x, lab)


def test_shared_top_level_shrinks_the_kernel():
    """With the coarsest level shared by all, only the pivots above level 1 enter the H^- kernel: the torch sums'
    (C, A, M) blocks set the chunks; the compiled sums hold no such block, only (C, G <= L, M) masks."""
    fine = torch.arange(64) // 4
    lab = torch.stack([fine, fine // 4, torch.zeros_like(fine)], dim=1)
    batch = L.build("hap").retrieval_set(torch.randn(64, 8), lab)
    torch_rows = L.build("hap", step_counts="sorted", method="torch").elements_per_row(batch)
    compiled_rows = L.build("hap", step_counts="sorted", method="compiled").elements_per_row(batch)
    pairwise_rows = build("hap", "pairwise").elements_per_row(batch)
    assert (torch_rows, compiled_rows, pairwise_rows) == (15 * 64, 3 * 64, 63 * 64)  # 3 + 12 more relevant items; L = 3; 63 positives
    assert build("hap", "sorted").elements_per_row(batch) == compiled_rows  # CPU float32: "auto" compiles
    one_level = L.build("sup_ap", method="compiled").retrieval_set(torch.randn(64, 8), fine)
    assert L.build("sup_ap", method="compiled").elements_per_row(one_level) == 2 * 64  # the 8-byte (M,) factors


def test_unknown_step_counts():
    with pytest.raises(ValueError, match="step_counts"):
        L.build("hap", step_counts="fast")
