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
ROW_GROUP = 4  # rows whose column counts are added together
FLOOR_MIN_K = 16  # below, an empty heap is filled by a plain scan (about k ln(n / k) insertions)


@nb.njit(inline="always", nogil=True)
def _sift_down(heap_values, heap_ids, pos, value, ref_id):  # pragma: no cover - compiled
    """Put ``(value, ref_id)`` at ``pos`` of a min-heap of scores whose subtrees below ``pos`` are heaps."""
    size = heap_values.shape[0]
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
def _heap_replace_min(heap_values, heap_ids, value, ref_id):  # pragma: no cover - compiled
    """Replace the root of a min-heap of scores (``value`` > root) and sift it down."""
    _sift_down(heap_values, heap_ids, 0, value, ref_id)


@nb.njit(nogil=True)
def _keep_best(values, ids, size, k):  # pragma: no cover - compiled
    """Reorder ``values[:size]`` (``ids`` alongside) so that ``values[:k]`` are its ``k`` largest: a
    quickselect with Hoare partitions around a median of three."""
    lo, hi, target = 0, size - 1, k - 1
    while lo < hi:
        a, b, c = values[lo], values[(lo + hi) // 2], values[hi]
        pivot = max(min(a, b), min(max(a, b), c))
        i, j = lo, hi
        while i <= j:
            while values[i] > pivot:
                i += 1
            while values[j] < pivot:
                j -= 1
            if i <= j:
                values[i], values[j] = values[j], values[i]
                ids[i], ids[j] = ids[j], ids[i]
                i += 1
                j -= 1
        if target <= j:  # [lo, j] >= pivot >= [i, hi], the pivot's value in between
            hi = j
        elif target >= i:
            lo = i
        else:
            break


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
def _scan_row(row, lo, hi, root, heap_values, heap_ids, base, excluded):  # pragma: no cover - compiled
    """Offer ``row[lo:hi]`` to a row's heap (minimum ``root``), skipping column ``excluded``; the new root.

    Scores are checked ``PROBE`` at a time against the root (one vectorised maximum) and looked at
    one by one only where that maximum exceeds it."""
    j0 = lo
    while j0 < hi:
        j1 = min(j0 + PROBE, hi)
        best = _chunk_max(row, j0, j1)
        if best > root:
            for j in range(j0, j1):
                if row[j] > root and j != excluded:
                    _heap_replace_min(heap_values, heap_ids, row[j], base + j)
                    root = heap_values[0]
        j0 = j1
    return root


@nb.njit(inline="always", nogil=True)
def _chunk_maxima(row, lo, hi, width, maxima, m):  # pragma: no cover - compiled
    """Append the maxima of ``row[lo:hi]``'s chunks of ``width`` to ``maxima`` (``m`` used); the new count."""
    for j0 in range(lo, hi, width):
        maxima[m] = _chunk_max(row, j0, min(j0 + width, hi))
        m += 1
    return m


@nb.njit(inline="always", nogil=True)
def _selection_floor(row, skip_lo, skip_hi, k, maxima, scratch):  # pragma: no cover - compiled
    """A score ``f`` with at least ``k + 1`` scores of ``row`` (outside ``[skip_lo, skip_hi)``) above it,
    hence below the row's ``k``-th best even without an excluded column; ``-inf`` for a short row.
    ``f`` lies just below the ``(k + 1)``-th largest maximum of chunks of up to ``PROBE`` scores (distinct
    chunks: ``k + 1`` scores), so that a few ``k`` scores lie above it. Not worth it for a small ``k``."""
    width = min(PROBE, (row.shape[0] - (skip_hi - skip_lo)) // (k + 1))
    if width < 2 or k < FLOOR_MIN_K:
        return -np.inf
    m = _chunk_maxima(row, 0, skip_lo, width, maxima, 0)
    m = _chunk_maxima(row, skip_hi, row.shape[0], width, maxima, m)
    _keep_best(maxima, scratch, m, k + 1)
    return np.nextafter(maxima[: k + 1].min(), -np.inf)


@nb.njit(inline="always", nogil=True)
def _fill_from_floor(row, lo, hi, floor, excluded, base, pool_values, pool_ids, m):  # pragma: no cover - compiled
    """Append the scores of ``row[lo:hi]`` above ``floor`` (column ``excluded`` left out) to the pool; the new count."""
    for j in range(lo, hi):  # written always, kept when above: no branch to mispredict
        pool_values[m] = row[j]
        pool_ids[m] = base + j
        m += (row[j] > floor) & (j != excluded)
    return m


@nb.njit(inline="always", nogil=True)
def _refill(heap_values, heap_ids, pool_values, pool_ids, m):  # pragma: no cover - compiled
    """The heap becomes the ``K`` best of its own entries and the ``m >= K`` pooled scores (quickselect, heapify)."""
    k = heap_values.shape[0]
    for s in range(k):
        if heap_values[s] > -np.inf:  # -inf: an empty slot
            pool_values[m] = heap_values[s]
            pool_ids[m] = heap_ids[s]
            m += 1
    _keep_best(pool_values, pool_ids, m, k)
    heap_values[:] = pool_values[:k]
    heap_ids[:] = pool_ids[:k]
    for pos in range(k // 2 - 1, -1, -1):
        _sift_down(heap_values, heap_ids, pos, heap_values[pos], heap_ids[pos])


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
    maxima = np.empty(n, dtype=scores.dtype)
    scratch = np.empty(n, dtype=np.int64)
    pool_values = np.empty(n + k, dtype=scores.dtype)
    pool_ids = np.empty(n + k, dtype=heap_ids.dtype)
    for i in range(lo, hi):
        row = scores[i]
        excluded = own[i]
        label = row_labels[i]
        if k > 0:
            floor = (_selection_floor(row, skip_lo, skip_hi, k, maxima, scratch) if heap_values[i, 0] == -np.inf
                     else -np.inf)
            if floor > -np.inf:  # a heap not yet full, a long row: the scores above the floor, selected at once
                m = _fill_from_floor(row, 0, skip_lo, floor, excluded, col_base, pool_values, pool_ids, 0)
                m = _fill_from_floor(row, skip_hi, n, floor, excluded, col_base, pool_values, pool_ids, m)
                _refill(heap_values[i], heap_ids[i], pool_values, pool_ids, m)
            else:
                root = _scan_row(row, 0, skip_lo, heap_values[i, 0], heap_values[i], heap_ids[i], col_base, excluded)
                _scan_row(row, skip_hi, n, root, heap_values[i], heap_ids[i], col_base, excluded)
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


@nb.njit(inline="always", nogil=True)
def _add_row_counts(row, thresholds, npos, counts):  # pragma: no cover - compiled
    """``counts[p] += #{j : row[j] >= thresholds[p]}`` for the row's first ``npos`` thresholds."""
    for p in range(npos):
        t = thresholds[p]
        c = 0
        for j in range(row.shape[0]):
            c += row[j] >= t
        counts[p] += c


@nb.njit(inline="always", nogil=True)
def _add_column_counts(scores, i0, i1, col_thresholds_t, num_thresholds, column_acc,  # pragma: no cover - compiled
                       offset):
    """``column_acc[p, offset + j] += #{i in [i0, i1) : scores[i, j] >= col_thresholds_t[p, offset + j]}``,
    ``p < num_thresholds``; :data:`ROW_GROUP` rows at once: one load and store of the counts per column."""
    n = scores.shape[1]
    for p in range(num_thresholds):
        a, t = column_acc[p, offset : offset + n], col_thresholds_t[p, offset : offset + n]
        if i1 - i0 == ROW_GROUP:
            r0, r1, r2, r3 = scores[i0], scores[i0 + 1], scores[i0 + 2], scores[i0 + 3]
            for j in range(n):
                a[j] += (r0[j] >= t[j]) + (r1[j] >= t[j]) + (r2[j] >= t[j]) + (r3[j] >= t[j])
        else:
            for i in range(i0, i1):
                row = scores[i]
                for j in range(n):
                    a[j] += row[j] >= t[j]


@nb.njit(nogil=True, cache=True)
def pair_counts(scores, lo, hi, row_thresholds, row_npos, row_counts, col_thresholds_t, num_col_thresholds, column_acc,
                col_offset):  # pragma: no cover - compiled
    """The counts alone of an off-diagonal tile of a symmetric product (no heaps), rows ``[lo, hi)``:
    ``row_counts`` as :func:`rows_pass`, and the columns' counts into ``column_acc`` at ``col_offset``
    (the tile's first column in the full ``(P, N)`` accumulator) as :func:`pair_pass`."""
    for i0 in range(lo, hi, ROW_GROUP):
        i1 = min(i0 + ROW_GROUP, hi)
        for i in range(i0, i1):
            _add_row_counts(scores[i], row_thresholds[i], row_npos[i], row_counts[i])
        _add_column_counts(scores, i0, i1, col_thresholds_t, num_col_thresholds, column_acc, col_offset)


@nb.njit(nogil=True, cache=True)
def pair_pass(scores, lo, hi, col_base, row_heap_values, row_heap_ids, row_thresholds, row_npos, row_counts,
              col_roots, floors, col_thresholds_t, column_acc, candidates,  # pragma: no cover - compiled
              candidate_rows, candidate_cols):
    """Serve the rows ``[lo, hi)`` of an off-diagonal tile of a symmetric product, and the columns for those rows.

    Rows as :func:`rows_pass` (every pair is a negative). Columns: ``column_acc[p, j] += #{i : s_ij >=
    col_thresholds_t[p, j]}`` (padding ``+inf``); a score above its column's heap minimum as the tile
    began (``col_roots``; ``floors`` from :func:`column_floors`) is written to ``candidates`` /
    ``candidate_rows`` / ``candidate_cols`` for :func:`merge_column_candidates`. Returns the number of
    candidates found (more than the buffers hold: none may then be merged).
    """
    n = scores.shape[1]
    k = row_heap_values.shape[1]
    capacity = candidates.shape[0]
    num_chunks = floors.shape[0]
    found = 0
    for i0 in range(lo, hi, ROW_GROUP):
        i1 = min(i0 + ROW_GROUP, hi)
        for i in range(i0, i1):
            row = scores[i]
            root = row_heap_values[i, 0] if k > 0 else np.inf
            for q in range(num_chunks if k > 0 else 0):  # rows and columns have heaps of the same k
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
                                candidate_rows[found] = i
                                candidate_cols[found] = j
                            found += 1
            _add_row_counts(row, row_thresholds[i], row_npos[i], row_counts[i])
        _add_column_counts(scores, i0, i1, col_thresholds_t, col_thresholds_t.shape[0], column_acc, 0)
    return found


@nb.njit(nogil=True, cache=True)
def merge_column_candidates(heap_values, heap_ids, candidates, candidate_rows, candidate_cols, num_candidates, row_base,
                            lo, hi):  # pragma: no cover - compiled
    """Offer :func:`pair_pass`'s candidates of the columns ``[lo, hi)`` to their heaps."""
    for c in range(num_candidates):
        j = candidate_cols[c]
        if lo <= j < hi and candidates[c] > heap_values[j, 0]:
            _heap_replace_min(heap_values[j], heap_ids[j], candidates[c], row_base + candidate_rows[c])


@nb.njit(nogil=True, cache=True)
def column_heaps_pass(scores, heap_values, heap_ids, row_base, lo, hi):  # pragma: no cover - compiled
    """Offer every score of the columns ``[lo, hi)`` to its column's heap: the fallback of :func:`pair_pass`
    when its candidate buffers ran out of room."""
    for i in range(scores.shape[0]):
        for j in range(lo, hi):
            if scores[i, j] > heap_values[j, 0]:
                _heap_replace_min(heap_values[j], heap_ids[j], scores[i, j], row_base + i)
