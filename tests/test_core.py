"""Core machinery shared by metrics and losses: registry, validation, labels, relevance, similarity.

References are brute-force loops written here from the definitions (TPAMI Eq. 20, Property 1)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rankopt.checks import check_embeddings, check_finite_scalar, check_labels
from rankopt.labels import as_label_matrix, relevance_levels, same_class, self_mask
from rankopt.rank.relevance import level_counts, ndcg_gains, relevance
from rankopt.registries import Registry
from rankopt.similarity import pairwise


def random_hierarchy(n: int, rng: np.random.Generator, fine: int = 6, per_coarse: int = 2) -> torch.Tensor:
    """(N, 3) consistent labels: fine -> middle (fine // per_coarse) -> coarse (middle // per_coarse)."""
    f = rng.integers(0, fine, size=n)
    m = f // per_coarse
    c = m // per_coarse
    return torch.as_tensor(np.stack([f, m, c], axis=1))


def test_registry_build_and_unknown_name():
    reg: Registry = Registry("widget")

    @reg.register("Foo")
    def make_foo(x: int = 1) -> tuple[str, int]:
        return ("foo", x)

    assert reg.build("foo", x=3) == ("foo", 3)
    assert "FOO" in reg and reg.names() == ["foo"]
    with pytest.raises(KeyError, match="unknown widget 'bar'; known: foo"):
        reg.build("bar")
    with pytest.raises(KeyError, match="already registered"):
        reg.register("foo")(lambda: None)


def test_check_embeddings_names_bad_rows():
    x = torch.randn(6, 4)
    x[2, 1] = float("nan")
    x[5, 0] = float("inf")
    with pytest.raises(ValueError, match=r"query has 2 row\(s\) with NaN or Inf values: rows 2, 5"):
        check_embeddings(x, "query")
    with pytest.raises(ValueError, match=r"shape \(N, D\)"):
        check_embeddings(torch.randn(3), "e")
    with pytest.raises(TypeError, match="floating"):
        check_embeddings(torch.ones(3, 2, dtype=torch.long), "e")
    with pytest.raises(ValueError, match="at least 2"):
        check_embeddings(torch.randn(1, 3), "e", min_rows=2)


def test_check_labels_shapes_and_dtypes():
    assert check_labels(torch.tensor([1, 2, 3]), 3).shape == (3, 1)
    assert check_labels(torch.zeros(3, 2, dtype=torch.int32), 3).dtype == torch.int64
    with pytest.raises(ValueError, match="has 2 rows but the embeddings have 3"):
        check_labels(torch.tensor([1, 2]), 3)
    with pytest.raises(TypeError, match="integer"):
        check_labels(torch.tensor([1.0, 2.0, 3.0]), 3)
    with pytest.raises(FloatingPointError, match="loss is not finite"):
        check_finite_scalar(torch.tensor(float("nan")), "loss")


def test_relevance_levels_and_self_mask():
    rng = np.random.default_rng(0)
    q, r = random_hierarchy(7, rng), random_hierarchy(9, rng)
    lv = relevance_levels(q, r)
    for i in range(7):
        for j in range(9):
            assert lv[i, j] == sum(int(q[i, c] == r[j, c]) for c in range(3))
    assert torch.equal(same_class(q, r), q[:, None, 0] == r[None, :, 0])
    m = self_mask(3, 8, query_offset=4)
    assert m.sum() == 3 and m[0, 4] and m[1, 5] and m[2, 6]
    assert as_label_matrix(torch.tensor([3, 4])).shape == (2, 1)


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_hap_relevance_matches_eq20(alpha):
    rng = np.random.default_rng(1)
    labels = random_hierarchy(20, rng)
    lv = relevance_levels(labels, labels)
    valid = ~self_mask(20, 20)
    rel = relevance(lv, 3, valid, kind="hap", alpha=alpha)
    for i in range(20):
        members = [j for j in range(20) if j != i]
        for j in range(20):
            level = int(lv[i, j])
            if j == i or level == 0:
                assert rel[i, j] == 0
                continue
            count = sum(1 for k in members if int(lv[i, k]) == level)
            assert rel[i, j] == pytest.approx((level / 3) ** alpha / count, rel=1e-12)


def test_sum_wap_relevance_matches_property1():
    rng = np.random.default_rng(2)
    labels = random_hierarchy(15, rng)
    lv = relevance_levels(labels, labels)
    valid = ~self_mask(15, 15)
    w = [0.5, 0.3, 0.2]
    rel = relevance(lv, 3, valid, kind="sum_wap", weights=w)
    counts = level_counts(lv, 3, valid)
    for i in range(15):
        for j in range(15):
            level = int(lv[i, j])
            if j == i or level == 0:
                assert rel[i, j] == 0
                continue
            expected = sum(w[p - 1] / float(counts[i, p:].sum()) for p in range(1, level + 1))
            assert rel[i, j] == pytest.approx(expected, rel=1e-12)


def test_relevance_errors_and_gains():
    lv = torch.tensor([[0, 1, 2]])
    with pytest.raises(ValueError, match="unknown relevance kind"):
        relevance(lv, 2, kind="nope")
    with pytest.raises(ValueError, match="sum_wap needs 2"):
        relevance(lv, 2, kind="sum_wap", weights=[1.0])
    assert ndcg_gains(lv).tolist() == [[0.0, 1.0, 3.0]]
    assert ndcg_gains(lv, "linear").tolist() == [[0.0, 1.0, 2.0]]
    assert ndcg_gains(lv, [0.0, 0.5, 4.0]).tolist() == [[0.0, 0.5, 4.0]]


def test_pairwise_similarities():
    q, r = torch.randn(4, 3, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    cos = pairwise(q, r, "cosine")
    for i in range(4):
        for j in range(5):
            expected = float(q[i] @ r[j] / (q[i].norm() * r[j].norm()))
            assert cos[i, j] == pytest.approx(expected, rel=1e-12)
            assert pairwise(q, r, "neg_l2")[i, j] == pytest.approx(-float((q[i] - r[j]).norm()), rel=1e-9)
    assert torch.allclose(pairwise(q, r, "dot"), q @ r.T)
    with pytest.raises(ValueError, match="unknown similarity"):
        pairwise(q, r, "manhattan")
