"""The top-level modules shared by metrics and losses: registry, validation, labels, similarity (each against a
brute-force loop written here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.labels import random_hierarchy

from rankopt.checks import check_embeddings, check_finite_scalar, check_labels
from rankopt.labels import as_label_matrix, relevance_levels, same_class, self_mask
from rankopt.registries import Registry
from rankopt.similarity import pairwise


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
