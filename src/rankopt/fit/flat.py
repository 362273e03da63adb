"""``rankopt fit`` on a flat folder (photos, no class folders): the pretrained features, served.

Without classes there is nothing to fine-tune on and nothing to validate a choice on, so a flat fit is the
pretrained model's pass over every photo (at its own framing) and the index of it, with only the post-processing
that needs no labels and was measured not to hurt a folder whose kinds are unknown (:data:`FLAT_STEPS`). The run
folder is served like any other (``rankopt serve RUN``); its ``fit.json`` says what was done and why, its
``report.html`` shows a few photos searched in the index.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import numpy as np
import torch

from rankopt import layout
from rankopt.data.base import RetrievalDataset
from rankopt.describe import machine_info
from rankopt.engine.assembly import model_from_checkpoint
from rankopt.engine.weights import resolve_checkpoint
from rankopt.fit.backbones import choose
from rankopt.files import write_text_atomic
from rankopt.fit.clock import Clock, clock_text
from rankopt.fit.output import save_model, steps_text
from rankopt.fit.page import write_flat_report
from rankopt.fit.passes import PASS_MARGIN
from rankopt.fit.record import FitRecord
from rankopt.fit.settings import FitSettings
from rankopt.fit.sizing import CPU_BATCH
from rankopt.postprocess import Expansion, PostProcessing
from rankopt.search.embedder import Embedder
from rankopt.search.index import Index

FLAT_STEPS = PostProcessing(None, None, None, Expansion(k=2, alpha=1.0))
"""The steps a flat folder's index gets: αQE over the query's top 2 (α = 1). It never changes a query's first
result: with ``q' = q + s₁g₁ + s₂g₂`` (``s₁ ≥ s₂`` its similarities to its top two, unit vectors),
``q'·g₁ − q'·g₂ = (s₁ − s₂)(2 − g₁·g₂) ≥ 0``; and it lifts the rest of the ranking where the folder repeats a kind.
Measured with the pretrained features (``benchmarks/results/flat_post.md``, mAP@R): Caltech-101 with MobileNetV2
+0.058 (new photos against the folder) and +0.060 (every photo against the others), Extended Yale B with
MobileFaceNet +0.004 and +0.006, and no change where the folder holds one photo a kind; DBA, larger αQE and PCA
whitening lost up to 0.25 there (whitening also on Caltech-101's repeated kinds), and without classes a fit cannot
tell which folder it has."""
WHY_FLAT_STEPS = ("αQE over each query's top 2 (α = 1): it never changes the first result, and measured on "
                  "Caltech-101 and Extended Yale B it raised mAP@R where the folder repeats a kind (+0.058, +0.004) "
                  "and left it unchanged where it holds one photo a kind; DBA and whitening were measured to hurt "
                  "the latter (benchmarks/results/flat_post.md)")


def is_flat(dataset: RetrievalDataset) -> bool:
    """Whether no photo of ``dataset`` has a class (every label ``-1``)."""
    return bool((np.asarray(dataset.labels)[:, 0] < 0).all())


def fit_flat(dataset: RetrievalDataset, source: str, folder: Any, settings: FitSettings, clock: Clock,
             device: torch.device, skipped: list[str]) -> FitRecord:
    """The model, the index of every photo with :data:`FLAT_STEPS`, ``fit.json`` and the report, in ``folder``."""
    with clock.stage("model") as stage:
        loaded: dict[str, Any] = {}

        def load(backbone: str) -> tuple[float, str]:  # --backbone auto: rankopt.fit.backbones
            checkpoint = resolve_checkpoint(backbone, settings.weights, say=clock.line)
            net, cfg = model_from_checkpoint(checkpoint, device)
            cfg = dataclasses.replace(cfg, name="fit", description=f"rankopt fit of {checkpoint.name} (flat folder)")
            model_path = save_model(folder / layout.MODEL_CKPT, net, cfg, checkpoint)
            embedder = Embedder.from_checkpoint(model_path, device=str(device), batch_size=CPU_BATCH,
                                                runtime=settings.runtime, progress=False)
            loaded.update(checkpoint=checkpoint, cfg=cfg, embedder=embedder, pass_s=_pass_seconds(embedder, dataset))
            return loaded["pass_s"], cfg.model.backbone

        chosen = choose(settings.backbone, settings.weights, load, clock.left)
        checkpoint, cfg, embedder = loaded["checkpoint"], loaded["cfg"], loaded["embedder"]
        stage["done"] = (f"{chosen}{cfg.model.backbone} as released ({checkpoint.name}), at its own framing "
                         f"({cfg.data.test_transform}); no fine-tuning: the folder has no classes")
    _say_the_pass_cost(loaded["pass_s"], len(dataset), clock)
    with clock.stage("index") as stage:
        began = time.monotonic()
        index = Index.build(embedder, dataset, postprocessing=FLAT_STEPS, progress=False)
        index.save(folder / layout.INDEX_DIR)
        rate = len(index) / max(time.monotonic() - began, 1e-6)
        stage["done"] = (f"{len(index):,} photos at {rate:.0f}/s in {folder / layout.INDEX_DIR} ({index.dim}-d, "
                         f"{steps_text(index)})")
    why = ["no class folders: the photos have no classes, so nothing can be fine-tuned or validated; the pretrained "
           "features are served (put each kind of photo in its own folder for a fine-tuned model and a measured "
           "choice)", f"post-processing: {WHY_FLAT_STEPS}"]
    served = f"features ({cfg.data.test_transform}) + {steps_text(index)}"
    chosen = {"model": "features", "served_name": "features", "from": "pretrained", "decided_on": None,
              "pipeline": served, "post": {"whitening": None, "dba": None,
                                           "qe": dataclasses.asdict(FLAT_STEPS.qe) if FLAT_STEPS.qe else None},
              "multiscale": None, "framing": {"preset": cfg.data.test_transform, "validation_map@r": {}},
              "fine_tuned_checkpoint": None, "why": why, "candidates": [], "seconds_per_step": None}
    validation = {"protocols": [], "index_photos": len(index), "known_queries": 0, "new_queries": 0,
                  "train_photos": 0, "train_classes": 0, "held_out_classes": 0,
                  "note": "a flat folder: no classes, no validation", "names": {}}
    record = FitRecord(source, cfg.model.backbone, checkpoint.name, str(device), settings.queries, validation, [],
                       chosen, {}, dataclasses.asdict(settings), {}, machine_info(device), None,
                       dict(clock.seconds), skipped)
    with clock.stage("report") as stage:
        write_flat_report(folder, record, index)
        stage["done"] = f"{folder / layout.REPORT_HTML}, {folder / layout.FIT_JSON}"
    record.seconds = {**clock.seconds, "total": clock.elapsed()}
    write_text_atomic(folder / layout.FIT_JSON, json.dumps(record.to_json(), indent=2) + "\n")
    return record


def _pass_seconds(embedder: Embedder, dataset: RetrievalDataset) -> float:
    """The time of one pass over ``dataset``, from 32 photos spread over it (decoding included)."""
    sample = [dataset.paths[i] for i in np.linspace(0, len(dataset) - 1, min(32, len(dataset))).astype(int)]
    began = time.monotonic()
    embedder.embed(sample)
    return len(dataset) * (time.monotonic() - began) / len(sample)


def _say_the_pass_cost(pass_s: float, photos: int, clock: Clock) -> None:
    """One line before the pass when it will not end within the budget: the budget that would hold it."""
    if pass_s > clock.left():
        minutes = clock.minutes_for(PASS_MARGIN * pass_s)
        clock.line(f"indexing the {photos:,} photos takes about {clock_text(pass_s)} here, more than the "
                   f"{clock_text(clock.left())} left of the budget: every photo is indexed anyway "
                   f"(--minutes {minutes} would hold it)")
