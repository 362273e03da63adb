"""1:1 verification of template pairs (the IJB-C protocol): exact ROC points, TAR at fixed FARs,
media averaging and template features.

* A pair is accepted at threshold ``t`` when its score is ``>= t``:
  ``FAR(t) = #{impostor pairs: s >= t} / #impostor pairs``, ``TAR(t) = #{genuine pairs: s >= t} / #genuine pairs``.
* Media averaging (Smooth-AP §5.1): the frames of a video are
  one instance, the mean of their embeddings (:func:`group_mean`).
* A template's feature (:func:`template_embeddings`) follows the insightface IJB-C evaluation
  (``recognition/_evaluation_/ijb/ijb_11.py``, ``image2template_feature``): the template's rows of
  each media are averaged, the media means summed (each media weighs the same, whatever its
  frame count) and the sum L2-normalised. A pair's score compares its two template features.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from numpy.typing import ArrayLike

from rankopt.checks import check_embeddings, check_integer
from rankopt.similarity import SIMILARITIES, pairwise

DEFAULT_FARS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
ROW_CHUNK = 65536  # embedding rows converted to float64 and summed at a time
PAIR_CHUNK = 1 << 20  # template pairs scored at a time


def _pairs(scores: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """``(P,)`` float64 scores and ``(P,)`` bool genuine flags, checked: finite, labels 0/1, both kinds present."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels)
    if s.ndim != 1 or y.shape != s.shape:
        raise ValueError(f"scores and labels must be two (P,) vectors, got shapes {s.shape} and {y.shape}")
    bad = np.flatnonzero(~np.isfinite(s))
    if bad.size:
        raise ValueError(f"scores: {bad.size} pair(s) with NaN or Inf scores, first pair {bad[0]} ({s[bad[0]]})")
    bad = np.flatnonzero((y != 0) & (y != 1))
    if bad.size:
        raise ValueError(f"labels: pair {bad[0]} has label {y[bad[0]].item()!r}; labels are 1 (genuine) or 0 "
                         "(impostor)")
    genuine = y == 1
    num_genuine = int(genuine.sum())
    if num_genuine == 0 or num_genuine == genuine.size:
        kind = "genuine (label 1)" if num_genuine == 0 else "impostor (label 0)"
        raise ValueError(f"labels: no {kind} pair among {genuine.size}; TAR and FAR need both kinds")
    return s, genuine


def _roc(s: np.ndarray, genuine: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = np.argsort(-s, kind="stable")
    s, genuine = s[order], genuine[order]
    last_of_tie = np.append(np.flatnonzero(s[1:] != s[:-1]), s.size - 1)  # a group of tied scores is one point
    accepted_genuine = np.cumsum(genuine)[last_of_tie]
    accepted_impostor = last_of_tie + 1 - accepted_genuine
    far = np.append(0, accepted_impostor) / (s.size - int(genuine.sum()))
    tar = np.append(0, accepted_genuine) / int(genuine.sum())
    return far, tar, np.append(np.inf, s[last_of_tie])


def roc_points(scores: ArrayLike, labels: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact ROC of scored pairs: ``(far, tar, thresholds)``, float64, one point per threshold.

    ``thresholds``: ``+inf`` (nothing accepted: FAR = TAR = 0), then every distinct score in
    decreasing order (each accepts all pairs scoring ``>=`` it, ties together), so ``far`` and ``tar``
    rise to 1. ``labels``: 1 genuine, 0 impostor. The points of
    ``sklearn.metrics.roc_curve(labels, scores, drop_intermediate=False)``.
    """
    return _roc(*_pairs(scores, labels))


def far_key(far: float) -> str:
    """The metric name of TAR at ``far``: ``tar@far=1e-04`` (the shortest exact mantissa)."""
    return "tar@far=" + np.format_float_scientific(far, trim="-", exp_digits=2)


@dataclass(frozen=True)
class OperatingPoint:
    """The operating point chosen for a ``target`` FAR: the lowest ``threshold`` whose ``far`` (FAR) does not
    exceed the target, with its ``tar`` (TAR); ``measurable`` is False when there are fewer than ``1 / target``
    impostor pairs (no accepted impostor can keep FAR <= target)."""

    target: float
    threshold: float
    far: float
    tar: float
    measurable: bool


def operating_points(scores: ArrayLike, labels: ArrayLike,
                     fars: Sequence[float] = DEFAULT_FARS) -> list[OperatingPoint]:
    """One :class:`OperatingPoint` per target FAR: ``t* = min {t : FAR(t) <= far}`` over the ROC thresholds
    (:func:`roc_points`: ``+inf``, then every distinct score), ``TAR(t*) = max {TAR(t) : FAR(t) <= far}``
    (never interpolated; the achievable FARs are multiples of ``1 / #impostors``, fewer with ties).
    ``t* = +inf`` (TAR 0) when even the top score group holds too many impostors."""
    s, genuine = _pairs(scores, labels)
    far, tar, thresholds = _roc(s, genuine)
    num_impostors = int((~genuine).sum())
    out = []
    for target in fars:
        if not 0.0 < target <= 1.0:
            raise ValueError(f"fars: {target!r} is not a false accept rate in (0, 1]")
        # far is non-decreasing with far[0] = 0: the last point with far <= target has the lowest threshold
        point = int(np.searchsorted(far, target, side="right")) - 1
        out.append(OperatingPoint(float(target), float(thresholds[point]), float(far[point]), float(tar[point]),
                                  num_impostors * target >= 1.0 - 1e-9))
    return out


def tar_at_far(scores: ArrayLike, labels: ArrayLike, fars: Sequence[float] = DEFAULT_FARS) -> dict[str, float]:
    """TAR at each target FAR, keyed by :func:`far_key`: ``max {TAR(t) : FAR(t) <= far}``, i.e. TAR at the
    lowest threshold whose FAR does not exceed the target (:func:`operating_points`).

    The thresholds include ``+inf`` (:func:`roc_points`), so when even the top score group holds too
    many impostors the value is 0.0, a real operating point. The value is NaN when the target is not
    measurable: fewer than ``1 / far`` impostor pairs, where no accepted impostor can have FAR <= far.
    Unlike insightface's table (the ROC point whose FAR is nearest the target, possibly above it),
    the FAR here never exceeds the target.
    """
    return {far_key(p.target): p.tar if p.measurable else math.nan for p in operating_points(scores, labels, fars)}


def _ids(values: ArrayLike, name: str, shape: tuple[int | None, ...]) -> torch.Tensor:
    """``values`` as an int64 CPU tensor of ``shape`` (``None``: any length), checked."""
    v = check_integer(torch.as_tensor(np.asarray(values)), name)
    if v.ndim != len(shape) or any(want is not None and got != want for got, want in zip(v.shape, shape)):
        wanted = ", ".join("rows" if want is None else str(want) for want in shape)
        raise ValueError(f"{name} must have shape ({wanted}{',' if len(shape) == 1 else ''}), got {tuple(v.shape)}")
    return v.long()


def _row_sums(embeddings: torch.Tensor, rows: torch.Tensor | None, group: torch.Tensor,
              num_groups: int) -> torch.Tensor:
    """``(num_groups, D)`` float64: ``sums[group[k]] += embeddings[rows[k]]`` (``rows=None``: row ``k``),
    ``ROW_CHUNK`` rows at a time (a memory-mapped set is never copied whole)."""
    sums = torch.zeros((num_groups, embeddings.shape[1]), dtype=torch.float64, device=embeddings.device)
    group = group.to(embeddings.device)
    for start in range(0, group.numel(), ROW_CHUNK):
        part = slice(start, start + ROW_CHUNK)
        block = embeddings[part] if rows is None else embeddings[rows[part].to(embeddings.device)]
        sums.index_add_(0, group[part], block.to(torch.float64))
    return sums


def group_mean(embeddings: torch.Tensor, groups: ArrayLike) -> tuple[torch.Tensor, torch.Tensor]:
    """``(means (G, D), group_ids (G,))``: ``means[g] = mean{embeddings[i] : groups[i] == group_ids[g]}``
    (media averaging, Smooth-AP §5.1), summed in float64, returned in ``embeddings``' dtype;
    ``group_ids`` int64, increasing."""
    check_embeddings(embeddings, "embeddings")
    group_ids, group = torch.unique(_ids(groups, "groups", (embeddings.shape[0],)), sorted=True, return_inverse=True)
    sums = _row_sums(embeddings, None, group, group_ids.numel())
    counts = torch.bincount(group, minlength=group_ids.numel()).to(sums)
    return (sums / counts.unsqueeze(1)).to(embeddings.dtype), group_ids


def template_embeddings(item_embeddings: torch.Tensor, media: ArrayLike,
                        templates: ArrayLike) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features (T, D), template_ids (T,))``: the IJB-C template features, float64, unit norm
    (zero where the embeddings sum to zero), ``template_ids`` increasing (as :func:`group_mean`).

    ``media``: ``(N,)`` the media id of each item (a video's frames share one); ``templates``:
    ``(M, 2)`` rows ``(template_id, item_index)``, an item possibly in several templates. Feature of
    template ``t``: ``normalize(Σ_m mean{x_i : (t, i) a row, media[i] = m})`` over the media ``m`` of
    its rows (insightface ``image2template_feature``: frames averaged per media, media weighed alike).
    """
    check_embeddings(item_embeddings, "item_embeddings")
    num_items = item_embeddings.shape[0]
    media_of = _ids(media, "media", (num_items,))
    table = _ids(templates, "templates", (None, 2))
    if table.shape[0] == 0:
        raise ValueError("templates has no rows")
    items = table[:, 1]
    bad = ((items < 0) | (items >= num_items)).nonzero().flatten()
    if bad.numel():
        row = int(bad[0])
        raise ValueError(f"templates row {row}: item index {int(items[row])} is outside [0, {num_items}) "
                         f"({bad.numel()} such row(s))")
    template_media, group = torch.unique(torch.stack([table[:, 0], media_of[items]], dim=1), dim=0, return_inverse=True)
    sums = _row_sums(item_embeddings, items, group, template_media.shape[0])
    media_means = sums / torch.bincount(group, minlength=template_media.shape[0]).to(sums).unsqueeze(1)
    template_ids, owner = torch.unique(template_media[:, 0], sorted=True, return_inverse=True)
    features = torch.zeros((template_ids.numel(), sums.shape[1]), dtype=torch.float64, device=sums.device)
    features.index_add_(0, owner.to(sums.device), media_means)
    return F.normalize(features, dim=1), template_ids


def _template_rows(template_ids: torch.Tensor, wanted: torch.Tensor, column: int) -> torch.Tensor:
    """The row of each id of ``wanted`` in the increasing ``template_ids``; unknown ids raise."""
    rows = torch.searchsorted(template_ids, wanted.contiguous()).clamp(max=template_ids.numel() - 1)
    missing = (template_ids[rows] != wanted).nonzero().flatten()
    if missing.numel():
        pair = int(missing[0])
        raise ValueError(f"template_pairs row {pair}: template {int(wanted[pair])} (column {column}) has no row in "
                         f"templates ({missing.numel()} such pair(s))")
    return rows


def verification_metrics(item_embeddings: torch.Tensor, media: ArrayLike, templates: ArrayLike,
                         template_pairs: ArrayLike,
                         similarity: str = "cosine", fars: Sequence[float] = DEFAULT_FARS) -> dict[str, float]:
    """IJB-C 1:1 verification: :func:`tar_at_far` of the template pairs scored on their
    :func:`template_embeddings`.

    ``template_pairs``: ``(P, 3)`` rows ``(template1, template2, label)``, label 1 genuine, 0 impostor.
    Scores are computed ``PAIR_CHUNK`` pairs at a time, never as a template x template matrix:
    ``<a, b>`` for ``cosine`` and ``dot``, ``-||a - b||`` for ``neg_l2``; on the unit-norm template
    features the three order the pairs alike, so the TARs do not depend on ``similarity``.
    """
    if similarity not in SIMILARITIES:
        raise ValueError(f"unknown similarity {similarity!r}; use one of {', '.join(SIMILARITIES)}")
    features, template_ids = template_embeddings(item_embeddings, media, templates)
    pairs = _ids(template_pairs, "template_pairs", (None, 3))
    first = _template_rows(template_ids.cpu(), pairs[:, 0], 0).to(features.device)
    second = _template_rows(template_ids.cpu(), pairs[:, 1], 1).to(features.device)
    scores = torch.empty(pairs.shape[0], dtype=torch.float64)
    for start in range(0, pairs.shape[0], PAIR_CHUNK):
        part = slice(start, start + PAIR_CHUNK)
        a, b = features[first[part]], features[second[part]]
        scores[part] = (-(a - b).norm(dim=1) if similarity == "neg_l2" else (a * b).sum(dim=1)).cpu()
    return tar_at_far(scores.numpy(), pairs[:, 2].numpy(), fars)


MAX_ALL_PAIRS = 200_000_000
"""Pairs :func:`all_pairs_tar_at_far` scores at most (float64 scores: 1.6 GB)."""


def parse_far_keys(names: Sequence[str]) -> tuple[list[str], list[float]]:
    """Split metric names into the others and the target FARs of ``tar@far=F`` names."""
    others, fars = [], []
    for name in names:
        if not name.startswith("tar@far="):
            others.append(name)
            continue
        try:
            far = float(name.removeprefix("tar@far="))
        except ValueError:
            raise ValueError(f"metric {name!r}: expected tar@far=<false accept rate>, e.g. tar@far=1e-03") from None
        if not 0.0 < far <= 1.0 or far_key(far) != name:
            raise ValueError(f"metric {name!r}: write a false accept rate in (0, 1] as {far_key(far)!r}")
        fars.append(far)
    return others, fars


def all_pairs_scores(embeddings: torch.Tensor, labels: ArrayLike,
                     similarity: str = "cosine") -> tuple[np.ndarray, np.ndarray]:
    """``(scores (P,) float64, genuine (P,) int64)`` of the ``P = N (N - 1) / 2`` pairs ``i < j`` of a labelled set
    (row-major order), genuine (1) when their finest labels (column 0) are equal, else impostors (0); scores by
    ``rankopt.similarity.pairwise``, at most :data:`MAX_ALL_PAIRS` pairs."""
    if similarity not in SIMILARITIES:
        raise ValueError(f"unknown similarity {similarity!r}; use one of {', '.join(SIMILARITIES)}")
    y = np.asarray(labels)
    y = y[:, 0] if y.ndim == 2 else y
    n = int(embeddings.shape[0])
    if y.shape != (n,):
        raise ValueError(f"labels must have {n} rows (one per embedding), got shape {np.asarray(labels).shape}")
    if n * (n - 1) // 2 > MAX_ALL_PAIRS:
        raise ValueError(f"all-pairs verification of {n} items scores {n * (n - 1) // 2} pairs, more than "
                         f"{MAX_ALL_PAIRS}: use a pairs file (templates) or fewer items")
    scores, genuine = [], []
    rows = max(1, PAIR_CHUNK // max(n, 1))
    for start in range(0, n - 1, rows):
        block = pairwise(embeddings[start:start + rows], embeddings, similarity).double().cpu().numpy()
        for offset, row in enumerate(block):
            i = start + offset
            scores.append(row[i + 1:])
            genuine.append(y[i + 1:] == y[i])
    return np.concatenate(scores or [np.empty(0)]), np.concatenate(genuine or [np.empty(0, bool)]).astype(np.int64)


def all_pairs_tar_at_far(embeddings: torch.Tensor, labels: ArrayLike, fars: Sequence[float] = DEFAULT_FARS,
                         similarity: str = "cosine") -> dict[str, float]:
    """Verification on every pair of a labelled set (open-set faces without a pairs file, as LFW-style
    protocols over all pairs): :func:`tar_at_far` of :func:`all_pairs_scores`."""
    return tar_at_far(*all_pairs_scores(embeddings, labels, similarity), fars)
