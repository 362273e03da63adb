"""numba kernels of the tiled evaluation (:mod:`rankopt.metrics.tiled`): one pass over a score tile.

Each kernel reads a ``(m, n)`` tile of scores once and updates, for the items it serves (its
rows; with :func:`pair_pass` also its columns, the transposed tile of a symmetric product),

* a bounded min-heap of the ``K`` best ``(score, reference)`` pairs seen so far (an item enters
  when it scores strictly above the heap's smallest score, so the multiset of the ``K`` best
  scores is exact; the order of tied items is arbitrary, as with ``torch.topk``);
* ``cnt[., p] += #{negatives k : s_k >= t_p}``, the number of negatives scoring at least as high
  as each positive ``p`` of the item (``t``: the positives' scores, the item's first ``npos``).

The kernels are serial and release the GIL: :mod:`rankopt.metrics.tiled` runs them on row or column
ranges in a thread pool (numba's own OpenMP threads would spin against torch's after every product).
Imported lazily: importing numba and loading the kernels (compiled once, cached on disk) costs about a second.
"""

from __future__ import annotations

import numba as nb
import numpy as np

PROBE = 32  # scores checked together against the heaps' minima before any is inserted


@nb.njit(inline="always", nogil=True)
def _heap_replace_min(heap_values, heap_ids, value, ref_id):  # pragma: no cover - compiled
    """Replace the root of a min-heap of scores (``value`` > root) and sift it down."""
    size = heap_values.shape[0]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        if child + 1 < size and heap_values[child + 1] < heap_values[child]:
            child += 1
        if heap_values[child] >= value:
            break
        heap_values[pos] = heap_values[child]
        heap_ids[pos] = heap_ids[child]
        pos = child
    heap_values[pos] = value
    heap_ids[pos] = ref_id


@nb.njit(inline="always", nogil=True)
def _chunk_max(row, j0, j1):  # pragma: no cover - compiled
    """``max(row[j0:j1])``; a full chunk of ``PROBE`` scores is one vectorised loop of fixed length."""
    best = row[j0]
    if j1 - j0 == PROBE:
        chunk = row[j0 : j0 + PROBE]
        for jj in range(1, PROBE):
            best = max(best, chunk[jj])
    else:
        for j in range(j0 + 1, j1):
            best = max(best, row[j])
    return best


@nb.njit(inline="always", nogil=True)
def _scan_row(row, lo, hi, root, heap_values, heap_ids, base, excluded, floor):  # pragma: no cover - compiled
    """Offer ``row[lo:hi]`` to a row's heap (minimum ``root``), skipping column ``excluded``; the new root.

    Only scores above ``max(root, floor)`` are offered (``floor``: a lower bound of the row's ``K``-th
    best score, see :func:`_selection_floor`). Scores are checked ``PROBE`` at a time against it (one
    vectorised maximum) and looked at one by one only where that maximum exceeds it."""
    root = max(root, floor)
    j0 = lo
    while j0 < hi:
        j1 = min(j0 + PROBE, hi)
        best = _chunk_max(row, j0, j1)
        if best > root:
            for j in range(j0, j1):
                if row[j] > root and j != excluded:
                    _heap_replace_min(heap_values, heap_ids, row[j], base + j)
                    root = max(heap_values[0], floor)
        j0 = j1
    return root


@nb.njit(inline="always", nogil=True)
def _count_above(row, lo, hi, threshold):  # pragma: no cover - compiled
    c = 0
    for j in range(lo, hi):
        c += row[j] > threshold
    return c


@nb.njit(nogil=True)
def _selection_floor(row, skip_lo, skip_hi, k):  # pragma: no cover - compiled
    """A score ``f`` with at least ``k + 1`` scores of ``row`` (outside ``[skip_lo, skip_hi)``) above it,
    hence below the row's ``k``-th best even without an excluded column, with at most about ``2 k``
    above it: a bisection on the value range. Filling an empty heap with only the scores above ``f``
    spares the ``k ln(n / k)`` replacements of a plain scan."""
    low = np.inf
    high = -np.inf
    for j in range(skip_lo):
        low, high = min(low, row[j]), max(high, row[j])
    for j in range(skip_hi, row.shape[0]):
        low, high = min(low, row[j]), max(high, row[j])
    floor = np.nextafter(low, -np.inf)  # every score lies above it
    for _ in range(24):
        mid = floor + (high - floor) / 2
        above = _count_above(row, 0, skip_lo, mid) + _count_above(row, skip_hi, row.shape[0], mid)
        if above >= k + 1:
            floor = mid
            if above <= 2 * k:
                break
        else:
            high = mid
    return floor


@nb.njit(inline="always", nogil=True)
def _count_at_least(row, lo, hi, threshold, labels, label, check_labels):  # pragma: no cover - compiled
    """``#{j in [lo, hi) : row[j] >= threshold}``, columns of ``label`` left out when ``check_labels``."""
    c = 0
    if check_labels:
        for j in range(lo, hi):
            c += (row[j] >= threshold) & (labels[j] != label)
    else:
        for j in range(lo, hi):
            c += row[j] >= threshold
    return c


@nb.njit(nogil=True, cache=True)
def rows_pass(scores, lo, hi, col_base, heap_values, heap_ids, thresholds, npos, counts, own, skip_lo, skip_hi,
              row_labels, col_labels, check_labels):  # pragma: no cover - compiled
    """Serve the tile's rows ``[lo, hi)``: heap updates and negative counts, columns ``[skip_lo, skip_hi)`` ignored.

    ``own[i]``: the tile column excluded from row ``i`` (``-1``: none). ``check_labels``: the tile
    may hold positives (columns whose label is the row's), which are not counted as negatives (they
    still enter the heaps); otherwise every column is a negative.
    """
    n = scores.shape[1]
    k = heap_values.shape[1]
    for i in range(lo, hi):
        row = scores[i]
        excluded = own[i]
        label = row_labels[i]
        if k > 0:
            floor = -np.inf
            if heap_values[i, 0] == -np.inf and n - (skip_hi - skip_lo) >= 4 * k:  # an empty heap, a long row
                floor = _selection_floor(row, skip_lo, skip_hi, k)
            root = _scan_row(row, 0, skip_lo, heap_values[i, 0], heap_values[i], heap_ids[i], col_base, excluded, floor)
            _scan_row(row, skip_hi, n, root, heap_values[i], heap_ids[i], col_base, excluded, floor)
        for p in range(npos[i]):
            t = thresholds[i, p]
            c = _count_at_least(row, 0, skip_lo, t, col_labels, label, check_labels)
            c += _count_at_least(row, skip_hi, n, t, col_labels, label, check_labels)
            if 0 <= excluded < n and not (skip_lo <= excluded < skip_hi) and row[excluded] >= t:
                if not check_labels or col_labels[excluded] != label:
                    c -= 1  # the excluded column was counted as a negative
            counts[i, p] += c


@nb.njit(nogil=True, cache=True)
def column_floors(col_heap_values, num_columns):  # pragma: no cover - compiled
    """The smallest heap minimum of each ``PROBE`` columns (``+inf`` without heaps), and the minima."""
    roots = np.full(num_columns, np.inf, dtype=col_heap_values.dtype)
    if col_heap_values.shape[1] > 0:
        for j in range(num_columns):
            roots[j] = col_heap_values[j, 0]
    num_chunks = (num_columns + PROBE - 1) // PROBE
    floors = np.empty(num_chunks, dtype=col_heap_values.dtype)
    for q in range(num_chunks):
        floors[q] = roots[q * PROBE : min(num_columns, (q + 1) * PROBE)].min()
    return floors, roots


@nb.njit(nogil=True, cache=True)
def pair_pass(scores, lo, hi, col_base, row_heap_values, row_heap_ids, row_thresholds, row_npos, row_counts,
              col_roots, floors, col_thresholds_t, column_acc, candidates, candidate_ids):  # pragma: no cover - compiled
    """Serve the rows ``[lo, hi)`` of an off-diagonal tile of a symmetric product, and the columns for those rows.

    Rows as :func:`rows_pass` (every pair is a negative). Columns: ``column_acc[p, j] += #{i : s_ij >=
    col_thresholds_t[p, j]}`` (padding ``+inf``); a score above its column's heap minimum as the tile
    began (``col_roots``; ``floors`` from :func:`column_floors`) is written to ``candidates`` /
    ``candidate_ids`` (``i * n + j``) for :func:`merge_column_candidates`. Returns the number of
    candidates found (more than the buffers hold: none may then be merged).
    """
    n = scores.shape[1]
    k = row_heap_values.shape[1]
    capacity = candidates.shape[0]
    num_thresholds = col_thresholds_t.shape[0]
    num_chunks = floors.shape[0]
    found = 0
    for i in range(lo, hi):
        row = scores[i]
        root = row_heap_values[i, 0] if k > 0 else np.inf
        for q in range(num_chunks):
            j0 = q * PROBE
            j1 = min(n, j0 + PROBE)
            best = _chunk_max(row, j0, j1)
            if best > root:
                for j in range(j0, j1):
                    if row[j] > root:
                        _heap_replace_min(row_heap_values[i], row_heap_ids[i], row[j], col_base + j)
                        root = row_heap_values[i, 0]
            if best > floors[q]:
                for j in range(j0, j1):
                    if row[j] > col_roots[j]:
                        if found < capacity:
                            candidates[found] = row[j]
                            candidate_ids[found] = i * n + j
                        found += 1
        for p in range(row_npos[i]):
            t = row_thresholds[i, p]
            c = 0
            for j in range(n):
                c += row[j] >= t
            row_counts[i, p] += c
        for p in range(num_thresholds):
            a = column_acc[p]
            t = col_thresholds_t[p]
            for j in range(n):
                a[j] += row[j] >= t[j]
    return found


@nb.njit(nogil=True, cache=True)
def merge_column_candidates(heap_values, heap_ids, candidates, candidate_ids, num_candidates, n, row_base, lo,
                            hi):  # pragma: no cover - compiled
    """Offer :func:`pair_pass`'s candidates of the columns ``[lo, hi)`` to their heaps."""
    for c in range(num_candidates):
        j = candidate_ids[c] % n
        if lo <= j < hi and candidates[c] > heap_values[j, 0]:
            _heap_replace_min(heap_values[j], heap_ids[j], candidates[c], row_base + candidate_ids[c] // n)


@nb.njit(nogil=True, cache=True)
def column_heaps_pass(scores, heap_values, heap_ids, row_base, lo, hi):  # pragma: no cover - compiled
    """Offer every score of the columns ``[lo, hi)`` to its column's heap: the fallback of :func:`pair_pass`
    when its candidate buffers ran out of room."""
    for i in range(scores.shape[0]):
        for j in range(lo, hi):
            if scores[i, j] > heap_values[j, 0]:
                _heap_replace_min(heap_values[j], heap_ids[j], scores[i, j], row_base + i)
