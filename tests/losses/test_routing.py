"""Explicit argument routing: ROD terms keyed by name like a sum's, and data arguments declared at registration."""

import pytest
from pytorch_metric_learning import losses as pml_losses

from rankopt import losses as L
from rankopt.config import load_config
from rankopt.engine.assembly import build_loss
from rankopt.losses.pml import DATA_ARGUMENTS, init_arguments, loss_class


def test_rod_terms_take_their_own_maps_like_a_sum():
    nested = L.build("happier", lam=0.3, hap={"alpha": 2.0, "tau": 0.05},
                     proxy_dg={"num_classes": 5, "embedding_dim": 4, "temperature": 0.1})
    flat = L.build("happier", lam=0.3, alpha=2.0, tau=0.05, num_classes=5, embedding_dim=4, temperature=0.1)
    assert repr(nested) == repr(flat)
    with pytest.raises(ValueError, match=r"\['tau'\] given both flat and in loss.kwargs.sup_ap"):
        L.build("roadmap", tau=0.01, sup_ap={"tau": 0.02})


def test_recipes_spell_the_terms():
    cfg = load_config("roadmap_sop_resnet50")
    assert cfg.loss.kwargs == {"lam": 0.5, "sup_ap": {"tau": 0.01, "rho": 100.0},
                               "calibration": {"alpha": 0.9, "beta": 0.6}}
    loss = build_loss(cfg, class_counts=[10], embedding_dim=8)
    assert (loss.rank_loss.tau, loss.rank_loss.rho, loss.decomposability_loss.alpha) == (0.01, 100.0, 0.9)
    rod = build_loss(load_config("rod_recall_sop", ["loss.kwargs.proxy_dg.temperature=0.1"]), class_counts=[10],
                     embedding_dim=8)
    assert rod.rank_loss.ks == (1, 2, 4, 8, 16) and rod.rank_loss.tau_star == 1.0
    assert rod.decomposability_loss.temperature == 0.1 and rod.decomposability_loss.proxies.shape == (10, 8)


def test_data_arguments_are_declared():
    assert L.data_arguments("rod_ap") == {"num_classes": "classes", "embedding_dim": "embedding_dim"}
    assert L.data_arguments("sum_nsm")["num_classes"] == "classes_per_level"
    assert L.data_arguments("roadmap") == {} and L.data_arguments("smooth_ap") == {}
    with pytest.raises(KeyError, match="unknown loss"):
        L.data_arguments("no_such_loss")


def test_the_pml_table_matches_pml():
    """The declared table of :mod:`rankopt.losses.pml` against PML's signatures (read here, in the test only)."""
    for name in (n for n in dir(pml_losses) if n.endswith("Loss")):
        try:
            taken = init_arguments(loss_class(name))
        except ValueError:
            continue
        expected = [n for n in ("num_classes", "embedding_size", "descriptors_dim") if n in taken]
        assert sorted(DATA_ARGUMENTS.get(name, ())) == sorted(expected), name
