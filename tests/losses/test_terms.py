"""Named loss terms (rankopt.losses.terms): what composite losses record, and nothing outside a block."""

from __future__ import annotations

import pytest
import torch

from rankopt.engine.memory import CrossBatchMemory
from rankopt.losses import build, terms


def _batch(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(32, 8, generator=gen), torch.arange(8).repeat_interleave(4)


@pytest.mark.parametrize("name, rank_term, dg_term, lam", [
    ("roadmap", "sup_ap", "calibration", 0.5), ("happier", "hap", "proxy_dg", 0.1),
    ("rod_ndcg", "sup_ndcg", "proxy_dg", 0.1), ("rod_recall", "sup_recall", "proxy_dg", 0.1),
])
def test_rod_records_its_two_unweighted_terms(name, rank_term, dg_term, lam):
    emb, labels = _batch()
    kwargs = {} if name == "roadmap" else {"num_classes": 8, "embedding_dim": 8}
    loss_fn = build(name, **kwargs)
    with terms.recording() as recorded:
        loss = loss_fn(emb, labels)
    assert set(recorded) == {rank_term, dg_term}
    assert float(loss) == pytest.approx((1 - lam) * recorded[rank_term] + lam * recorded[dg_term], rel=1e-6)
    rank_alone = loss_fn.rank_loss(emb, labels)
    assert recorded[rank_term] == pytest.approx(float(rank_alone), rel=1e-6)


def test_nothing_is_recorded_outside_a_block_and_blocks_nest():
    emb, labels = _batch()
    terms.record("stray", 1.0)  # no block: a no-op
    with terms.recording() as outer:
        with terms.recording() as inner:
            build("roadmap")(emb, labels)
        terms.record("x", 2.0)
        terms.record("x", 4.0)
    assert set(inner) == {"sup_ap", "calibration"}
    assert outer == {"x": 3.0}  # the mean of the values recorded twice


def test_memory_records_batch_and_memory_terms_with_prefixes():
    memory = CrossBatchMemory(64, 8)
    loss_fn = build("roadmap")
    emb, labels = _batch()
    memory.enqueue(*_batch(1), torch.arange(100, 132))
    with terms.recording() as recorded:
        total = memory.loss_with_memory(loss_fn, emb, labels, torch.arange(32), step=0)
    assert {"batch", "memory", "batch/sup_ap", "batch/calibration", "memory/sup_ap", "memory/calibration"} == set(recorded)
    assert float(total) == pytest.approx(recorded["batch"] + recorded["memory"], rel=1e-6)


@pytest.mark.parametrize("cls_name, expected", [("SupAPLoss", "sup_ap"), ("ProxyDGLoss", "proxy_dg"),
                                                ("HAPLoss", "hap"), ("SupNDCGLoss", "sup_ndcg"),
                                                ("CalibrationLoss", "calibration")])
def test_term_names(cls_name, expected):
    assert terms.term_name(type(cls_name, (), {})()) == expected
