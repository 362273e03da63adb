"""Step functions, their smooth surrogates, and the per-pivot rank terms built on them.

Notation (TPAMI §3): for a query, ``s_j`` is the score of retrieved item ``j``; the
rank of a positive *pivot* ``k`` decomposes as (TPAMI Eq. 3, pessimistic ties)::

    rank(k) = 1 + sum_{j != k, l_j >= l_k} H(s_j - s_k) + sum_{j: l_j < l_k} H(s_j - s_k)
            = rank^+(k)                                 + rank^-(k)

with ``H(t) = 1 if t >= 0 else 0`` and ``l`` the relevance level. Rank losses
replace ``H`` in ``rank^-`` (SupRank) or in both terms (Smooth-AP) by a smooth
surrogate. The per-pivot terms are evaluated for ``C`` queries, ``P`` pivots per
query (padded) and ``M`` retrieved items — never ``M^3``:

:func:`sigmoid_sums` and :func:`sup_rank_sums` are fused autograd functions: on CPU one compiled pass each way
(:mod:`rankopt.rank._surrogate_kernels`, ``method`` chosen by :mod:`rankopt.kernels`); the reference is evaluated
in blocks of :data:`KERNEL_BLOCK` elements ``(rows, P, M)`` that stay in cache (:data:`GPU_KERNEL_BLOCK` on a GPU):
the values and the derivative are computed in place in two reused block buffers, the sums over items and the
gradients are batched products (``bmm``), and the backward recomputes the derivative block by block: no ``(C, P, M)``
tensor is allocated (fresh pages of such tensors cost more on CPU than the whole recomputation).

Items are split into ``G`` masks (``(C, G, M)``, bool or 0/1 floats, e.g. the negatives, or for
hierarchical labels the items of level ``< l`` for each ``l``); each pivot uses the mask
``group[c, p]``.
"""

from __future__ import annotations

import math

import torch

from rankopt import kernels
from rankopt.threads import ThreadPool

KERNEL_BLOCK = 1 << 20
"""Elements of one ``(rows, P, M)`` block of the fused kernels (4 MiB of float32 per buffer, two buffers)."""
GPU_KERNEL_BLOCK = 1 << 26
"""Elements of one block on a GPU: a block costs a kernel launch per pass, so GPUs take blocks 64x larger
(256 MiB of float32 per buffer) than the CPU's cache-sized ones."""


def heaviside(t: torch.Tensor) -> torch.Tensor:
    """The pessimistic step ``H(t) = 1 if t >= 0 else 0`` (TPAMI Eq. 3): ties count."""
    return (t >= 0).to(t.dtype)


def default_delta(tau: float = 0.01, eps: float = 1e-2) -> float:
    """``delta = tau * ln((1 - eps) / eps)`` (ROADMAP supp. A.3): where ``sigma'`` drops below ``eps``."""
    if not 0.0 < eps < 0.5:
        raise ValueError(f"eps must be in (0, 0.5), got {eps}")
    return tau * math.log((1.0 - eps) / eps)


def sup_step(t: torch.Tensor, tau: float = 0.01, rho: float = 100.0, delta: float | None = None,
             start: float = 0.5) -> torch.Tensor:
    """SupRank ``H^-`` (ROADMAP Eq. 4 = TPAMI Eq. 4)::

        H^-(t) = sigma(t / tau)                                  t < 0
               = sigma(t / tau) + start                          0 <= t <= delta
               = rho * (t - delta) + sigma(delta / tau) + start  t > delta

    The linear offset is *computed*, so ``H^-`` is continuous at ``delta`` for any
    parameters (the reference code's hard-coded 1.44 and missing ``-delta`` are not
    reproduced, cf. ROADMAP #12). With the paper's ``start = 0.5``, ``H^- >= H``
    everywhere (ties ``t = 0`` take the upper branch, matching the pessimistic step), and
    ``H^- - start * H`` is continuous at 0: ``H^-`` jumps at 0 by ``start``, exactly
    ``start`` times the jump of the step it bounds. ``start = 0`` gives a surrogate
    continuous everywhere but no longer an upper bound on ``(0, delta)``.
    """
    delta = default_delta(tau) if delta is None else delta
    offset = 1.0 / (1.0 + math.exp(-delta / tau)) + start
    smooth = torch.sigmoid(t / tau) + start * (t >= 0).to(t.dtype)
    return torch.where(t > delta, rho * (t - delta) + offset, smooth)


class _SurrogateSums(torch.autograd.Function):
    """``S[c, p, g] = sum_k masks[c, g, k] * f((s[c, k] - t[c, p]) / tau)`` with ``f = sigma`` (no ``cap``)
    or ``f(u) = sigma(min(u, cap)) + start * H(u) + rho_tau * [u - cap]_+`` (``H^-`` in units of ``tau``).
    ``compiled`` (CPU): one pass of :mod:`rankopt.rank._surrogate_kernels` each way, rows split over
    ``torch.get_num_threads()`` threads; else (the reference) dense passes over blocks of rows (:func:`_blocks`) whose
    backward recomputes ``f'`` block by block. Saved: the scaled scores, the pivots and the masks, no ``(C, P, M)``
    tensor."""

    @staticmethod
    def forward(ctx, scores, pivot_scores, masks, tau: float, cap: float | None,  # type: ignore[override]
                rho_tau: float, start: float, compiled: bool):
        scaled, pivots = scores / tau, pivot_scores / tau
        # the masks are the left factor of every product: (G, M) x (M, P) is faster on CPU than (P, M) x (M, G)
        # (measured: benchmarks/results/losses.md)
        weights = masks.to(scaled.dtype).contiguous()  # (C, G, M)
        ctx.save_for_backward(scaled, pivots, weights)
        ctx.tau, ctx.cap, ctx.rho_tau, ctx.compiled = tau, cap, rho_tau, compiled
        sums = scaled.new_empty(pivots.shape[0], weights.shape[1], pivots.shape[1])  # (C, G, P)
        if compiled:
            _run_compiled("surrogate_sums", scaled, pivots, weights, cap, start, rho_tau, sums)
        else:
            _dense_sums(scaled, pivots, weights, cap, rho_tau, start, sums)
        return sums.transpose(1, 2)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        scaled, pivots, weights = ctx.saved_tensors
        grad = (grad.to(scaled.dtype) / ctx.tau).transpose(1, 2).contiguous()  # (C, G, P)
        d_scores, d_pivots = torch.empty_like(scaled), torch.empty_like(pivots)
        if ctx.compiled:
            _run_compiled("surrogate_gradient", scaled, pivots, weights, ctx.cap, grad, ctx.rho_tau, d_scores, d_pivots)
            return d_scores, d_pivots, None, None, None, None, None, None
        cap = ctx.cap
        at_cap = 0.0 if cap is None else 1.0 / (1.0 + math.exp(-cap))
        extra_slope = ctx.rho_tau - at_cap * (1.0 - at_cap)  # on the linear branch: rho_tau instead of sigma'(cap)
        for rows, slope, beyond in _blocks(scaled, pivots):
            if cap is not None:
                torch.gt(slope, cap, out=beyond)  # the linear branch, as floats
                slope.clamp_(max=cap)  # sigma'(min(u, cap)): sigma'(cap) where u was capped
            slope.sigmoid_()
            slope.addcmul_(slope, slope, value=-1.0)  # sigma' = sigma (1 - sigma), in place
            if cap is not None:
                slope.add_(beyond, alpha=extra_slope)
            # dL/du[c,p,k] = slope[c,p,k] * sum_g grad[c,g,p] weights[c,g,k]; u = (s_k - t_p) / tau
            d_scores[rows] = (torch.bmm(grad[rows], slope) * weights[rows]).sum(1)
            d_pivots[rows] = -(torch.bmm(weights[rows], slope.transpose(1, 2)) * grad[rows]).sum(1)
        return d_scores, d_pivots, None, None, None, None, None, None


def _dense_sums(scaled, pivots, weights, cap: float | None, rho_tau: float, start: float, sums: torch.Tensor) -> None:
    """The reference forward of :class:`_SurrogateSums` into ``sums`` ``(C, G, P)``: dense passes over blocks of
    rows."""
    num_masks = weights.shape[1]
    if cap is not None:  # [w ; w s / tau]: counts and sums of the items beyond cap in one product
        beyond_left = torch.cat([weights, weights * scaled.unsqueeze(1)], dim=1)
    for rows, u, indicator in _blocks(scaled, pivots):
        if cap is None:
            torch.bmm(weights[rows], u.sigmoid_().transpose(1, 2), out=sums[rows])
            continue
        # the pessimistic step H(u)
        block = torch.bmm(weights[rows], torch.ge(u, 0.0, out=indicator).transpose(1, 2)).mul_(start)
        # sum_k w_k [u_k > cap] (u_k - cap) = sum_k w_k [.] s_k / tau - (t_p / tau + cap) #{.}
        beyond = torch.bmm(beyond_left[rows], torch.gt(u, cap, out=indicator).transpose(1, 2))
        block += rho_tau * (beyond[:, num_masks:] - (pivots[rows] + cap).unsqueeze(1) * beyond[:, :num_masks])
        sums[rows] = block.baddbmm_(weights[rows], u.clamp_(max=cap).sigmoid_().transpose(1, 2))


def _run_compiled(name: str, scaled: torch.Tensor, pivots: torch.Tensor, weights: torch.Tensor, cap: float | None,
                  *rest) -> None:
    """Call kernel ``name`` of :mod:`rankopt.rank._surrogate_kernels` over the rows in ``torch.get_num_threads()``
    threads; tensors go as numpy views (outputs written in place), ``cap`` (``None``: inf) in the scores' dtype."""
    from rankopt.rank import _surrogate_kernels as compiled  # noqa: PLC0415 - numba: slow import

    arrays = [t.detach().contiguous().numpy() for t in (scaled, pivots, weights)]
    arrays += [*compiled.exponentials(scaled.detach(), pivots.detach()),
               arrays[0].dtype.type(math.inf if cap is None else cap)]
    arrays += [arg.numpy() if isinstance(arg, torch.Tensor) else arg for arg in rest]
    kernel = getattr(compiled, name)
    with ThreadPool(torch.get_num_threads()) as pool:
        pool.run(lambda _, first, last: kernel(*arrays, first, last), scaled.shape[0])


def _blocks(scaled: torch.Tensor, pivots: torch.Tensor):
    """Yield ``(rows, u, buffer)`` over blocks of at most :data:`KERNEL_BLOCK` elements (at least one row):
    ``u = scaled[rows, None, :] - pivots[rows, :, None]`` written into one reused buffer, and a second
    reused buffer of the same shape (float indicators: faster than bool ones on CPU; measured:
    benchmarks/results/losses.md)."""
    num_rows, num_pivots, width = pivots.shape[0], pivots.shape[1], scaled.shape[1]
    block = KERNEL_BLOCK if scaled.device.type == "cpu" else GPU_KERNEL_BLOCK
    step = max(1, min(num_rows, block // max(1, num_pivots * width)))
    u_buffer = scaled.new_empty(step, num_pivots, width)
    other = scaled.new_empty(step, num_pivots, width)
    for first in range(0, num_rows, step):
        rows = slice(first, first + step)
        count = min(step, num_rows - first)
        u = torch.sub(scaled[rows].unsqueeze(1), pivots[rows].unsqueeze(2), out=u_buffer[:count])
        yield rows, u, other[:count]


def compiled_sums(method: str, scores: torch.Tensor) -> bool:
    """Whether ``method`` (:func:`rankopt.kernels.use_compiled`) runs the compiled sums (CPU, float32 or float64: one
    numba pass each way) rather than the reference (dense passes over ``(C, P, M)`` blocks, any device)."""
    applies = scores.device.type == "cpu" and scores.dtype in (torch.float32, torch.float64)
    got = f"float32 or float64 CPU scores, got {scores.dtype} on {scores.device}"
    return kernels.use_compiled(method, lambda: [] if applies else [got])


def sigmoid_sums(scores: torch.Tensor, pivot_scores: torch.Tensor, masks: torch.Tensor, tau: float,
                 method: str = "auto") -> torch.Tensor:
    """``(C, P, G)``: ``sum_{k in mask g} sigma((s_k - s_p) / tau)`` (Smooth-AP Eq. 6) for every pivot ``p`` and mask
    ``g``
    (``scores`` ``(C, M)``, ``pivot_scores`` ``(C, P)``, ``masks`` ``(C, G, M)`` bool or 0/1 floats; ``method``:
    :func:`compiled_sums`). Memory: the ``(C, G, M)`` float masks (reference: and two blocks of :data:`KERNEL_BLOCK`
    floats)."""
    return _SurrogateSums.apply(scores, pivot_scores, masks, float(tau), None, 0.0, 0.0, compiled_sums(method, scores))


def sup_rank_sums(
    scores: torch.Tensor,
    pivot_scores: torch.Tensor,
    masks: torch.Tensor,
    *,
    tau: float,
    rho: float,
    delta: float,
    start: float,
    method: str = "auto",
) -> torch.Tensor:
    """``(C, P, G)``: ``sum_{k in mask g} H^-(s_k - s_p)`` (TPAMI Eq. 5) for every pivot and mask, using
    ``H^-(t) = sigma(min(t, delta) / tau) + start * H(t) + rho * [t - delta]_+`` (= Eq. 4).

    ``method`` (:func:`compiled_sums`): the compiled sums evaluate ``H^-`` per pair (float32 rows within
    ``_surrogate_kernels.SPREAD_FLOAT32`` in float32, others in float64; sums in float64) with the dense path's float
    tests ``s_k >= s_p`` and ``fl(s_k / tau - s_p / tau) > delta / tau``; the reference sums the linear branch as
    ``rho * (sum s_k - n (s_p + delta))`` over the items beyond ``delta``. Memory: ``(C, G, M)`` float masks
    (reference: ``(C, 3G, M)``, masks times scores too, and two blocks of :data:`KERNEL_BLOCK` floats).
    """
    compiled = compiled_sums(method, scores)
    return _SurrogateSums.apply(scores, pivot_scores, masks, float(tau), float(delta) / float(tau),
                                float(rho) * float(tau), float(start), compiled)


class Pivots:
    """The positives of each query row, padded to ``P = max_i |P_i|``: ``index``, ``present``,
    ``scores`` (differentiable) and ``levels`` (int64, 0 for padding), all ``(C, P)``."""

    def __init__(self, scores: torch.Tensor, levels: torch.Tensor, valid: torch.Tensor) -> None:
        self.index, self.present = padded_columns((levels > 0) & valid)
        self.scores = torch.gather(scores, 1, self.index)
        self.levels = torch.gather(levels, 1, self.index).masked_fill_(~self.present, 0).long()

    def pair_mask(self) -> torch.Tensor:
        """``(C, P, P)`` bool: both pivots present and distinct (``j != k`` by index)."""
        both = self.present.unsqueeze(2) & self.present.unsqueeze(1)
        return both & ~torch.eye(self.index.shape[1], dtype=torch.bool, device=self.index.device)

    def positive_rank(self, num_levels: int) -> torch.Tensor:
        """Exact ``rank^+(k) = 1 + sum_{j != k, l_j >= l_k} H(s_j - s_k) = sum_{m >= l_k} N[k, m - 1]``
        (TPAMI Eq. 3, pessimistic ties, :func:`level_step_sums`), ``(C, P)``, no gradient."""
        return level_step_sums(self.scores, self.levels, positive_rank_weights(num_levels))[..., 0]

    def pairwise_positive_rank(self) -> torch.Tensor:
        """:meth:`positive_rank` by ``P^2`` comparisons per query (:func:`pairwise_step_counts`): the reference path."""
        weights = self.pair_mask() & (self.levels.unsqueeze(1) >= self.levels.unsqueeze(2))
        return 1.0 + pairwise_step_counts(self.scores, self.scores, weights.to(self.scores.dtype))

    def lower_masks(self, levels: torch.Tensor, valid: torch.Tensor, num_levels: int,
                    first: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``Omega_k^<`` as ``G = L - first`` float masks ``(C, G, M)`` (mask ``g``: valid items of level
        ``<= first + g``)
        and each pivot's mask index ``level - 1 - first`` (clamped at 0), ``(C, P)``. ``first > 0`` leaves out
        the masks of pivots at levels ``<= first``, which no pivot with a less relevant item uses when no row has
        a valid item below level ``first`` (:func:`lowest_levels`)."""
        bounds = torch.arange(first, num_levels, device=levels.device, dtype=levels.dtype).view(1, -1, 1)
        masks = torch.le(levels.unsqueeze(1), bounds,
                         out=self.scores.new_empty(levels.shape[0], bounds.shape[1], levels.shape[1]))
        return masks.mul_(valid.unsqueeze(1)), (self.levels - (1 + first)).clamp_(min=0)


def row_counts(mask: torch.Tensor) -> torch.Tensor:
    """``(C,)`` int64: the ``True`` entries of each row of a ``(C, M)`` bool mask, summed as int32 over blocks of
    :data:`KERNEL_BLOCK` elements (a bool row sum over a whole large matrix is slower on CPU:
    ``benchmarks/results/losses.md``)."""
    rows = max(1, KERNEL_BLOCK // max(1, mask.shape[1]))
    if mask.shape[0] <= rows:
        return mask.sum(1, dtype=torch.int32).long()
    return torch.cat([mask[first : first + rows].sum(1, dtype=torch.int32)
                      for first in range(0, mask.shape[0], rows)]).long()


def padded_columns(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``True`` columns of each row of a ``(C, M)`` bool mask, left-aligned and padded to
    ``K = max(1, max_c |row c|)``: ``index`` ``(C, K)`` int64 (0 for padding) and ``present`` ``(C, K)`` bool.
    Sparse masks: from ``nonzero``; dense ones (over 1/8 set): each column scattered to its slot ``cumsum - 1``."""
    counts = row_counts(mask)
    num = max(1, int(counts.max())) if counts.numel() else 1
    present = torch.arange(num, device=mask.device) < counts.unsqueeze(1)
    if 8 * int(counts.sum()) > mask.numel():
        slot = torch.where(mask, mask.cumsum(1, dtype=torch.int32) - 1, num).long()  # unset columns: a spare slot
        index = torch.zeros(mask.shape[0], num + 1, dtype=torch.long, device=mask.device)
        index.scatter_(1, slot, torch.arange(mask.shape[1], device=mask.device).expand_as(slot))
        return index[:, :num], present  # slots past a row's count were never written: 0
    rows, cols = mask.nonzero(as_tuple=True)
    slot = torch.arange(rows.numel(), device=rows.device) - (counts.cumsum(0) - counts)[rows]
    index = torch.zeros(mask.shape[0], num, dtype=torch.long, device=mask.device)
    index[rows, slot] = cols
    return index, present


def lowest_levels(levels: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``(C, 1)``: the lowest level of each row's valid items (the dtype's maximum for a row without any)."""
    return levels.masked_fill(~valid, torch.iinfo(levels.dtype).max).amin(1, keepdim=True)


def has_lower_item(levels: torch.Tensor, valid: torch.Tensor, lowest: torch.Tensor | None = None) -> torch.Tensor:
    """``(C, M)`` bool, from integer ``levels``: valid items ``k`` whose set ``Omega_k^< = {valid j : l_j < l_k}`` is
    not empty, i.e. ``l_k > min_{valid j} l_j`` (``lowest``: :func:`lowest_levels`, computed when not given).
    ``rank_s^-(k)`` is exactly 0 for the other pivots."""
    return valid & (levels > (lowest_levels(levels, valid) if lowest is None else lowest))


def level_step_counts(pivot_scores: torch.Tensor, pivot_levels: torch.Tensor, num_levels: int,
                      method: str = "auto") -> torch.Tensor:
    """``N[c, k, m - 1] = sum_j [l_j = m] H(s_j - s_k)`` for ``m = 1..L`` over the pivots ``j`` of row ``c``
    (``k`` itself included: ``H(0) = 1``, pessimistic ties), ``(C, P, L)`` in the scores' dtype, no gradient.

    ``pivot_scores`` ``(C, P)``; ``pivot_levels`` ``(C, P)`` in ``[0, L]``, 0 (padding) counted nowhere.
    Each row is sorted once; ``N[c, k]`` is the per-level count from the first sorted position whose
    score is ``>= s_k``: ``O(P log P + P L)`` per row instead of the ``P^2`` comparisons of
    :func:`pairwise_step_counts`. Exact for counts below ``2^24`` (float32). ``method``: one of
    :func:`compiled_steps` (same counts; compiled: :func:`level_step_sums` with one-hot weights).
    """
    if compiled_steps(method, pivot_scores, num_levels):
        one_hot = torch.eye(num_levels, dtype=torch.float64).expand(1, num_levels + 1, num_levels, num_levels)
        return level_step_sums(pivot_scores, pivot_levels, one_hot, method)
    with torch.no_grad():
        sorted_scores, order = pivot_scores.sort(dim=1)
        one_hot = torch.nn.functional.one_hot(torch.gather(pivot_levels, 1, order), num_levels + 1)
        suffix = torch.zeros(one_hot.shape[0], one_hot.shape[1] + 1, num_levels, dtype=pivot_scores.dtype,
                             device=pivot_scores.device)
        suffix[:, :-1] = one_hot[..., 1:].flip(1).cumsum(1).flip(1)
        first = torch.searchsorted(sorted_scores, pivot_scores, side="left")
        return torch.gather(suffix, 1, first.unsqueeze(2).expand(-1, -1, num_levels))


def level_step_sums(pivot_scores: torch.Tensor, pivot_levels: torch.Tensor, weights: torch.Tensor,
                    method: str = "auto") -> torch.Tensor:
    """``S[c, k, q] = sum_{m=1..L} weights[c, l_k, m - 1, q] N[c, k, m - 1]`` (``N``: :func:`level_step_counts`),
    ``(C, P, Q)`` in the scores' dtype, no gradient: per-pivot linear maps of the per-level counts whose weights depend
    on the row and the two levels only, e.g. ``rank^+`` (:meth:`Pivots.positive_rank`) or H-AP's ``H-rank^+``
    (TPAMI Eq. 18), without the ``(C, P, L)`` counts. ``weights`` ``(C or 1, L + 1, L, Q)`` (row ``l_k = 0``: padding).
    ``method`` (:func:`compiled_steps`): the compiled walk adds the weights in float64 during one walk of each sorted
    row, ``O(P log P + P (L + 1) Q)`` (sums of counts exact below ``2^24`` in float32); the reference weights
    :func:`level_step_counts` in the scores' dtype.
    """
    num_rows, num_levels = pivot_scores.shape[0], weights.shape[2]
    if tuple(weights.shape[1:3]) != (num_levels + 1, num_levels) or weights.shape[0] not in (1, num_rows):
        raise ValueError(f"weights must be (C or 1, L + 1, L, Q), got {tuple(weights.shape)} for {num_rows} rows")
    weights = weights.detach().expand(num_rows, *weights.shape[1:])
    if not compiled_steps(method, pivot_scores, num_levels):
        counts = level_step_counts(pivot_scores, pivot_levels, num_levels, method="reference")
        index = pivot_levels.long().reshape(num_rows, -1, 1, 1).expand(-1, -1, num_levels, weights.shape[3])
        per_pivot = torch.gather(weights.to(counts), 1, index)  # (C, P, L, Q): the row of each pivot's level
        return (per_pivot * counts.unsqueeze(3)).sum(2)
    from rankopt.rank import _step_kernels as compiled  # noqa: PLC0415 - numba: slow import

    with torch.no_grad():
        bits = pivot_scores.contiguous().view(torch.int32).numpy()
        levels = pivot_levels.contiguous().numpy()
        # the kernel's table (C, L + 1, (L + 1) Q): by item level m first (m = 0: zeros), then pivot level and output
        table = weights.new_zeros(num_rows, num_levels + 1, num_levels + 1, weights.shape[3], dtype=torch.float64)
        table[:, 1:] = weights.transpose(1, 2)
        table = table.view(num_rows, num_levels + 1, -1).numpy()
        out = torch.empty(*pivot_scores.shape, weights.shape[3], dtype=pivot_scores.dtype)
        array = out.numpy()
        with ThreadPool(torch.get_num_threads()) as pool:
            pool.run(lambda _, lo, hi: compiled.step_sums(bits[lo:hi], levels[lo:hi], table[lo:hi], array[lo:hi]),
                     num_rows)
        return out


def positive_rank_weights(num_levels: int) -> torch.Tensor:
    """The :func:`level_step_sums` weights of ``rank^+(k) = sum_{m >= l_k} N[k, m - 1]``: ``[m >= l]``,
    ``(1, L + 1, L, 1)``."""
    levels = torch.arange(num_levels + 1, dtype=torch.float64)
    return (levels[1:] >= levels.unsqueeze(1)).to(torch.float64).view(1, num_levels + 1, num_levels, 1)


def compiled_steps(method: str, scores: torch.Tensor, num_levels: int) -> bool:
    """Whether ``method`` (:func:`rankopt.kernels.use_compiled`) sorts by the compiled walk (CPU float32, fewer than
    :data:`~rankopt.kernels.MAX_COLUMNS` pivots and :data:`~rankopt.kernels.MAX_LEVELS` levels: numpy sort of packed
    keys, numba walk) rather than the reference (``torch.sort`` + ``searchsorted``, any device and dtype)."""
    applies = scores.device.type == "cpu" and scores.dtype == torch.float32
    applies = applies and scores.shape[1] < kernels.MAX_COLUMNS and num_levels < kernels.MAX_LEVELS
    got = (f"float32 CPU scores, < 2^24 pivots and < 256 levels, got {scores.dtype} on {scores.device}, "
           f"{scores.shape[1]} pivots, {num_levels} levels")
    return kernels.use_compiled(method, lambda: [] if applies else [got])


def pairwise_step_counts(pivot_scores: torch.Tensor, item_scores: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``sum_j weights[c, p, j] * H(s_j - s_p)`` over a small item set, ``(C, P)``, no gradient.

    ``pivot_scores`` ``(C, P)``, ``item_scores`` ``(C, J)``, ``weights`` ``(C, P, J)``.
    """
    with torch.no_grad():
        above = item_scores.unsqueeze(1) >= pivot_scores.unsqueeze(2)
        return (weights * above).sum(dim=2)


def sup_negative_rank(
    scores: torch.Tensor,
    pivots: Pivots,
    masks: torch.Tensor,
    group: torch.Tensor,
    *,
    tau: float,
    rho: float,
    delta: float,
    start: float,
    active: torch.Tensor | None = None,
    method: str = "auto",
) -> torch.Tensor:
    """``rank_s^-(k) = sum_{j in Omega_k^<} H^-(s_j - s_k)`` (TPAMI Eq. 5), ``(C, P)``; pivot ``k`` uses mask
    ``group[c, k]``.

    ``active`` ``(C, P)`` bool (optional): the pivots whose mask may be non-empty (:func:`has_lower_item`);
    only they enter the ``(C, A, M)`` kernel, the others get exactly 0. Pays when few pivots have a
    less relevant item, e.g. a coarsest level shared by the whole batch. ``method``: :func:`compiled_sums`.
    """
    kernel = dict(tau=tau, rho=rho, delta=delta, start=start, method=method)
    index, kept = padded_columns(active) if active is not None else (None, None)
    if index is None or index.shape[1] >= active.shape[1]:  # every pivot of some row is active: all enter the kernel
        sums = sup_rank_sums(scores, pivots.scores, masks, **kernel)
        return torch.gather(sums, 2, group.unsqueeze(2)).squeeze(2)
    sums = sup_rank_sums(scores, torch.gather(pivots.scores, 1, index), masks, **kernel)
    values = torch.gather(sums, 2, torch.gather(group, 1, index).unsqueeze(2)).squeeze(2) * kept
    return values.new_zeros(active.shape).scatter_add(1, index, values)
