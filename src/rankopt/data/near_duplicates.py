"""Near-duplicate photos (copies, re-encodings, resized versions, burst shots) found by their difference hash.

A validation that searches a photo among its own copies counts a copy as a hit: it is no validation. ``rankopt
fit`` therefore keeps each group of near-duplicates on one side of every split it makes
(:func:`rankopt.fit.validation.make_split`). Two photos of one class are near-duplicates when their 64-bit
:func:`~rankopt.data.image_files.difference_hash` differ in at most :data:`NEAR_BITS` bits; groups are the connected
components of that relation. The hashes come from the decode check (:func:`~rankopt.data.image_files.image_hash`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from rankopt.data.image_files import image_hash

NEAR_BITS = 6
"""Most differing hash bits between two near-duplicates (measured on Caltech-101, ``benchmarks/results/
near_duplicates.md``: copies resized, re-encoded or cropped by a few per cent differ in at most this many; two
distinct photos of one category differ in more, but for a few per cent of the categories' closest pairs)."""
_BITS = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)
_BLOCK = 256


def photo_hashes(paths: Sequence[str], threads: int | None = None) -> np.ndarray:
    """``(N,)`` uint64 hashes of ``paths`` (:func:`~rankopt.data.image_files.image_hash`: the ones checked already are
    not decoded again); 0 for an image that cannot be decoded."""
    with ThreadPoolExecutor(max(1, threads or os.cpu_count() or 1)) as pool:
        found = list(pool.map(image_hash, paths, chunksize=64))
    return np.array([0 if h is None else h for h in found], dtype=np.uint64)


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(len(a), len(b))`` numbers of differing bits between uint64 hashes."""
    xor = np.bitwise_xor(a[:, None], b[None, :])
    return _BITS[xor.view(np.uint8)].reshape(*xor.shape, 8).sum(axis=-1, dtype=np.int64)


def duplicate_groups(hashes: np.ndarray, labels: np.ndarray, max_bits: int = NEAR_BITS) -> np.ndarray:
    """``(N,)`` group ids: photos of one class (``labels``) whose hashes differ in at most ``max_bits`` bits are
    linked, and photos linked directly or through others share a group; a photo without a near-duplicate is a
    group of its own."""
    hashes, labels = np.asarray(hashes, dtype=np.uint64), np.asarray(labels)
    rows, cols = [], []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        for start in range(0, members.size, _BLOCK):
            block = members[start:start + _BLOCK]
            near = np.argwhere(hamming(hashes[block], hashes[members]) <= max_bits)
            rows.append(block[near[:, 0]])
            cols.append(members[near[:, 1]])
    n = hashes.size
    graph = coo_matrix((np.ones(sum(r.size for r in rows), dtype=np.int8),
                        (np.concatenate([np.zeros(0, np.int64), *rows]),
                         np.concatenate([np.zeros(0, np.int64), *cols]))), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def grouped_count(groups: np.ndarray) -> int:
    """Photos in a group of two or more."""
    sizes = np.bincount(groups)
    return int(sizes[sizes > 1].sum())
