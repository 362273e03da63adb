"""Batch samplers (yield lists of dataset indices), deterministic and sharded across ranks.

Both samplers build the *global* batches of an epoch from ``seed`` and ``epoch`` alone, so
every rank computes the same plan and yields its contiguous slice: the ranks' shards
concatenated in rank order are exactly the global batch. ``set_epoch(e)`` picks the plan;
``state_dict()`` / ``load_state_dict()`` store ``(seed, epoch, position)`` so a resumed run
continues mid-epoch (``position`` = batches already yielded; with a DataLoader that
prefetches, store the number of batches the trainer actually consumed instead). ``set_epoch``
rewinds to the start of the epoch, so call ``load_state_dict`` after it when resuming.

Classes with fewer than ``m`` images follow an explicit ``small_class_policy``:

- ``"drop"``: such classes are never sampled (default for :class:`MPerClassBatchSampler`).
- ``"fewer"``: they contribute all their images (fewer than ``m``), so batches may be smaller
  than ``batch_size``; never a duplicate.
- ``"replace"``: images are repeated to reach ``m`` (duplicates in a batch: only if asked).

Classes with at least ``m`` images never yield a duplicate inside a batch. With ``"fewer"``
a batch of ``n`` images is split into shards of ``ceil(n / world_size)`` or one less.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

SMALL_CLASS_POLICIES = ("drop", "fewer", "replace")


def _label_column(labels: Any, level: int) -> np.ndarray:
    arr = labels.cpu().numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"labels must be an (N,) or (N, L) integer array, got {arr.dtype} {arr.shape}")
    if not -arr.shape[1] <= level < arr.shape[1]:
        raise ValueError(f"label level {level} out of range for {arr.shape[1]} level(s)")
    return arr[:, level]


def _distributed(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Explicit rank/world_size, else those of the initialised process group, else (0, 1)."""
    initialised = torch.distributed.is_available() and torch.distributed.is_initialized()
    if world_size is None:
        world_size = torch.distributed.get_world_size() if initialised else 1
    if rank is None:
        rank = torch.distributed.get_rank() if initialised else 0
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    return rank, world_size


class _ClassPool:
    """Images grouped by class in a random order, read cyclically from per-class offsets."""

    def __init__(self, column: np.ndarray, rng: np.random.Generator) -> None:
        self.sizes = np.unique(column, return_counts=True)[1]
        self.order = np.lexsort((rng.random(column.size), column))
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])

    def take(self, cls: np.ndarray, offsets: np.ndarray, m: int, policy: str) -> list[np.ndarray]:
        """For class positions ``cls``: images ``offset .. offset+m-1`` modulo the class size.

        Distinct while the class has ``>= m`` images; smaller classes give all their
        images (``fewer``) or cycle (``replace``)."""
        sizes = self.sizes[cls]
        pos = (offsets[:, None] + np.arange(m)[None, :]) % sizes[:, None]
        idx = self.order[self.starts[cls][:, None] + pos]
        if policy == "fewer":
            return [row[: min(m, int(s))] for row, s in zip(idx, sizes)]
        return list(idx)


class _ShardedBatchSampler(Sampler[list[int]]):
    """Common part: epoch plans, sharding, resumable position."""

    def __init__(
        self, labels: Any, level: int, batch_size: int, m: int, seed: int, rank: int | None, world_size: int | None,
        policy: str
    ) -> None:
        if m < 1 or batch_size < 1 or batch_size % m:
            raise ValueError(f"batch_size ({batch_size}) must be a positive multiple of m ({m})")
        if policy not in SMALL_CLASS_POLICIES:
            raise ValueError(f"small_class_policy must be one of {SMALL_CLASS_POLICIES}, got {policy!r}")
        self.rank, self.world_size = _distributed(rank, world_size)
        if batch_size % self.world_size:
            raise ValueError(f"batch_size ({batch_size}) must be divisible by world_size ({self.world_size})")
        self.batch_size, self.m, self.seed, self.small_class_policy = batch_size, m, int(seed), policy
        self.epoch, self.position = 0, 0
        self._plan_cache: tuple[int, list[np.ndarray]] | None = None
        self.column = _label_column(labels, level)
        self.eligible = _eligible(np.unique(self.column, return_counts=True)[1], m, policy)

    def _plan(self, rng: np.random.Generator) -> list[np.ndarray]:
        raise NotImplementedError

    def global_batches(self, epoch: int | None = None) -> list[np.ndarray]:
        """The epoch's global batches (every rank computes the same list)."""
        epoch = self.epoch if epoch is None else epoch
        if self._plan_cache is None or self._plan_cache[0] != epoch:
            self._plan_cache = (epoch, self._plan(np.random.default_rng([self.seed, epoch])))
        return self._plan_cache[1]

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self.position = int(epoch), 0

    def __len__(self) -> int:
        return len(self.global_batches())

    def __iter__(self) -> Iterator[list[int]]:
        """This rank's shards from ``position`` on; a finished pass rewinds to the epoch start."""
        batches = self.global_batches()
        while self.position < len(batches):
            shard = np.array_split(batches[self.position], self.world_size)[self.rank]
            self.position += 1
            yield shard.tolist()
        self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"sampler state has seed {state['seed']} but this sampler uses seed {self.seed}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def _eligible(sizes: np.ndarray, m: int, policy: str) -> np.ndarray:
    small = sizes < m
    if small.any() and policy == "drop":
        warnings.warn(f"{int(small.sum())} class(es) have fewer than m={m} images and are dropped "
                      "(small_class_policy='drop')", stacklevel=3)
    return ~small if policy == "drop" else np.ones_like(small)


class MPerClassBatchSampler(_ShardedBatchSampler):
    """PK batches: ``batch_size // m`` distinct classes with ``m`` images each.

    Per epoch, each class's images are shuffled and cut into ``ceil(n_c / m)`` chunks of ``m``
    (the last chunk is completed with other images of the same class, never duplicates), so
    every image of an eligible class is visited at least once per epoch. Chunk ``k`` of class
    ``c`` gets the key ``(k + u_c) / n_chunks_c`` (``u_c`` uniform), which spreads each class
    evenly over the epoch; batches take chunks in key order, skipping a chunk whose class is
    already in the batch. An incomplete final batch is dropped. Labels: ``(N,)`` or ``(N, L)``
    (``level`` selects the column, 0 = finest).
    """

    def __init__(
        self,
        labels: Any,
        batch_size: int,
        m: int,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        small_class_policy: str = "drop",
        level: int = 0,
    ) -> None:
        super().__init__(labels, level, batch_size, m, seed, rank, world_size, small_class_policy)
        if int(self.eligible.sum()) < batch_size // m:
            raise ValueError(
                f"batch_size // m = {batch_size // m} classes per batch, but only {int(self.eligible.sum())} "
                f"class(es) are usable with m={m} and small_class_policy={small_class_policy!r}: a batch_size of at "
                f"most {int(self.eligible.sum()) * m} fits these labels (or more classes, or a smaller m)"
            )

    def _plan(self, rng: np.random.Generator) -> list[np.ndarray]:
        pool = _ClassPool(self.column, rng)
        cls = np.flatnonzero(self.eligible)
        n_chunks = np.where(pool.sizes[cls] >= self.m, -(-pool.sizes[cls] // self.m), 1)
        chunk_cls = np.repeat(cls, n_chunks)
        chunk_k = np.arange(chunk_cls.size) - np.repeat(np.cumsum(n_chunks) - n_chunks, n_chunks)
        u = rng.random(pool.sizes.size)
        key = (chunk_k + u[chunk_cls]) / np.repeat(n_chunks, n_chunks)
        order = np.argsort(key, kind="stable")
        chunks = pool.take(chunk_cls[order], chunk_k[order] * self.m, self.m, self.small_class_policy)
        groups = _distinct_groups(chunk_cls[order], self.batch_size // self.m)
        return [np.concatenate([chunks[i] for i in group]) for group in groups]


def _distinct_groups(classes: np.ndarray, per_group: int) -> list[list[int]]:
    """Greedy: consecutive positions into groups of ``per_group`` distinct classes; a position
    whose class is already in the open group waits for the next group. Leftovers are dropped."""
    groups: list[list[int]] = []
    current: list[int] = []
    seen: set[int] = set()
    waiting: list[int] = []
    for pos, c in enumerate(classes.tolist()):
        if c in seen:
            waiting.append(pos)
            continue
        current.append(pos)
        seen.add(c)
        while len(current) == per_group:
            groups.append(current)
            current, seen, still = [], set(), []
            for w in waiting:
                if len(current) < per_group and int(classes[w]) not in seen:
                    current.append(w)
                    seen.add(int(classes[w]))
                else:
                    still.append(w)
            waiting = still
    return groups


class HierarchicalBatchSampler(_ShardedBatchSampler):
    """The SOP protocol sampler (FastAP ``batchesPerMetaPair``; ROADMAP/HAPPIER): each batch is
    drawn from a tuple of ``super_classes_per_batch`` super-classes, each filling an equal share
    with ``m`` images from each of ``share // m`` distinct classes.

    One epoch = every combination of super-classes × ``batches_per_super_tuple``, in random
    order (SOP, 12 super-classes, 10 per pair: 660 batches). Within a super-class, classes are
    visited in a shuffled cyclic order and each class's images cyclically, so coverage is even
    and a class with ``>= m`` images never repeats an image in a batch (unlike the references,
    which sample with replacement). ``super_level`` is the label column of the super-classes
    (default: the coarsest), ``level`` that of the classes (default 0).
    """

    def __init__(
        self,
        labels: Any,
        batch_size: int,
        m: int,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        small_class_policy: str = "drop",
        super_classes_per_batch: int = 2,
        batches_per_super_tuple: int = 10,
        level: int = 0,
        super_level: int = -1,
    ) -> None:
        super().__init__(labels, level, batch_size, m, seed, rank, world_size, small_class_policy)
        if super_classes_per_batch < 1 or batch_size % (super_classes_per_batch * m):
            raise ValueError(
                f"batch_size ({batch_size}) must be a multiple of super_classes_per_batch*m "
                f"({super_classes_per_batch}*{m})"
            )
        if batches_per_super_tuple < 1:
            raise ValueError(f"batches_per_super_tuple must be >= 1, got {batches_per_super_tuple}")
        supers = _label_column(labels, super_level)
        classes, first = np.unique(self.column, return_index=True)
        pairs = np.unique(np.stack([self.column, supers], axis=1), axis=0)
        if len(pairs) != len(classes):
            raise ValueError("labels are not a hierarchy: some class belongs to several super-classes")
        self.class_super = supers[first]
        self.per_super = batch_size // (super_classes_per_batch * m)
        counts = np.bincount(np.unique(self.class_super, return_inverse=True)[1].ravel(), weights=self.eligible)
        self.super_ids = np.unique(self.class_super)[counts >= self.per_super]
        if len(self.super_ids) < super_classes_per_batch:
            raise ValueError(
                f"need {super_classes_per_batch} super-classes with >= {self.per_super} usable classes each; "
                f"only {len(self.super_ids)} have them"
            )
        self.super_classes_per_batch, self.batches_per_super_tuple = super_classes_per_batch, batches_per_super_tuple

    def _plan(self, rng: np.random.Generator) -> list[np.ndarray]:
        pool = _ClassPool(self.column, rng)
        members = {int(s): rng.permutation(np.flatnonzero((self.class_super == s) & self.eligible))
                   for s in self.super_ids}
        class_ptr = dict.fromkeys(members, 0)
        image_ptr = np.zeros(pool.sizes.size, dtype=np.int64)
        tuples = list(itertools.combinations(members, self.super_classes_per_batch)) * self.batches_per_super_tuple
        batches = []
        for t in rng.permutation(len(tuples)):
            parts: list[np.ndarray] = []
            for s in tuples[t]:
                cls = members[s][(class_ptr[s] + np.arange(self.per_super)) % members[s].size]
                class_ptr[s] += self.per_super
                parts.extend(pool.take(cls, image_ptr[cls], self.m, self.small_class_policy))
                image_ptr[cls] += self.m
            batches.append(np.concatenate(parts))
        return batches


SAMPLERS = {"m_per_class": MPerClassBatchSampler, "pk": MPerClassBatchSampler, "hierarchical": HierarchicalBatchSampler}


def build_batch_sampler(kind: str, labels: Any, batch_size: int, m: int, **kwargs: Any) -> _ShardedBatchSampler:
    """``kind`` in ``m_per_class`` (alias ``pk``) or ``hierarchical``; kwargs go to the sampler."""
    try:
        cls = SAMPLERS[kind.lower()]
    except KeyError:
        raise KeyError(f"unknown batch sampler {kind!r}; known: {', '.join(SAMPLERS)}") from None
    return cls(labels, batch_size, m, **kwargs)


__all__ = ["HierarchicalBatchSampler", "MPerClassBatchSampler", "SMALL_CLASS_POLICIES", "build_batch_sampler"]
