"""What a fit did, typed: written as ``RUN/fit.json`` and read by the report page (:mod:`rankopt.fit.page`).

``fit.json`` (its keys): ``photos``, ``backbone``, ``weights``, ``device``, ``queries`` (the searches stated:
``known``, ``new`` or ``both``), ``validation`` (the split's counts and protocols), ``pipelines`` (every candidate
with its steps and its scores on each protocol: metrics, per class, spread over classes), ``chosen`` (the model,
its state's source, the framing, the multi-scale, the post-processing and the served pipeline in words, why, the
tuning's candidates), ``served`` (the served pipeline's validation metrics per protocol), ``refit``, ``settings``,
``sizing``, ``seconds`` per stage, ``machine``, ``skipped`` (the unreadable photos left out).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rankopt.fit.tune import TuneResult
from rankopt.fit.validation import NAMES, Pipeline, ValidationSplit


def split_record(split: ValidationSplit, near_duplicates: int = 0) -> dict[str, Any]:
    """The split's counts, as ``fit.json``'s ``validation``."""
    return {"near_duplicates": near_duplicates, "protocols": list(split.protocols), "index_photos": int(split.gallery.size),
            "known_queries": int(split.known_queries.size), "new_queries": int(split.new_queries.size),
            "train_photos": int(split.train.size), "train_classes": int(np.unique(split.labels[split.train]).size),
            "held_out_classes": int(split.held_out_classes().size), "note": split.open_note,
            "names": {p: NAMES[p] for p in split.protocols}}


def pipeline_record(pipeline: Pipeline, post: dict[str, Any] | None) -> dict[str, Any]:
    return {"name": pipeline.name, "model": pipeline.model, "steps_for": pipeline.steps_for, "steps": pipeline.steps,
            "post": post, "scores": {p: s.to_dict() for p, s in pipeline.scores.items()}}


def tuning_record(tuned: TuneResult) -> list[dict[str, Any]]:
    """Each candidate: loss, learning rate, steps, its validation history (every protocol's metrics)."""
    return [{"loss": t.candidate.loss, "lr": t.candidate.lr, "steps": t.steps,
             "history": [{"step": s, **scores} for s, scores in t.history]} for t in tuned.trials]


@dataclass
class FitRecord:
    """Everything ``fit.json`` holds (module docstring)."""

    photos: str
    backbone: str
    weights: str
    device: str
    queries: str
    validation: dict[str, Any]
    pipelines: list[dict[str, Any]]
    chosen: dict[str, Any]
    served: dict[str, dict[str, float]]
    settings: dict[str, Any]
    sizing: dict[str, Any]
    machine: dict[str, Any]
    refit: dict[str, Any] | None = None
    seconds: dict[str, float] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    """The unreadable photos left out: path, where it was listed, why."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
