"""How ``rankopt fit`` validates: as the served index is searched.

A person who fits a folder mostly searches it with *new photos of the kinds in it* (closed-set, ``known``), and
sometimes with photos of *kinds it does not hold yet* (open-set, ``new``: the papers' protocol). The photos are
split once (:func:`make_split`):

- every class keeps back a share of its photos (:data:`KNOWN_FRACTION`): the ``known`` queries, never trained on;
- where the folder has :data:`OPEN_MIN_CLASSES` classes or more, whole classes are held out too: half of each
  one's photos are indexed, the other half are the ``new`` queries; none of them is trained on;
- the training photos (the rest of the kept classes) and the indexed photos of the held-out classes form the
  validation index (:attr:`ValidationSplit.gallery`), at most :data:`GALLERY_MAX` photos, sampled by class in one
  share for both, so every class is indexed in proportion to its photos as in the served index (the held-out
  classes' photos kept whole would fill the cap on a large folder and leave one photo to each known class: on 49,452
  photos, 3,780 of them against 80 known ones, where a DBA then pulled each known class's one photo to its
  neighbours of other classes and its known-query mAP@R fell to 0.03).

Every pipeline (a model state with post-processing steps) is scored as ``rankopt serve`` answers a query
(:func:`score`): whitening fitted on the training photos only, DBA computed over the index, αQE on the query
against it; the queries are never in the index. The served pipeline is chosen by the searches the person states
(``--queries``, :func:`choose_served`) as a mix of the two protocols (:func:`search_mix`): ``known`` closed-set
alone, ``new`` open-set alone, ``both`` (default) :data:`KNOWN_SHARE` of known-class searches and the rest of new
ones, among the pipelines not below the plain features on new classes by more than the noise of the held-out classes.
A fine-tuned pipeline replaces the features' only when its gain per validation class is clear (:func:`mix_gain`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from rankopt.config import EvalConfig
from rankopt.engine.embed_and_score import CATEGORY, EmbeddedSplit
from rankopt.engine.embed_and_score import score as score_splits
from rankopt.fit.settings import QUERIES
from rankopt.postprocess import PostProcessing, Whitening

KNOWN, NEW, BOTH = QUERIES
"""The searches ``--queries`` names: new photos of the folder's classes, photos of new classes, or both."""
METRICS = ("map@r", "recall@1")
SELECT_ON = "map@r"
"""What every choice of a fit is made on (tuning, post-processing, framing, the served pipeline)."""
KNOWN_FRACTION = 0.2
"""Share of each class's photos kept back as closed-set queries (at least one where a class has two photos)."""
OPEN_FRACTION = 0.2
"""Share of the classes held out whole for the open-set queries, where the folder has enough classes."""
OPEN_MIN_CLASSES = 10
"""Fewest classes for open-set validation (2 held out); below, the fit validates on closed-set queries alone."""
GALLERY_MAX = 3000
KNOWN_QUERIES_MAX, NEW_QUERIES_MAX = 2000, 1000
"""Caps on the validation index and queries (sampled by class): a validation's cost stays bounded on large folders."""
MIN_GAIN_SE = 1.0
"""A fine-tuned pipeline replaces the features' when its gain per class exceeds this many standard errors."""
NOT_WORSE_SE = 2.0
"""With ``--queries both``, a pipeline is left out when it is below the plain features on new classes by more than
this many standard errors of the per-class differences (about 97.5 % one-sided confidence that it is worse there)."""
KNOWN_SHARE = 0.75
"""With ``--queries both``, the share of the searches taken to be new photos of known classes (people mostly search
their folder with new photos of the kinds in it); the rest are photos of new kinds. A bar on the open-set score alone
(the rule before) left out, on a Caltech-101 fit, a pipeline 0.069 ± 0.018 below on new classes and 0.14 above on
known ones, the one that scored 0.90 on new photos against the served 0.80."""
NAMES = {KNOWN: "new photos of known classes (closed-set)", NEW: "photos of new classes (open-set)"}


@dataclass(frozen=True)
class ValidationSplit:
    """Row sets of the photos (indices into ``labels``): the training photos, the ``known`` queries (kept-back photos
    of the training classes), the held-out classes' indexed photos and ``new`` queries, and the validation index."""

    labels: np.ndarray
    class_names: list[str]
    train: np.ndarray
    known_queries: np.ndarray
    new_gallery: np.ndarray
    new_queries: np.ndarray
    gallery: np.ndarray
    open_note: str = ""
    """Why open-set validation is or is not made."""

    @property
    def protocols(self) -> tuple[str, ...]:
        return (KNOWN, NEW) if self.new_queries.size else (KNOWN,)

    @cached_property
    def rows(self) -> np.ndarray:
        """Every row a validation embeds (the index and the queries), sorted: the order of validation embeddings."""
        return np.unique(np.concatenate([self.gallery, self.known_queries, self.new_queries]))

    def queries(self, protocol: str) -> np.ndarray:
        return self.known_queries if protocol == KNOWN else self.new_queries

    def held_out_classes(self) -> np.ndarray:
        return np.unique(self.labels[self.new_gallery])

    def never_trained(self) -> np.ndarray:
        """Rows the tuning never sees: the kept-back photos and the held-out classes."""
        return np.setdiff1d(np.arange(len(self.labels)), self.train)

    def positions(self, rows: np.ndarray) -> torch.Tensor:
        """Where ``rows`` sit in :attr:`rows` (and so in validation embeddings)."""
        return torch.as_tensor(np.searchsorted(self.rows, rows))

    def summary(self) -> str:
        known = np.unique(self.labels[self.known_queries]).size
        text = (f"{len(self.labels):,} photos in {len(self.class_names)} classes; {self.known_queries.size:,} photos of "
                f"{known} classes kept back as new photos of known classes")
        if self.new_queries.size:
            held = self.held_out_classes().size
            text += f", {held} classes ({self.new_gallery.size + self.new_queries.size:,} photos) held out as new classes"
        return text + (f" ({self.open_note})" if self.open_note and not self.new_queries.size else "")


def _kept_back(rows: np.ndarray, share: float, rng: np.random.Generator, groups: np.ndarray | None = None
               ) -> np.ndarray:
    """``max(1, round(share·n))`` of a class's ``n`` rows (none when it has one photo; one always stays), drawn as
    whole near-duplicate ``groups`` (a group id per row of the folder; ``None``: each photo its own), so that no
    photo is kept back while its copy is trained on or indexed: groups in a random order are kept back while they
    fit in the count (at least one group, never every group)."""
    if rows.size < 2:
        return rows[:0]
    count = min(rows.size - 1, max(1, round(share * rows.size)))
    if groups is None or np.unique(groups[rows]).size == rows.size:  # no near-duplicates: photo by photo
        return np.sort(rng.choice(rows, count, replace=False))
    ids = rng.permutation(np.unique(groups[rows]))
    if ids.size < 2:  # one group: every photo a copy of the others, nothing to keep back apart
        return rows[:0]
    back: list[np.ndarray] = []
    taken = 0
    for g in ids[:-1]:
        members = rows[groups[rows] == g]
        if taken and taken + members.size > count:
            continue
        back.append(members)
        taken += members.size
        if taken >= count:
            break
    return np.sort(np.concatenate(back))


def sample_by_class(rows: np.ndarray, labels: np.ndarray, cap: int, rng: np.random.Generator) -> np.ndarray:
    """``rows`` (sorted) when at most ``cap``, else a sample of each class's rows in one proportion (at least one
    each)."""
    if rows.size <= cap:
        return np.unique(rows)
    share = cap / rows.size
    picked = [np.sort(rng.choice(r, min(r.size, max(1, round(share * r.size))), replace=False))
              for r in (rows[labels[rows] == c] for c in np.unique(labels[rows]))]
    return np.sort(np.concatenate(picked))


def make_split(labels: np.ndarray, class_names: Sequence[str], seed: int, *,
               known_fraction: float = KNOWN_FRACTION, open_fraction: float = OPEN_FRACTION,
               groups: np.ndarray | None = None) -> ValidationSplit:
    """The split of the module docstring, drawn with ``seed``. Classes with one photo are trained on (no query).
    ``groups``: each photo's near-duplicate group (:func:`rankopt.data.near_duplicates.duplicate_groups`), kept
    whole on one side of every split."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    if classes.size < 2:
        raise ValueError(f"{classes.size} class: a fit needs at least 2 classes, each in its own folder")
    if (counts >= 2).sum() < 2:
        raise ValueError("fewer than 2 classes have 2 or more photos: nothing to validate on")
    queryable = classes[counts >= 2]
    held: np.ndarray = classes[:0]
    note = f"{classes.size} classes, fewer than {OPEN_MIN_CLASSES}: too few to hold whole classes out, so " \
           "validation is on new photos of known classes alone"
    if classes.size >= OPEN_MIN_CLASSES:
        count = max(2, round(open_fraction * classes.size))
        held, note = np.sort(rng.permutation(queryable)[:count]), ""
    new_gallery, new_queries, known, train = [], [], [], []
    for c in classes:
        rows = np.flatnonzero(labels == c)
        back = _kept_back(rows, 0.5 if c in held else known_fraction, rng, groups)
        (new_queries if c in held else known).append(back)
        (new_gallery if c in held else train).append(np.setdiff1d(rows, back))
    none = np.array([], dtype=np.int64)
    train_rows, new_gallery_rows = np.concatenate(train), np.concatenate([none, *new_gallery])
    known_rows = sample_by_class(np.concatenate(known), labels, KNOWN_QUERIES_MAX, rng)
    new_rows = sample_by_class(np.concatenate([none, *new_queries]), labels, NEW_QUERIES_MAX, rng)
    gallery = sample_by_class(np.union1d(train_rows, new_gallery_rows), labels, GALLERY_MAX, rng)
    return ValidationSplit(labels, list(class_names), train_rows, known_rows, new_gallery_rows, new_rows, gallery,
                           note)


@dataclass(frozen=True)
class Scores:
    """One protocol's metrics over its queries and per query class (``{class: {metric: value}}``)."""

    metrics: dict[str, float]
    by_class: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def value(self) -> float:
        return self.metrics[SELECT_ON]

    def spread(self) -> float:
        """Sample sd over the classes of their :data:`SELECT_ON` (nan with fewer than two)."""
        values = np.array([m[SELECT_ON] for m in self.by_class.values() if not math.isnan(m[SELECT_ON])])
        return float(values.std(ddof=1)) if values.size > 1 else float("nan")

    def to_dict(self) -> dict[str, object]:
        return {"metrics": self.metrics, "by_class": self.by_class, "sd_over_classes": self.spread()}


def score(x: torch.Tensor, split: ValidationSplit, protocol: str, post: PostProcessing | None = None) -> Scores:
    """``protocol``'s queries searched in the validation index as ``rankopt serve`` answers them: ``x`` holds the
    embeddings of :attr:`ValidationSplit.rows`; ``post``'s whitening applied to both, its DBA to the index, its αQE
    to each query against the augmented index."""
    return score_all(x, split, post, (protocol,))[protocol]


def score_all(x: torch.Tensor, split: ValidationSplit, post: PostProcessing | None = None,
              protocols: Sequence[str] | None = None) -> dict[str, Scores]:
    """:func:`score` for ``protocols`` (default: every protocol of the split), the index whitened and augmented
    once for all of them."""
    post = post or PostProcessing()
    whitened = post.whiten(x)
    gallery = whitened[split.positions(split.gallery)]
    gallery = post.augment(gallery)
    labels = torch.as_tensor(split.labels).long()
    index = EmbeddedSplit(gallery, labels[split.gallery].view(-1, 1), [], {})
    expansion = PostProcessing(None, None, None, post.qe)
    out = {}
    for protocol in protocols or split.protocols:
        queries = split.queries(protocol)
        names = [split.class_names[c] for c in split.labels[queries]]
        query = EmbeddedSplit(whitened[split.positions(queries)], labels[queries].view(-1, 1), [], {CATEGORY: names})
        result = score_splits([query, index], EvalConfig(), metrics=list(METRICS), postprocessing=expansion)
        out[protocol] = Scores(dict(result.metrics), {name: dict(r.metrics) for name, r in result.by_category.items()})
    return out


class Scorer:
    """:func:`score_all` of one set of validation embeddings ``x``, a whitening applied to ``x`` once for every
    DBA and αQE scored after it (a choice scores each whitening with several; applying a 1280-d whitening costs more
    than the search). The last whitening's result is kept: the choices score one whitening's candidates in a row."""

    def __init__(self, x: torch.Tensor, split: ValidationSplit) -> None:
        self.x, self.split = x, split
        self._last: tuple[Whitening, torch.Tensor] | None = None

    def all(self, post: PostProcessing | None = None, protocols: Sequence[str] | None = None) -> dict[str, Scores]:
        """:func:`score_all` of ``x`` with ``post``."""
        if post is None or post.whitening is None:
            return score_all(self.x, self.split, post, protocols)
        if self._last is None or self._last[0] is not post.whitening:
            self._last = (post.whitening, post.whitening.apply(self.x))
        return score_all(self._last[1], self.split, dataclasses.replace(post, whitening=None), protocols)

    def one(self, protocol: str, post: PostProcessing | None = None) -> Scores:
        """:func:`score` of ``x`` with ``post``."""
        return self.all(post, (protocol,))[protocol]


def admissible(floor: Scores, scores: Scores) -> tuple[bool, float, float]:
    """``(ok, ḡ, se)``: whether ``scores`` on new classes are not below ``floor`` beyond the noise of those classes
    (the gain per class :func:`per_class_gain` at least ``−NOT_WORSE_SE`` standard errors)."""
    mean, se, _ = per_class_gain(floor.by_class, scores.by_class)
    return mean >= -NOT_WORSE_SE * se, mean, se


def search_mix(queries: str, protocols: Sequence[str]) -> dict[str, float]:
    """The weight of each protocol in the searches ``queries`` states: ``known`` or ``new`` alone, ``both``
    :data:`KNOWN_SHARE` known; known alone where the split has no open-set queries."""
    if NEW not in protocols or queries == KNOWN:
        return {KNOWN: 1.0}
    return {NEW: 1.0} if queries == NEW else {KNOWN: KNOWN_SHARE, NEW: 1.0 - KNOWN_SHARE}


def mixed_value(scores: dict[str, Scores], mix: dict[str, float]) -> float:
    """``Σ_p w_p · mAP@R_p``: a pipeline's validation score on the mix of searches."""
    return sum(weight * scores[protocol].value for protocol, weight in mix.items())


def mix_gain(base: dict[str, Scores], other: dict[str, Scores], mix: dict[str, float]) -> tuple[float, float, bool]:
    """``(ḡ, se, clear)`` of :func:`per_class_gain` over the mix: ``ḡ = Σ_p w_p ḡ_p``, ``se = √(Σ_p w_p² se_p²)``
    (the protocols' classes are disjoint, so their errors add), clear when over :data:`MIN_GAIN_SE` of it."""
    parts = {p: per_class_gain(base[p].by_class, other[p].by_class) for p in mix}
    mean = sum(w * parts[p][0] for p, w in mix.items())
    se = math.sqrt(sum((w * parts[p][1]) ** 2 for p, w in mix.items()))
    return mean, se, mean > 0 and mean > MIN_GAIN_SE * se


def per_class_gain(base_by_class: dict[str, dict[str, float]], other_by_class: dict[str, dict[str, float]]
                   ) -> tuple[float, float, bool]:
    """``(ḡ, se, clear)``: the mean gain ``ḡ = mean_c(mAP@R_other(c) − mAP@R_base(c))`` over the classes, its standard
    error, and whether it is positive and over :data:`MIN_GAIN_SE` standard errors (a smaller gain is not told from
    the luck of these classes)."""
    gains = np.array([other_by_class[c][SELECT_ON] - base_by_class[c][SELECT_ON] for c in base_by_class])
    mean = float(gains.mean())
    se = float(gains.std(ddof=1) / np.sqrt(gains.size)) if gains.size > 1 else float("inf")
    return mean, se, mean > 0 and mean > MIN_GAIN_SE * se


@dataclass
class Pipeline:
    """A candidate for serving: a model state (``features``: the pretrained model) with post-processing chosen for
    one protocol (``steps_for``: ``known``, ``new``, or ``both``: the best on the mix of searches among the steps
    admissible on new; ``None``: no post-processing), and its scores on every protocol."""

    model: str
    steps_for: str | None
    scores: dict[str, Scores]
    steps: str = "none"
    """The post-processing in words."""

    @property
    def name(self) -> str:
        return self.model if self.steps_for is None else f"{self.model} + post-processing for {self.steps_for} queries"

    @property
    def trained(self) -> bool:
        return self.model != "features"


def open_floor(pipelines: Sequence[Pipeline]) -> Scores:
    """The plain features' scores on new classes: the bar of ``--queries both``."""
    return _plain_features(pipelines).scores[NEW]


def _plain_features(pipelines: Sequence[Pipeline]) -> Pipeline:
    return next(p for p in pipelines if not p.trained and p.steps_for is None)


def _mix_name(mix: dict[str, float]) -> str:
    if len(mix) == 1:
        return NAMES[next(iter(mix))]
    return " and ".join(f"{NAMES[p]} at {w:.0%}" for p, w in mix.items())


def _gain_text(mean: float, se: float, classes: int, protocol: str) -> str:
    return f"{mean:+.4f} mAP@R per class on {NAMES[protocol]} (standard error {se:.4f}, {classes} classes)"


def choose_served(pipelines: Sequence[Pipeline], queries: str, protocols: Sequence[str]) -> tuple[Pipeline, list[str]]:
    """The pipeline to serve for ``queries`` (``known``, ``new``, ``both``) and why, in sentences.

    Pipelines are ranked by their score on the mix of searches (:func:`search_mix`, :func:`mixed_value`). With
    ``both``, a pipeline below the plain features on new classes by more than ``NOT_WORSE_SE`` standard errors is
    left out. The best untrained pipeline is the reference; the best fine-tuned one replaces it when its gain per
    class on the mix is clear (:func:`mix_gain`)."""
    why: list[str] = []
    if queries == NEW and NEW not in protocols:
        why.append("--queries new, but the folder has too few classes to validate on new classes: chosen on new "
                   "photos of known classes")
    mix = search_mix(queries, protocols)
    eligible = list(pipelines)
    if len(mix) > 1:
        floor = _plain_features(pipelines)
        eligible = []
        for p in pipelines:
            ok, mean, se = admissible(floor.scores[NEW], p.scores[NEW])
            if p is floor or ok:
                eligible.append(p)
            else:
                why.append(f"{p.name} left out: on {NAMES[NEW]} it is below the plain features by more than "
                           f"{NOT_WORSE_SE:g} standard errors "
                           f"({_gain_text(mean, se, len(p.scores[NEW].by_class), NEW)})")
    reference = max((p for p in eligible if not p.trained), key=lambda p: mixed_value(p.scores, mix))
    trained = [p for p in eligible if p.trained]
    if not trained:
        return reference, why + [f"served: {reference.name} (best on {_mix_name(mix)}; no fine-tuned pipeline was "
                                 "eligible)"]
    challenger = max(trained, key=lambda p: mixed_value(p.scores, mix))
    mean, se, clear = mix_gain(reference.scores, challenger.scores, mix)
    said = (f"{challenger.name} against {reference.name}: {mean:+.4f} mAP@R per class on {_mix_name(mix)} "
            f"(standard error {se:.4f})")
    if not clear:
        return reference, why + [f"{said}, not more than {MIN_GAIN_SE:g} standard error: the untrained pipeline is "
                                 "served"]
    return challenger, why + [f"{said}: the fine-tuned pipeline is served"]
