"""Batch samplers: m-per-class structure, coverage, determinism, DDP sharding, small classes, resume."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from rankopt.data import HierarchicalBatchSampler, MPerClassBatchSampler, build_batch_sampler


def _labels(num_classes=30, low=4, high=13, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    sizes = rng.integers(low, high, size=num_classes)
    lab = np.repeat(np.arange(num_classes), sizes)
    return lab[rng.permutation(lab.size)]  # labels in arbitrary dataset order


def _hier_labels(num_super=5, classes_per_super=8, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    fine = np.arange(num_super * classes_per_super)
    sizes = rng.integers(4, 9, size=fine.size)
    f = np.repeat(fine, sizes)
    return np.stack([f, f // classes_per_super], axis=1)


def test_m_per_class_structure_and_coverage():
    labels = _labels()
    s = MPerClassBatchSampler(labels, batch_size=24, m=4, seed=1)
    batches = list(s)
    assert len(batches) == len(s) > 0
    for b in batches:
        assert len(b) == 24 and len(set(b)) == 24  # no duplicate image
        counts = Counter(labels[b].tolist())
        assert len(counts) == 6 and set(counts.values()) == {4}
        # class-contiguous blocks of m
        assert all(len(set(labels[b[i : i + 4]].tolist())) == 1 for i in range(0, 24, 4))
    seen = set(itertools.chain.from_iterable(batches))
    # every image is visited once per epoch except those of the dropped incomplete last batch
    assert len(seen) >= labels.size - 24
    # images are visited at most twice (the top-up of a class's last chunk)
    visits = Counter(itertools.chain.from_iterable(batches))
    assert max(visits.values()) <= 2


def test_deterministic_given_seed_and_epoch():
    labels = _labels()
    a = MPerClassBatchSampler(labels, 24, 4, seed=5)
    b = MPerClassBatchSampler(labels, 24, 4, seed=5)
    assert list(a) == list(b)
    a.set_epoch(1)
    b.set_epoch(1)
    e1 = list(a)
    assert e1 == list(b)
    a.set_epoch(0)
    assert list(a) != e1
    assert list(MPerClassBatchSampler(labels, 24, 4, seed=6)) != list(b.__class__(labels, 24, 4, seed=5))


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("kind", ["m_per_class", "hierarchical"])
def test_ddp_shards_form_the_global_batch(world_size, kind):
    labels = _hier_labels()
    kwargs = {"seed": 3, "batch_size": 48, "m": 4}
    full = build_batch_sampler(kind, labels, rank=0, world_size=1, **kwargs)
    full.set_epoch(2)
    shards = []
    for rank in range(world_size):
        s = build_batch_sampler(kind, labels, rank=rank, world_size=world_size, **kwargs)
        s.set_epoch(2)
        shards.append(list(s))
        assert len(s) == len(full)
    for step, global_batch in enumerate(full):
        parts = [shards[r][step] for r in range(world_size)]
        assert sum(parts, []) == global_batch
        assert len({len(p) for p in parts}) == 1  # equal shard sizes


def test_world_size_must_divide_batch():
    with pytest.raises(ValueError, match="world_size"):
        MPerClassBatchSampler(_labels(), 24, 4, rank=0, world_size=5)
    with pytest.raises(ValueError, match="rank"):
        MPerClassBatchSampler(_labels(), 24, 4, rank=2, world_size=2)


def test_small_class_policies():
    labels = np.concatenate([np.repeat(np.arange(12), 6), [100, 100, 101]])  # 2 small classes
    small = {labels.size - 3, labels.size - 2, labels.size - 1}
    with pytest.warns(UserWarning, match="fewer than m"):
        drop = MPerClassBatchSampler(labels, 16, 4, seed=0, small_class_policy="drop")
    assert not small & set(itertools.chain.from_iterable(drop))

    fewer = MPerClassBatchSampler(labels, 16, 4, seed=0, small_class_policy="fewer")
    batches = list(fewer)
    got = set(itertools.chain.from_iterable(batches))
    assert small <= got
    for b in batches:
        assert len(set(b)) == len(b)  # never a duplicate
        counts = Counter(labels[b].tolist())
        assert len(counts) == 4
        assert counts.get(100, 2) == 2 and counts.get(101, 1) == 1  # all they have

    replace = MPerClassBatchSampler(labels, 16, 4, seed=0, small_class_policy="replace")
    for b in replace:
        counts = Counter(labels[b].tolist())
        assert set(counts.values()) == {4}
        big = [i for i in b if labels[i] < 100]
        assert len(set(big)) == len(big)  # duplicates only for the small classes

    with pytest.raises(ValueError, match="small_class_policy"):
        MPerClassBatchSampler(labels, 16, 4, small_class_policy="pad")


def test_state_dict_resume_mid_epoch():
    labels = _labels(40)
    ref = MPerClassBatchSampler(labels, 16, 4, seed=9)
    ref.set_epoch(3)
    expected = list(ref)
    run = MPerClassBatchSampler(labels, 16, 4, seed=9)
    run.set_epoch(3)
    it = iter(run)
    first = [next(it) for _ in range(5)]
    state = run.state_dict()
    assert state == {"seed": 9, "epoch": 3, "position": 5}
    resumed = MPerClassBatchSampler(labels, 16, 4, seed=9)
    resumed.load_state_dict(state)
    assert first + list(resumed) == expected
    assert list(resumed) == expected  # a finished pass rewinds: the next pass is the whole epoch
    with pytest.raises(ValueError, match="seed"):
        MPerClassBatchSampler(labels, 16, 4, seed=1).load_state_dict(state)


def test_hierarchical_batches_come_from_pairs_of_super_classes():
    labels = _hier_labels(num_super=5, classes_per_super=8)
    s = HierarchicalBatchSampler(labels, batch_size=32, m=4, seed=0, batches_per_super_tuple=3)
    batches = list(s)
    assert len(batches) == 10 * 3  # C(5, 2) pairs x 3
    pair_counts = Counter()
    for b in batches:
        assert len(b) == 32 and len(set(b)) == 32
        supers = Counter(labels[b, 1].tolist())
        assert len(supers) == 2 and set(supers.values()) == {16}
        fine = Counter(labels[b, 0].tolist())
        assert len(fine) == 8 and set(fine.values()) == {4}
        pair_counts[tuple(sorted(supers))] += 1
    assert set(pair_counts.values()) == {3} and len(pair_counts) == 10


def test_hierarchical_rejects_non_hierarchy_and_too_few_classes():
    labels = _hier_labels()
    bad = labels.copy()
    bad[0, 1] = (bad[0, 1] + 1) % 5
    with pytest.raises(ValueError, match="hierarchy"):
        HierarchicalBatchSampler(bad, 32, 4)
    with pytest.raises(ValueError, match="super-classes"):
        HierarchicalBatchSampler(labels, 160, 4)  # needs 20 classes per super-class


def test_bad_arguments():
    with pytest.raises(ValueError, match="multiple of m"):
        MPerClassBatchSampler(_labels(), 30, 4)
    with pytest.raises(ValueError, match="classes per batch.*a batch_size of at most 20 fits"):
        MPerClassBatchSampler(_labels(5), 40, 4)
    assert len(next(iter(MPerClassBatchSampler(_labels(5), 20, 4)))) == 20  # the batch the message suggests
    with pytest.raises(KeyError, match="unknown batch sampler"):
        build_batch_sampler("random", _labels(), 24, 4)
    with pytest.raises(ValueError, match="integer"):
        MPerClassBatchSampler(np.zeros(10), 4, 2)
