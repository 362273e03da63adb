"""Sums of losses (rankopt.losses.sums): the value is Σ weight·term, every term is recorded, the reference set
goes to the terms that take one, and both config spellings give the same terms. Synthetic random data."""

from __future__ import annotations

import pytest
import torch

from rankopt.losses import LossSum, LossTerm, build, build_terms, loss_terms, terms

CLASSES, DIM = 6, 8
ARCFACE = {"num_classes": CLASSES, "embedding_dim": DIM}


def _batch(n: int = 24, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, DIM, generator=torch.Generator().manual_seed(seed)), torch.arange(n) % CLASSES


def test_sum_is_the_weighted_sum_of_its_recorded_terms():
    x, y = _batch()
    total = build_terms([LossTerm("arcface", 1.0, ARCFACE), LossTerm("smooth_ap", 0.5, {"tau": 0.02}),
                         LossTerm("roadmap", 2.0)])
    assert isinstance(total, LossSum) and total.accepts_reference
    with terms.recording() as recorded:
        value = total(x, y)
    arcface, smooth_ap, roadmap = total.terms
    expected = {"arcface": arcface(x, y), "smooth_ap": smooth_ap(x, y), "roadmap": roadmap(x, y)}
    assert {"arcface", "smooth_ap", "roadmap", "roadmap/sup_ap", "roadmap/calibration"} == set(recorded)
    for name, term in expected.items():
        assert recorded[name] == pytest.approx(float(term.detach()), rel=1e-6)
    weighted = expected["arcface"] + 0.5 * expected["smooth_ap"] + 2.0 * expected["roadmap"]
    torch.testing.assert_close(value, weighted, rtol=1e-6, atol=1e-6)
    leaf = x.clone().requires_grad_(True)
    total(leaf, y).backward()
    assert float(leaf.grad.abs().sum()) > 0 and float(arcface.losses[0].W.grad.abs().sum()) > 0


def test_reference_set_goes_to_the_terms_that_take_one():
    x, y = _batch()
    ref, ref_y = _batch(10, seed=1)
    total = build("arcface+smooth_ap", arcface=ARCFACE)
    arcface, smooth_ap = total.terms
    expected = arcface(x, y) + smooth_ap(x, y, ref, ref_y)
    torch.testing.assert_close(total(x, y, ref, ref_y), expected, rtol=1e-6, atol=1e-6)
    assert not build("arcface+cosface", arcface=ARCFACE, cosface=ARCFACE).accepts_reference


def test_both_spellings_give_the_same_terms():
    by_name = loss_terms("arcface+smooth_ap", {"arcface": {"margin": 20.0}, "smooth_ap": {"tau": 0.02}})
    listed = loss_terms("arcface+smooth_ap", {}, [{"name": "arcface", "kwargs": {"margin": 20.0}},
                                                  {"name": "smooth_ap", "weight": 1.0, "kwargs": {"tau": 0.02}}])
    assert by_name == listed == [LossTerm("arcface", 1.0, {"margin": 20.0}), LossTerm("smooth_ap", 1.0, {"tau": 0.02})]
    assert loss_terms("sup_ap", {"tau": 0.01}) == [LossTerm("sup_ap", 1.0, {"tau": 0.01})]
    assert isinstance(build_terms(loss_terms("smooth_ap", {})), type(build("smooth_ap")))  # one term: no sum


@pytest.mark.parametrize("name, kwargs, listed, message", [
    ("arcface+smooth_ap", {"tau": 0.01}, (), r"maps each term's name \(arcface, smooth_ap\)"),
    ("arcface+smooth_ap", {"cosface": {}}, (), r"got \['cosface'\]"),
    ("smooth_ap+", {}, (), "maps each term's name"),
    ("smooth_ap+smooth_ap", {}, (), r"term\(s\) \['smooth_ap'\] given twice"),
    ("roadmap", {}, [{"name": "arcface"}, {"name": "smooth_ap"}], "loss.name must be their sum 'arcface\\+smooth_ap'"),
    ("arcface+smooth_ap", {"tau": 1}, [{"name": "arcface"}, {"name": "smooth_ap"}], "loss.kwargs empty"),
    ("+smooth_ap", {}, [{"name": ""}, {"name": "smooth_ap"}], "every term needs a name"),
])
def test_bad_sums_are_clear_errors(name, kwargs, listed, message):
    with pytest.raises(ValueError, match=message):
        loss_terms(name, kwargs, listed)
