"""Post-processing chosen on validation: whitening, then DBA, then αQE, each kept only if it helps.

A fit scores each candidate as the index is searched (:func:`choose_for_protocols`: the validation queries of one
protocol against the validation index, :mod:`rankopt.fit.validation`), once per protocol, so a step that helps
one protocol and hurts the other is seen as such; the benchmarks score the papers' self-retrieval
(:func:`choose_postprocessing`). Whitening is fitted on the *training* photos' embeddings, never on the photos it
is scored on. Greedy order, as the steps apply: the best whitening (none, PCA, supervised, each with a shrinkage)
by validation mAP@R, then DBA ``(k, α)`` with it, then αQE with both; a step is kept only when it raises
validation mAP@R (DBA is skipped on request). For ``--queries both`` (:func:`choose_for_both`) whole pipelines are
compared instead, since the bar on new classes holds for the complete steps, not for each step alone. The
whitenings are fitted once per set of embeddings and shared by every protocol's choice. The grids are those of
``benchmarks/landmark_toolbox.py`` (ICCV'19 §5 and its validated variants); results on Caltech-101 in
``benchmarks/results/landmark_toolbox_caltech101.md``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rankopt.config import EvalConfig
from rankopt.engine.embed_and_score import CATEGORY, EmbeddedSplit, score
from rankopt.fit import validation
from rankopt.fit.validation import (
    BOTH,
    KNOWN,
    METRICS,
    NEW,
    SELECT_ON,
    Scores,
    ValidationSplit,
    admissible,
    mixed_value,
    search_mix,
)
from rankopt.postprocess import (
    Expansion,
    PairCovariance,
    PostProcessing,
    Whitening,
    fit_pca_whitening,
    fit_supervised_whitening,
    pair_covariance,
)

STABILITY_NOISE, STABILITY_COSINE = 1e-5, 0.999
SHRINKAGES = (0.1, 0.3, 0.6)
"""Never 0: an unshrunk whitening divides by the smallest eigenvalues, so float noise of 1e-6 between two
computations of one embedding (cached trunk vs a query's forward) could turn into different vectors."""
PCA_POWER = 0.5
EXPANSION_KS = (1, 2, 3, 5, 10)
EXPANSION_ALPHAS = (1.0, 2.0, 3.0)


def stable(whitening: Whitening, x: torch.Tensor, noise: float = STABILITY_NOISE) -> bool:
    """Whether ``whitening`` maps each row of ``x`` and the row perturbed by relative noise ``noise`` to vectors
    with cosine >= :data:`STABILITY_COSINE`. A whitening that divides by a near-zero variance fails: float
    differences between two computations of one embedding (batch sizes, kernels) would change its result."""
    g = torch.Generator().manual_seed(0)
    rows = x[: min(len(x), 256)].double()
    shaken = rows + noise * rows.norm(dim=1, keepdim=True) * torch.randn(rows.shape, generator=g, dtype=rows.dtype)
    cosine = (whitening.apply(rows) * whitening.apply(shaken)).sum(dim=1)
    return bool(cosine.min() >= STABILITY_COSINE)


@dataclass(frozen=True)
class WhiteningChoice:
    """How to (re)fit the whitening: ``kind`` ``pca`` / ``supervised``, ``shrinkage``."""

    kind: str
    shrinkage: float

    def fit(self, x: torch.Tensor, labels: np.ndarray, fitted_on: str,
            pairs: PairCovariance | None = None) -> Whitening | None:
        """The whitening of ``x``, or ``None`` when it is singular or not :func:`stable` on ``x``; ``pairs``: the
        pair covariance of ``x`` when already computed (supervised)."""
        try:
            if self.kind == "pca":
                fitted = fit_pca_whitening(x, power=PCA_POWER, shrinkage=self.shrinkage, fitted_on=fitted_on)
            else:
                fitted = fit_supervised_whitening(x, labels, shrinkage=self.shrinkage, fitted_on=fitted_on,
                                                  pairs=pairs)
        except ValueError:  # e.g. a singular intra-class covariance
            return None
        return fitted if stable(fitted, x) else None

    def describe(self) -> str:
        return f"{self.kind} whitening (shrinkage {self.shrinkage:g})"


@dataclass
class PostChoice:
    """The chosen steps (None: skipped), the validation metrics with them and of every step tried."""

    whitening: WhiteningChoice | None
    dba: Expansion | None
    qe: Expansion | None
    metrics: dict[str, float]
    tried: list[tuple[str, float]]
    fitted_whitening: Whitening | None = None
    """The chosen whitening as fitted on the training classes (kept if a refit on more photos is not stable)."""

    def steps(self, whitening: Whitening | None) -> PostProcessing:
        """The :class:`PostProcessing` with ``whitening`` (:attr:`whitening` fitted, e.g.
        :attr:`fitted_whitening`)."""
        return PostProcessing(None, whitening, self.dba, self.qe)

    def to_dict(self) -> dict[str, object]:
        return {"whitening": None if self.whitening is None else dataclasses.asdict(self.whitening),
                "dba": None if self.dba is None else dataclasses.asdict(self.dba),
                "qe": None if self.qe is None else dataclasses.asdict(self.qe)}

    def describe(self) -> str:
        parts = [] if self.whitening is None else [self.whitening.describe()]
        parts += [f"{name} k={e.k} alpha={e.alpha:g}" for name, e in (("DBA", self.dba), ("αQE", self.qe)) if e]
        return ", ".join(parts) or "none"


def score_self_retrieval(x: torch.Tensor, labels: np.ndarray, post: PostProcessing | None = None, *,
                         categories: Sequence[str] | None = None, metrics: Sequence[str] = METRICS
                         ) -> dict[str, float] | tuple[dict, dict]:
    """``{metric: value}`` of self-retrieval among ``x`` with ``post`` (whitening, DBA, αQE) applied, as
    ``rankopt evaluate`` scores it (:func:`rankopt.engine.embed_and_score.score`); with ``categories`` (one per
    row) also ``{category: {metric: value}}``. The papers' protocol: the benchmarks' scores."""
    y = torch.as_tensor(np.asarray(labels)).long().reshape(len(labels), -1)
    split = EmbeddedSplit(x, y, [], {} if categories is None else {CATEGORY: list(categories)})
    result = score([split], EvalConfig(), metrics=list(metrics), postprocessing=post)
    if categories is None:
        return dict(result.metrics)
    return dict(result.metrics), {name: dict(r.metrics) for name, r in result.by_category.items()}


FittedWhitenings = list[tuple[WhiteningChoice, Whitening]]
"""The whitenings of the grid fitted on one set of training embeddings (:func:`fit_whitenings`)."""


def fit_whitenings(train_x: torch.Tensor, train_labels: np.ndarray, tried: list[tuple[str, float]]
                   ) -> FittedWhitenings:
    """Every whitening of the grid fitted on ``train_x``; the singular or unstable ones are noted in ``tried``.
    Fitted once per set of embeddings and shared by every choice made on it (each fit is an eigendecomposition
    of a ``D x D`` matrix: on 1280-d features, most of the time a choice takes); the supervised ones share one
    pair covariance."""
    try:
        pairs: PairCovariance | None = pair_covariance(train_x, train_labels)
    except ValueError:  # no class with two photos: each supervised fit below says so again, and is skipped
        pairs = None
    fitted_ones = []
    for kind, shrinkage in itertools.product(("pca", "supervised"), SHRINKAGES):
        choice = WhiteningChoice(kind, shrinkage)
        fitted = choice.fit(train_x, train_labels, "training classes", pairs)
        if fitted is None:
            tried.append((f"{choice.describe()}: singular or unstable, skipped", float("nan")))
        else:
            fitted_ones.append((choice, fitted))
    return fitted_ones


def choose_steps(train_x: torch.Tensor, train_labels: np.ndarray, evaluate: Callable[[PostProcessing], float], *,
                 dba: bool = True, ks: Sequence[int] = EXPANSION_KS,
                 whitenings: FittedWhitenings | None = None) -> PostChoice:
    """The greedy choice (module docstring): ``evaluate(steps)`` scores a candidate on validation, ``train_*`` fit
    the whitenings (unless ``whitenings`` holds them, :func:`fit_whitenings`); ``dba=False``: DBA is not tried;
    ``ks``: the neighbour counts tried for DBA and αQE. The choice's :attr:`PostChoice.metrics` is
    ``{SELECT_ON: value}`` of the chosen steps."""
    tried: list[tuple[str, float]] = []
    if whitenings is None:
        whitenings = fit_whitenings(train_x, train_labels, tried)

    def scored(post: PostProcessing, what: str) -> float:
        value = evaluate(post)
        tried.append((what, value))
        return value

    best_value = scored(PostProcessing(), "none")
    best_w, best_white = None, None
    for choice, fitted in whitenings:
        value = scored(PostProcessing(None, fitted), choice.describe())
        if value > best_value:
            best_w, best_white, best_value = choice, fitted, value
    best_dba = None
    for k, alpha in itertools.product(ks if dba else (), EXPANSION_ALPHAS):
        value = scored(PostProcessing(None, best_white, Expansion(k, alpha)), f"DBA k={k} alpha={alpha:g}")
        if value > best_value:
            best_dba, best_value = Expansion(k, alpha), value
    best_qe = None
    for k, alpha in itertools.product(ks, EXPANSION_ALPHAS):
        value = scored(PostProcessing(None, best_white, best_dba, Expansion(k, alpha)), f"αQE k={k} alpha={alpha:g}")
        if value > best_value:
            best_qe, best_value = Expansion(k, alpha), value
    return PostChoice(best_w, best_dba, best_qe, {SELECT_ON: best_value}, tried, best_white)


def choose_postprocessing(train_x: torch.Tensor, train_labels: np.ndarray, val_x: torch.Tensor,
                          val_labels: np.ndarray, *, dba: bool = True,
                          ks: Sequence[int] = EXPANSION_KS) -> PostChoice:
    """:func:`choose_steps` scored by self-retrieval among ``val_x`` (the papers' open-set protocol; its
    :attr:`PostChoice.metrics` hold every metric of :data:`METRICS`)."""
    choice = choose_steps(train_x, train_labels,
                          lambda post: score_self_retrieval(val_x, val_labels, post)[SELECT_ON],  # type: ignore[index]
                          dba=dba, ks=ks)
    choice.metrics = score_self_retrieval(val_x, val_labels, choice.steps(choice.fitted_whitening))  # type: ignore[assignment]
    return choice


def choose_for_protocols(x: torch.Tensor, split: ValidationSplit, *, dba: bool = True,
                         ks: Sequence[int] = EXPANSION_KS, floor: Scores | None = None) -> dict[str, PostChoice]:
    """For each protocol of ``split``, the steps chosen on its queries against the validation index
    (:func:`rankopt.fit.validation.score`), the whitenings fitted on the training photos of the validation index
    (``x``: the embeddings of :attr:`ValidationSplit.rows`); with both protocols, also ``both``: the best steps on
    the mix of searches (:func:`~rankopt.fit.validation.mixed_value`) among those
    :func:`~rankopt.fit.validation.admissible` on new ones against ``floor`` (default: ``x`` alone, the plain
    features when ``x`` holds them). Each choice's metrics are those of its own protocol (``both``: known queries)."""
    train_rows = np.intersect1d(split.train, split.gallery)  # the training photos the validation index holds
    train_x, train_labels = x[split.positions(train_rows)], split.labels[train_rows]
    skipped: list[tuple[str, float]] = []
    whitenings = fit_whitenings(train_x, train_labels, skipped)
    choices = {}
    scorer = validation.Scorer(x, split)
    for protocol in split.protocols:
        choice = choose_steps(train_x, train_labels, lambda post, p=protocol: scorer.one(p, post).value, dba=dba,
                              ks=ks, whitenings=whitenings)
        choice.tried[:0] = skipped
        choice.metrics = scorer.one(protocol, choice.steps(choice.fitted_whitening)).metrics
        choices[protocol] = choice
    if NEW not in split.protocols:
        return choices
    if floor is None:
        floor = scorer.one(NEW)
    choices[BOTH] = choose_for_both(scorer, whitenings, choices, floor)
    choices[BOTH].tried[:0] = skipped
    return choices


def choose_for_both(scorer: validation.Scorer, whitenings: FittedWhitenings, choices: dict[str, PostChoice],
                    floor: Scores) -> PostChoice:
    """The best steps on the mix of searches of ``--queries both`` (:func:`~rankopt.fit.validation.mixed_value`)
    among those :func:`~rankopt.fit.validation.admissible` on new ones against ``floor``. Admissibility is a
    property of the complete steps (a whitening that alone falls below the bar can pass it once DBA and αQE
    follow), so whole pipelines are compared: every whitening of the grid (and none) with the expansions chosen for
    known queries, for new queries, or none. Ties go to the better on new."""
    tried: list[tuple[str, float]] = []
    expansions = list(dict.fromkeys([(None, None), *((c.dba, c.qe) for c in choices.values())]))
    candidates: list[tuple[WhiteningChoice | None, Whitening | None]] = [(None, None), *whitenings]
    best: tuple[float, float] = (float("-inf"), float("-inf"))
    mix = search_mix(BOTH, scorer.split.protocols)
    chosen = PostChoice(None, None, None, {}, tried)
    for (choice, fitted), (dba, qe) in itertools.product(candidates, expansions):
        candidate = PostChoice(choice, dba, qe, {}, tried, fitted)
        scores = scorer.all(candidate.steps(fitted))
        ok = admissible(floor, scores[NEW])[0]
        value = mixed_value(scores, mix) if ok else float("-inf")
        tried.append((candidate.describe(), value))
        if ok and (value, scores[NEW].value) > best:
            best, chosen = (value, scores[NEW].value), candidate
    chosen.metrics = scorer.one(KNOWN, chosen.steps(chosen.fitted_whitening)).metrics
    return chosen
