"""Bad input gives clear errors; the registry builds every loss of the issue."""

from __future__ import annotations

import pytest
import torch

import rankopt.losses as L

EMBEDDING_ONLY = ["sup_ap", "smooth_ap", "calibration", "sup_recall", "smooth_recall", "hap", "sup_ndcg", "roadmap"]
WITH_PROXIES = ["proxy_dg", "rod_ap", "rod_recall", "happier", "rod_ndcg"]


def make(name: str):
    return L.build(name, num_classes=10, embedding_dim=4) if name in WITH_PROXIES else L.build(name)


def test_registry_has_every_loss_of_this_module():
    assert set(EMBEDDING_ONLY + WITH_PROXIES) <= set(L.LOSSES.names())
    with pytest.raises(KeyError, match="unknown loss 'nope'"):
        L.build("nope")


@pytest.mark.parametrize("name", EMBEDDING_ONLY + WITH_PROXIES)
def test_bad_inputs_raise_clear_errors(name):
    loss = make(name)
    x = torch.randn(6, 4)
    y = torch.tensor([0, 0, 1, 1, 2, 2])
    assert loss(x, y).ndim == 0
    bad = x.clone()
    bad[2, 1] = float("nan")
    with pytest.raises(ValueError, match="embeddings has 1 row.*NaN or Inf.*rows 2"):
        loss(bad, y)
    bad[2, 1] = float("inf")
    with pytest.raises(ValueError, match="NaN or Inf"):
        loss(bad, y)
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        loss(x, y.float())
    with pytest.raises(ValueError, match="labels has 5 rows but the embeddings have 6"):
        loss(x, y[:5])
    with pytest.raises(ValueError, match=r"labels must have shape \(N,\) or \(N, L\)"):
        loss(x, y.reshape(6, 1, 1))
    with pytest.raises(ValueError, match="at least 2 needed"):
        loss(x[:1], y[:1])
    with pytest.raises(ValueError, match="ref_embeddings given without ref_labels"):
        loss(x, y, x)
    with pytest.raises(ValueError, match="ref_labels given without ref_embeddings"):
        loss(x, y, None, y)


@pytest.mark.parametrize("name", EMBEDDING_ONLY)
def test_reference_set_checks(name):
    loss = make(name)
    assert loss.accepts_reference
    x, y = torch.randn(6, 4), torch.tensor([0, 0, 1, 1, 2, 2])
    with pytest.raises(ValueError, match="ref_embeddings have dimension 3 but embeddings have 4"):
        loss(x, y, torch.randn(3, 3), torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="ref_labels has 2 rows but the embeddings have 3"):
        loss(x, y, torch.randn(3, 4), torch.tensor([0, 1]))
    bad = torch.randn(3, 4)
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="ref_embeddings has 1 row"):
        loss(x, y, bad, torch.tensor([0, 1, 2]))


def test_proxy_loss_checks_and_refuses_references():
    loss = L.build("proxy_dg", num_classes=3, embedding_dim=4)
    assert not loss.accepts_reference
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 2, 2])
    with pytest.raises(ValueError, match=r"class indices in \[0, 3\)"):
        loss(x, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="dimension 5 but the proxies have 4"):
        loss(torch.randn(4, 5), y)
    with pytest.raises(ValueError, match="does not accept a reference set"):
        loss(x, y, x, y)
    # a ROD with proxies still takes a memory bank: only the rank loss sees it
    rod = L.build("rod_ap", num_classes=3, embedding_dim=4)
    assert rod(x, y, torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])).ndim == 0


@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("sup_ap", dict(tau=0.0), "tau > 0"),
        ("sup_ap", dict(similarity="l1"), "unknown similarity"),
        ("sup_ap", dict(max_elements=0), "max_elements"),
        ("smooth_ap", dict(tau=-1.0), "tau must be > 0"),
        ("calibration", dict(reduction="sum"), "unknown reduction"),
        ("sup_recall", dict(ks=()), "ks must be"),
        ("hap", dict(relevance="dcg"), "unknown relevance"),
        ("roadmap", dict(lam=1.5), r"lam must be in \[0, 1\]"),
        ("proxy_dg", dict(num_classes=0, embedding_dim=4), "num_classes >= 1"),
    ],
)
def test_bad_hyper_parameters(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        L.build(name, **kwargs)


def test_flat_losses_use_the_finest_label_column():
    x = torch.randn(12, 4)
    fine = torch.arange(12) // 3
    hier = torch.stack([fine, fine // 2], dim=1)
    for name in ("sup_ap", "smooth_ap", "sup_recall", "calibration"):
        torch.testing.assert_close(L.build(name)(x, hier), L.build(name)(x, fine))
    assert not torch.allclose(L.build("hap")(x, hier), L.build("hap")(x, fine))
