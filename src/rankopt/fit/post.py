"""Post-processing chosen on the validation classes: whitening, then DBA, then αQE, each kept only if it helps.

Scoring is self-retrieval on the validation photos (each query excluded from its own results and from its
own expansion). Whitening is fitted on the *training* classes' embeddings, never on the photos it is scored
on. Greedy order, as the steps apply: the best whitening (none, PCA, supervised, each with a shrinkage)
by validation mAP@R, then DBA ``(k, α)`` with it, then αQE with both; a step is kept only when it raises
validation mAP@R (DBA is skipped on request). The grids are those of ``benchmarks/landmark_toolbox.py`` (ICCV'19 §5
and its validated variants); results on Caltech-101 in ``benchmarks/results/landmark_toolbox_caltech101.md``.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from rankopt.config import EvalConfig
from rankopt.engine.embed_and_score import CATEGORY, EmbeddedSplit, score
from rankopt.postprocess import Expansion, PostProcessing, Whitening, fit_pca_whitening, fit_supervised_whitening

METRICS = ("map@r", "recall@1")
SELECT_ON = "map@r"  # what every choice of a fit is made on: validation mAP@R (tune, post, framing, the page)
STABILITY_NOISE, STABILITY_COSINE = 1e-5, 0.999
SHRINKAGES = (0.1, 0.3, 0.6)
"""Never 0: an unshrunk whitening divides by the smallest eigenvalues, so float noise of 1e-6 between two
computations of one embedding (cached trunk vs a query's forward) could turn into different vectors."""
PCA_POWER = 0.5
EXPANSION_KS = (1, 2, 3, 5, 10)
EXPANSION_ALPHAS = (1.0, 2.0, 3.0)
MIN_GAIN_SE = 1.0
"""The fitted pipeline is served when its validation gain exceeds this many standard errors (:func:`served_pipeline`)."""


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

    def fit(self, x: torch.Tensor, labels: np.ndarray, fitted_on: str) -> Whitening | None:
        """The whitening of ``x``, or ``None`` when it is singular or not :func:`stable` on ``x``."""
        try:
            if self.kind == "pca":
                fitted = fit_pca_whitening(x, power=PCA_POWER, shrinkage=self.shrinkage, fitted_on=fitted_on)
            else:
                fitted = fit_supervised_whitening(x, labels, shrinkage=self.shrinkage, fitted_on=fitted_on)
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
    fitted: Whitening | None = None
    """The chosen whitening as fitted on the training classes (kept if a refit on more photos is not stable)."""

    def steps(self, whitening: Whitening | None) -> PostProcessing:
        """The :class:`PostProcessing` with ``whitening`` (the fitted :attr:`whitening`)."""
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
    row) also ``{category: {metric: value}}``."""
    y = torch.as_tensor(np.asarray(labels)).long().reshape(len(labels), -1)
    split = EmbeddedSplit(x, y, [], {} if categories is None else {CATEGORY: list(categories)})
    result = score([split], EvalConfig(), metrics=list(metrics), postprocessing=post)
    if categories is None:
        return dict(result.metrics)
    return dict(result.metrics), {name: dict(r.metrics) for name, r in result.by_category.items()}


def choose_postprocessing(train_x: torch.Tensor, train_labels: np.ndarray, val_x: torch.Tensor,
                          val_labels: np.ndarray, *, dba: bool = True,
                          ks: Sequence[int] = EXPANSION_KS) -> PostChoice:
    """The greedy choice on validation (module docstring); ``train_*`` fit the whitenings; ``dba=False``: DBA is
    not tried; ``ks``: the neighbour counts tried for DBA and αQE."""
    tried: list[tuple[str, float]] = []

    def score(post: PostProcessing, what: str) -> float:
        value = score_self_retrieval(val_x, val_labels, post)[SELECT_ON]  # type: ignore[index]
        tried.append((what, value))
        return value

    base = score(PostProcessing(), "none")
    best_w, best_white, best = None, None, base
    for kind, shrinkage in itertools.product(("pca", "supervised"), SHRINKAGES):
        choice = WhiteningChoice(kind, shrinkage)
        fitted = choice.fit(train_x, train_labels, "training classes")
        if fitted is None:
            tried.append((f"{choice.describe()}: singular or unstable, skipped", float("nan")))
            continue
        value = score(PostProcessing(None, fitted), choice.describe())
        if value > best:
            best_w, best_white, best = choice, fitted, value
    best_dba = None
    for k, alpha in itertools.product(ks if dba else (), EXPANSION_ALPHAS):
        value = score(PostProcessing(None, best_white, Expansion(k, alpha)), f"DBA k={k} alpha={alpha:g}")
        if value > best:
            best_dba, best = Expansion(k, alpha), value
    best_qe = None
    for k, alpha in itertools.product(ks, EXPANSION_ALPHAS):
        value = score(PostProcessing(None, best_white, best_dba, Expansion(k, alpha)), f"αQE k={k} alpha={alpha:g}")
        if value > best:
            best_qe, best = Expansion(k, alpha), value
    metrics = score_self_retrieval(val_x, val_labels, PostProcessing(None, best_white, best_dba, best_qe))
    return PostChoice(best_w, best_dba, best_qe, metrics, tried, best_white)  # type: ignore[arg-type]


def per_class_gain(base_by_class: dict[str, dict[str, float]], other_by_class: dict[str, dict[str, float]]
                   ) -> tuple[float, float, bool]:
    """``(ḡ, se, clear)``: the mean gain ``ḡ = mean_c(mAP@R_other(c) − mAP@R_base(c))`` over the validation
    classes, its standard error, and whether it is positive and over :data:`MIN_GAIN_SE` standard errors (a smaller
    gain is not told from the luck of these classes)."""
    gains = np.array([other_by_class[c][SELECT_ON] - base_by_class[c][SELECT_ON] for c in base_by_class])
    mean = float(gains.mean())
    se = float(gains.std(ddof=1) / np.sqrt(gains.size)) if gains.size > 1 else float("inf")
    return mean, se, mean > 0 and mean > MIN_GAIN_SE * se


def served_pipeline(features_by_class: dict[str, dict[str, float]],
                    fitted_by_class: dict[str, dict[str, float]]) -> tuple[str, str]:
    """``("fitted" | "features", why)``: the fitted model's pipeline, each with its chosen post-processing, is
    served when its gain per validation class over the features' pipeline is clear (:func:`per_class_gain`), else
    the untrained pipeline is."""
    mean, se, clear = per_class_gain(features_by_class, fitted_by_class)
    said = (f"fine-tuning adds {mean:+.4f} mAP@R per validation class on top of post-processing (standard error "
            f"{se:.4f}, {len(features_by_class)} classes)")
    if clear:
        return "fitted", f"{said}: the fitted pipeline is served"
    return "features", f"{said}, not more than {MIN_GAIN_SE:g} standard error: the untrained pipeline is served"
