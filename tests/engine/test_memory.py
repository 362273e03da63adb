"""Cross-batch memory: ring order, stale-copy exclusion, warm-up, weight, state round trip."""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F

from rankopt.engine.memory import CrossBatchMemory
from rankopt.losses import build


def _unit(n: int, d: int = 6) -> torch.Tensor:
    return F.normalize(torch.randn(n, d), dim=1)


class SpyLoss(torch.nn.Module):
    """Records every reference set it is given; value = number of reference items."""

    accepts_reference = True

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.Tensor, torch.Tensor] | None] = []

    def forward(self, e, y, ref_e=None, ref_y=None):
        self.calls.append(None if ref_e is None else (ref_e.clone(), ref_y.clone()))
        return e.sum() * 0 + (0.0 if ref_e is None else float(ref_e.shape[0]))


def test_ring_wraps_around_in_order() -> None:
    mem = CrossBatchMemory(5, 6, num_levels=2)
    batches = [(_unit(3), torch.stack([torch.arange(3) + 3 * b, torch.zeros(3, dtype=torch.long)], 1),
                torch.arange(3) + 3 * b) for b in range(3)]
    for emb, lab, idx in batches:
        mem.enqueue(emb, lab, idx)
    emb, lab, idx = mem.contents()
    all_emb = torch.cat([b[0] for b in batches])
    assert idx.tolist() == [4, 5, 6, 7, 8] and len(mem) == 5  # oldest first, 0..3 overwritten
    torch.testing.assert_close(emb, all_emb[4:])
    assert lab[:, 0].tolist() == [4, 5, 6, 7, 8]
    big = _unit(12)
    mem1 = CrossBatchMemory(5, 6)
    mem1.enqueue(big, torch.arange(12), torch.arange(100, 112))
    assert mem1.contents()[2].tolist() == [107, 108, 109, 110, 111]  # a batch larger than the memory: its last items
    torch.testing.assert_close(mem1.contents()[0], big[7:])


def test_reference_excludes_current_batch_items() -> None:
    mem = CrossBatchMemory(10, 6)
    mem.enqueue(_unit(8), torch.arange(8) % 3, torch.arange(8))
    _, ref_labels = mem.reference_for(torch.tensor([1, 5, 42]))
    assert ref_labels[:, 0].tolist() == [0, 2, 0, 1, 0, 1]  # indices 0, 2, 3, 4, 6, 7


def test_query_is_never_paired_with_a_stale_copy_of_itself() -> None:
    # Batch at step t-1 and t hold the same 4 images (indices 0..3) plus a different pair.
    # Stale copies have the query's label and a near-identical embedding: if they entered the
    # reference set each query would find itself at rank 1 and the loss would drop.
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    old = _unit(6)
    mem = CrossBatchMemory(20, 6, weight=1.0)
    mem.enqueue(old, labels, torch.tensor([0, 1, 2, 3, 10, 11]))
    new = F.normalize(old + 0.01 * torch.randn_like(old), dim=1)
    idx = torch.tensor([0, 1, 2, 3, 20, 21])
    spy = SpyLoss()
    mem.loss_with_memory(spy, new, labels, idx, step=0)
    ref_e, ref_y = spy.calls[1]
    torch.testing.assert_close(ref_e, old[4:])  # only the entries of other images
    assert ref_y[:, 0].tolist() == [2, 2]

    loss_fn = build("smooth_ap")
    value = mem.loss_with_memory(loss_fn, new, labels, idx, step=0)
    expected = loss_fn(new, labels) + loss_fn(new, labels, old[4:], labels[4:])
    with_stale = loss_fn(new, labels) + loss_fn(new, labels, old, labels)
    torch.testing.assert_close(value, expected)
    assert float(with_stale) < float(value) - 1e-3  # the stale copies would have changed the loss


@pytest.mark.parametrize("weight", [0.0, 0.25, 2.0])
def test_warmup_and_weight(weight: float) -> None:
    loss_fn = build("smooth_ap")
    mem = CrossBatchMemory(16, 6, warmup_steps=3, weight=weight)
    ref, ref_labels = _unit(10), torch.arange(10) % 4
    mem.enqueue(ref, ref_labels, torch.arange(100, 110))
    emb, labels, idx = _unit(8), torch.arange(8) % 4, torch.arange(8)
    batch_only = loss_fn(emb, labels)
    assert not mem.active(2) and mem.active(3)
    torch.testing.assert_close(mem.loss_with_memory(loss_fn, emb, labels, idx, step=2), batch_only)
    expected = batch_only + weight * loss_fn(emb, labels, ref, ref_labels)
    torch.testing.assert_close(mem.loss_with_memory(loss_fn, emb, labels, idx, step=3), expected)


def test_empty_memory_gives_the_batch_loss() -> None:
    loss_fn = build("smooth_ap")
    emb, labels = _unit(8), torch.arange(8) % 4
    value = CrossBatchMemory(16, 6).loss_with_memory(loss_fn, emb, labels, torch.arange(8), step=10)
    torch.testing.assert_close(value, loss_fn(emb, labels))


def test_state_round_trip_through_weights_only_load() -> None:
    mem = CrossBatchMemory(7, 6, num_levels=2, warmup_steps=2, weight=0.5)
    for b in range(3):
        mem.enqueue(_unit(4), torch.randint(0, 3, (4, 2)), torch.arange(4) + 4 * b)
    buffer = io.BytesIO()
    torch.save(mem.state_dict(), buffer)
    buffer.seek(0)
    restored = CrossBatchMemory(7, 6, num_levels=2, warmup_steps=2, weight=0.5)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    for a, b in zip(mem.contents(), restored.contents()):
        assert torch.equal(a, b)
    nxt = (_unit(3), torch.zeros(3, 2, dtype=torch.long), torch.arange(50, 53))
    mem.enqueue(*nxt)
    restored.enqueue(*nxt)
    for a, b in zip(mem.contents(), restored.contents()):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="size mismatch"):
        CrossBatchMemory(8, 6, num_levels=2).load_state_dict(mem.state_dict())


def test_bad_input() -> None:
    mem = CrossBatchMemory(8, 6)
    with pytest.raises(TypeError, match="accepts_reference"):
        mem.loss_with_memory(build("proxy_dg", num_classes=3, embedding_dim=6), _unit(4), torch.zeros(4, dtype=torch.long),
                             torch.arange(4), step=0)
    with pytest.raises(ValueError, match="6-d embeddings"):
        mem.enqueue(_unit(4, 5), torch.zeros(4, dtype=torch.long), torch.arange(4))
    with pytest.raises(ValueError, match="indices"):
        mem.enqueue(_unit(4), torch.zeros(4, dtype=torch.long), torch.arange(3))
    with pytest.raises(ValueError, match="NaN"):
        mem.enqueue(torch.full((2, 6), float("nan")), torch.zeros(2, dtype=torch.long), torch.arange(2))
    with pytest.raises(ValueError, match="size"):
        CrossBatchMemory(0, 6)
