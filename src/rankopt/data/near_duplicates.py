"""Near-duplicate photos (copies, re-encodings, resized versions, burst shots) found by their difference hash.

A validation that searches a photo among its own copies counts a copy as a hit: it is no validation. ``rankopt
fit`` therefore keeps each group of near-duplicates on one side of every split it makes
(:func:`rankopt.fit.validation.make_split`). Two photos of one class are near-duplicates when their 256-bit
:func:`~rankopt.data.image_files.difference_hash` differ in at most :data:`NEAR_BITS` bits; groups are the connected
components of that relation. The hashes come from the decode check (:func:`~rankopt.data.image_files.image_hash`).
A crop of a few per cent is not found by this hash (measured), nor a mirrored copy.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from rankopt.data.image_files import HASH_SIDE, image_hash

NEAR_BITS = 12
"""Most differing hash bits (of 256) between two near-duplicates. Measured (``benchmarks/results/
near_duplicates.md``): on Caltech-101, 98 % of copies resized to half, all resized to double and 97 % re-encoded
at JPEG quality 60 are within it, against 1.6 % of the photos for their nearest distinct photo of the class; on
Extended Yale B's small grey faces 83 %, 100 % and 73 %, against 6 %; a crop of 3 % a side is not found."""
_BITS = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)
_BLOCK = 64


def photo_hashes(paths: Sequence[str], threads: int | None = None) -> np.ndarray:
    """``(N, bytes)`` uint8 hashes of ``paths`` (:func:`~rankopt.data.image_files.image_hash`: the ones checked
    already are not decoded again); zeros for an image that cannot be decoded."""
    with ThreadPoolExecutor(max(1, threads or os.cpu_count() or 1)) as pool:
        found = list(pool.map(image_hash, paths, chunksize=64))
    size = len(next((h for h in found if h is not None), b"\0" * (HASH_SIDE * HASH_SIDE // 8)))
    return np.array([np.frombuffer(h or b"\0" * size, dtype=np.uint8) for h in found],
                    dtype=np.uint8).reshape(len(found), size)


def hamming(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(len(a), len(b))`` numbers of differing bits between the hashes ``a`` ``(n, bytes)`` and ``b``."""
    return _BITS[np.bitwise_xor(a[:, None, :], b[None, :, :])].sum(axis=-1, dtype=np.int64)


def duplicate_groups(hashes: np.ndarray, labels: np.ndarray, max_bits: int = NEAR_BITS) -> np.ndarray:
    """``(N,)`` group ids: photos of one class (``labels``) whose hashes differ in at most ``max_bits`` bits are
    linked, and photos linked directly or through others share a group; a photo without a near-duplicate is a
    group of its own."""
    hashes, labels = np.asarray(hashes, dtype=np.uint8), np.asarray(labels)
    rows, cols = [], []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        for start in range(0, members.size, _BLOCK):
            block = members[start:start + _BLOCK]
            near = np.argwhere(hamming(hashes[block], hashes[members]) <= max_bits)
            rows.append(block[near[:, 0]])
            cols.append(members[near[:, 1]])
    n = len(hashes)
    graph = coo_matrix((np.ones(sum(r.size for r in rows), dtype=np.int8),
                        (np.concatenate([np.zeros(0, np.int64), *rows]),
                         np.concatenate([np.zeros(0, np.int64), *cols]))), shape=(n, n))
    return connected_components(graph, directed=False)[1]


def grouped_count(groups: np.ndarray) -> int:
    """Photos in a group of two or more."""
    sizes = np.bincount(groups)
    return int(sizes[sizes > 1].sum())
