"""``fit``: photos in, a validated model and a served index out, within a time budget.

Stages (each prints one line with its time and the work left, :mod:`rankopt.fit.clock`):

1. ``check``: every photo opened (bad files refused, each named) before a model is loaded;
2. ``model``: the pretrained backbone (by name from rankopt's cache, or a file), cut into a fixed trunk and a
   trainable tail (:mod:`rankopt.fit.trunk`); classes held out for validation, saved in ``RUN/classes``;
   ``framing``: the model's centre crop or the whole photo, chosen on validation (:mod:`rankopt.fit.framing`);
3. ``trunk``: the trunk's outputs of every photo, once (and mirrored for the training photos when the budget
   allows);
4. ``features``: the pretrained embeddings, scored on the validation classes, and their post-processing chosen
   there (:mod:`rankopt.fit.post`; its time plans the fitted model's);
5. ``tune``: the tail fine-tuned by a rank loss, the learning rate chosen on validation (:mod:`rankopt.fit.tune`);
   ``refit``: the chosen recipe (loss, learning rate, steps) run again from the pretrained state on every class,
   the validation ones included (``--no-refit``: not), the fine-tuned model from then on;
6. ``post``: whitening, DBA, αQE chosen on validation for the fitted model, as for the features; the fitted
   pipeline is served only when it beats the features' pipeline on the validation classes by more than the luck
   of those classes (:func:`rankopt.fit.post.served_pipeline`), so never worse than the features;
7. ``index``: every photo's embedding with the chosen model and steps in ``RUN/index`` (a normal index), the
   model in ``RUN/model.ckpt``;
8. ``report``: ``RUN/fit.json`` and ``RUN/report.html`` (:mod:`rankopt.fit.page`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rankopt.config import config_to_dict
from rankopt.data.transforms import build_transform
from rankopt.describe import machine_info
from rankopt.engine.assembly import model_from_checkpoint, resolve_device, seed_everything
from rankopt.engine.checkpoint import save_model_checkpoint
from rankopt.engine.embed_and_score import EmbeddedSplit
from rankopt.files import write_text_atomic
from rankopt.fit.clock import Clock, clock_text
from rankopt.fit.framing import choose_framing
from rankopt.fit.page import write_report
from rankopt.fit.photos import Photos, read_photos, save_split, split_photos
from rankopt.fit.post import (
    SHRINKAGES,
    PostChoice,
    WhiteningChoice,
    choose_postprocessing,
    score_self_retrieval,
    served_pipeline,
)
from rankopt.fit.scales import BUDGET_SHARE as SCALES_BUDGET_SHARE
from rankopt.fit.scales import MultiScaleTrial, estimated_seconds, try_multiscale
from rankopt.fit.sizing import CPU_BATCH, Sizing, size_for
from rankopt.fit.trunk import TrunkCache, embed_cached, final_resolution_cut, trunk_outputs
from rankopt.fit.tune import Candidate, TuneResult, load_trainable, retrain, trainable_state, tune
from rankopt.fit.weights import resolve_checkpoint
from rankopt.models.multiscale import DEFAULT_SCALES
from rankopt.models.stages import cut
from rankopt.postprocess import PostProcessing
from rankopt.search.embedder import Embedder
from rankopt.search.index import Index

SMALL_VALIDATION_CLASSES, SMALL_VALIDATION_PHOTOS = 5, 100
"""Below either, the report says that validation is too small to trust small differences."""
PARITY_TOLERANCE = 1e-3
"""Largest difference allowed between a photo's indexed vector and its embedding by the saved model."""
RESERVE_S = 15.0
"""Seconds kept for saving the index, the model and the report (1-6 s on Caltech-101's 8,242 photos)."""
POST_MARGIN = 1.25
"""The fitted model's post-processing choice is planned at this multiple of the features' (measured)."""
NO_TIME_S = 1.0
"""Below this many seconds for the tuning, the fit says that the budget left no time to fine-tune."""
TRUNK_SHARE = 0.5
"""Above this share of the budget for one pass over the photos, the fit warns that little time is left to train."""
FINE_TUNED = "fine_tuned.ckpt"
"""The fine-tuned model when the features are served instead (``model.ckpt`` is always the served one)."""
TUNE_SPARE, REFIT_SPARE = 0.05, 0.02
"""Shares of the budget left unplanned after the tuning (for the retraining to run over its estimate) and after
the retraining (for the stages after it)."""
REFIT_MARGIN = 1.2
"""The time kept for retraining, as a multiple of the chosen steps' time (scaled to every class's photos)."""
MIRROR_SHARE = 0.25
"""The mirrored training copies are computed when they take at most this share of the budget left."""
FRAMING_COST = 2.5
"""The framing choice's time, as a multiple of the validation photos' pass through the trunk (two framings through
the whole network)."""


@dataclass(frozen=True)
class FitSettings:
    """What ``rankopt fit`` takes besides the photos and the run folder."""

    minutes: float = 10.0
    backbone: str = "mobilenet_v2"
    weights: str | None = None
    seed: int = 0
    device: str = "auto"
    validation_fraction: float = 0.2
    losses: tuple[str, ...] = ("sup_ap",)
    lrs: tuple[float, ...] = (1e-5, 3e-5, 1e-4)
    """Adam learning rates tried: Caltech-101's benchmark grid (docs/benchmarks.md). A first fit grid one step higher
    (3e-5, 1e-4, 3e-4) ranked them 3e-5 > 1e-4 > 3e-4 on a fit's validation classes, its best state early (step 109
    of 516): the grid moved back down (benchmarks/results/fit.md)."""
    batch_size: int = 64
    m: int = 4
    dba: bool = True
    """Whether DBA is tried on validation (the index stays changeable: its vectors are recomputed on a change)."""
    refit: bool = True
    """Whether the chosen recipe (loss, learning rate, steps) is run again on every class, the validation ones
    included, for the served model (:func:`rankopt.fit.tune.retrain`; the steps scaled by the photos added)."""


def check_run_folder(out: str | os.PathLike[str]) -> Path:
    """``out`` as a new run folder: refused when it exists with anything in it (nothing is overwritten)."""
    folder = Path(out).expanduser()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise FileExistsError(f"run folder {str(folder)!r} already exists and is not empty: choose a new --out")
    return folder


def _validation_scores(x: torch.Tensor, photos: Photos, rows: np.ndarray, post: PostProcessing | None = None
                       ) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    names = [photos.class_names[c] for c in photos.labels[rows]]
    return score_self_retrieval(x, photos.labels[rows], post, categories=names)  # type: ignore[return-value]


def fit(photos_source: str | os.PathLike[str], out: str | os.PathLike[str], settings: FitSettings = FitSettings(),
        *, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every stage (module docstring); returns what ``RUN/fit.json`` holds."""
    folder = check_run_folder(out)
    clock = Clock(settings.minutes * 60.0, say)
    seed_everything(settings.seed)
    device = resolve_device(settings.device)
    with clock.stage("check") as stage:
        dataset = read_photos(photos_source, None)
        photos = split_photos(dataset, settings.validation_fraction, settings.seed)
        stage["done"] = photos.summary()
    with clock.stage("model") as stage:
        checkpoint = resolve_checkpoint(settings.backbone, settings.weights, say=clock.line)
        net, cfg = model_from_checkpoint(checkpoint, device)
        dataset.transform = build_transform(cfg.data.test_transform, cfg.data.image_size)
        folder.mkdir(parents=True, exist_ok=True)
        save_split(photos, folder)
        size = tuple(dataset[0]["image"].shape[-2:])
        net.freeze_bn = True
        at = final_resolution_cut(net.cpu(), size)  # type: ignore[arg-type]
        net.to(device)
        trunk, tail = cut(net, at)
        for p in trunk.parameters():
            p.requires_grad_(False)
        trainable = sum(p.numel() for p in tail.parameters() if p.requires_grad)
        stage["done"] = (f"{cfg.model.backbone} at {size[0]}x{size[1]} px: the last {len(tail.stages)} of "
                         f"{at + len(tail.stages)} stages and the head fine-tuned ({trainable / 1e6:.2f} M parameters)")
    rows_all = np.arange(len(dataset))
    train_rows, val_rows = np.flatnonzero(photos.training), np.flatnonzero(photos.validation)
    with torch.no_grad():
        sizing = size_for(device, trunk.eval()(dataset[0]["image"].unsqueeze(0).to(device)).numel())
        sizing.check_cache(len(dataset))
        began = time.monotonic()  # one batch, decoding included: the time every photo will take
        trunk(torch.stack([dataset[i]["image"] for i in range(min(sizing.trunk_batch, len(dataset)))]).to(device))
        expected = len(dataset) * (time.monotonic() - began) / min(sizing.trunk_batch, len(dataset))
    clock.plan("framing", FRAMING_COST * expected * len(val_rows) / len(dataset))
    clock.plan("trunk", expected)
    with clock.stage("framing") as stage:
        framing = choose_framing(net, photos.part(photos.validation, "validation"), photos.labels[val_rows],
                                 photos.class_names, cfg.data.test_transform, cfg.data.image_size, device=device,
                                 batch_size=sizing.trunk_batch, workers=sizing.workers)
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, test_transform=framing.preset))
        dataset.transform = build_transform(framing.preset, cfg.data.image_size)
        stage["done"] = framing.note
    if expected > TRUNK_SHARE * clock.left():
        clock.line(f"warning: passing the {len(dataset):,} photos through the network once takes about "
                   f"{clock_text(expected)} here, most of the {clock_text(clock.budget_s)} budget: the fine-tuning "
                   "gets little time (a larger --minutes gives it more)")
    with clock.stage("trunk") as stage:
        began = time.monotonic()
        center, shape = trunk_outputs(trunk, dataset, device=device, batch_size=sizing.trunk_batch,
                                      workers=sizing.workers)
        rate = len(dataset) / max(time.monotonic() - began, 1e-6)
        cache = TrunkCache(center, shape)
        mirror_cost = len(train_rows) / rate
        if mirror_cost <= MIRROR_SHARE * clock.left() and \
                sizing.cache_bytes(len(dataset) + len(train_rows)) <= sizing.cache_budget:
            cache.mirrored, _ = trunk_outputs(trunk, photos.part(photos.training, "train"), device=device,
                                              batch_size=sizing.trunk_batch, workers=sizing.workers, mirror=True,
                                              desc="trunk (mirrored)")
            cache.rows = train_rows
        stage["done"] = (f"{len(dataset):,} photos at {rate:.0f}/s, {'with' if cache.mirrored is not None else 'without'}"
                         f" mirrored copies of the training photos ({cache.nbytes() / 2**20:.0f} MiB)")
    clock.plan("features", len(dataset) / rate * 0.2)
    clock.plan("tune", 0.5 * clock.left())
    with clock.stage("features") as stage:
        began = time.monotonic()
        features = embed_cached(tail, cache, rows_all)
        tail_rate = len(rows_all) / max(time.monotonic() - began, 1e-6)
        features_val, features_by_class = _validation_scores(features[val_rows], photos, val_rows)
        began = time.monotonic()
        WhiteningChoice("supervised", SHRINKAGES[0]).fit(features[train_rows], photos.labels[train_rows], "timing")
        whitening_s = time.monotonic() - began
        began = time.monotonic()  # the features' pipeline now: its time is what the fitted model's will take
        choices = {"features": choose_postprocessing(features[train_rows], photos.labels[train_rows],
                                                     features[val_rows], photos.labels[val_rows], dba=settings.dba)}
        post_s = time.monotonic() - began
        stage["done"] = (f"pretrained features on validation: mAP@R {features_val['map@r']:.4f}, "
                         f"R@1 {features_val['recall@1']:.4f}; with {choices['features'].describe()}: mAP@R "
                         f"{choices['features'].metrics['map@r']:.4f}")

    def validate() -> dict[str, float]:
        return score_self_retrieval(embed_cached(tail, cache, val_rows), photos.labels[val_rows])  # type: ignore

    clock.plan("post", POST_MARGIN * post_s)  # the fitted model's choice
    clock.plan("index", len(rows_all) / tail_rate + whitening_s + RESERVE_S)
    scales_s = estimated_seconds(len(rows_all), rate)
    one_size = getattr(net.backbone, "fixed_input_size", None) is not None
    scales_s += POST_MARGIN * post_s  # the pass, then its post-processing choice
    multiscale = not one_size and scales_s <= SCALES_BUDGET_SHARE * clock.budget_s
    if multiscale:
        clock.plan("scales", scales_s)
    candidates = [Candidate(loss, lr) for loss in settings.losses for lr in settings.lrs]
    with clock.stage("tune") as stage:
        seconds = max(0.0, clock.left() - sum(v for k, v in clock.planned.items() if k != "tune")
                      - TUNE_SPARE * clock.budget_s)
        clock.plan("tune", seconds)
        refit_ratio = len(rows_all) / max(1, len(train_rows)) if settings.refit else 0.0
        tuned = tune(tail, cache, train_rows, photos.labels[train_rows], validate, candidates, seconds=seconds,
                     clock=clock, batch_size=settings.batch_size, m=settings.m, seed=settings.seed,
                     reserve_per_step=REFIT_MARGIN * refit_ratio)
        stage["done"] = (f"best on validation: {tuned.best_from} (mAP@R {tuned.best_metrics['map@r']:.4f}); "
                         f"{sum(t.steps for t in tuned.trials)} steps ({seconds:.0f} s were available)")
        if seconds < NO_TIME_S:
            stage["done"] += (f"; no time was left to fine-tune: the stages before took {clock_text(clock.elapsed())} "
                              f"of the {clock_text(clock.budget_s)} budget (a larger --minutes gives it time)")
    refit, refit_state = None, None
    if settings.refit and tuned.best_state is not None and tuned.best_candidate is not None:
        with clock.stage("refit") as stage:
            refit, refit_state = _refit(tail, cache, photos, tuned, settings, clock, rows_all, train_rows)
            stage["done"] = refit["note"]
    with clock.stage("post") as stage:
        fitted = None
        if tuned.best_state is not None:
            load_trainable(tail, tuned.best_state)
            fitted = embed_cached(tail, cache, rows_all)
        if fitted is not None:
            choices["fitted"] = choose_postprocessing(fitted[train_rows], photos.labels[train_rows], fitted[val_rows],
                                                      photos.labels[val_rows], dba=settings.dba)
        by_class = {name: _validation_scores(x[val_rows], photos, val_rows, choices[name].steps(choices[name].fitted))[1]
                    for name, x in (("features", features), ("fitted", fitted)) if x is not None}
        served, served_why = ("features", "no fine-tuned state beat the features") if fitted is None else \
            served_pipeline(by_class["features"], by_class["fitted"])
        stage["done"] = "; ".join(f"{k} + {c.describe()}: mAP@R {c.metrics['map@r']:.4f}" for k, c in choices.items())
        stage["done"] += f"; {served_why}"
    if refit_state is not None:  # the validated recipe on every class: the fine-tuned model from here on
        load_trainable(tail, refit_state)
    if served == "features":
        if tuned.best_state is not None:  # the fine-tuned model, not served, kept for a look (and a fair score)
            _save_model(folder / FINE_TUNED, net, cfg, checkpoint)
        load_trainable(tail, tuned.pretrained_state)
    embeddings = features if served == "features" else \
        embed_cached(tail, cache, rows_all) if refit_state is not None else fitted  # the tail holds the refit
    assert embeddings is not None
    served_choice, scales = choices[served], None
    late = multiscale and clock.left() < scales_s + clock.planned.get("index", 0.0)
    if multiscale and not late:
        with clock.stage("scales") as stage:
            # validation may score only a model that did not train on it: the tuned state, not the retrained one
            retrained = served == "fitted" and refit_state is not None and tuned.best_state is not None
            if retrained:
                load_trainable(tail, tuned.best_state)
            trial = try_multiscale(net, dataset, photos.labels, train_rows, val_rows, served_choice, device=device,
                                   batch_size=sizing.trunk_batch, workers=sizing.workers, dba=settings.dba,
                                   retrained=(lambda: load_trainable(tail, refit_state)) if retrained else None,
                                   time_left=lambda: clock.left() - clock.planned.get("index", 0.0),
                                   pass_s=estimated_seconds(len(rows_all), rate))
            if retrained:
                load_trainable(tail, refit_state)
            if trial.choice is not None and trial.embeddings is not None:
                served_choice, embeddings, scales = trial.choice, trial.embeddings, DEFAULT_SCALES
            stage["done"] = trial.note
    else:
        trial = MultiScaleTrial("multi-scale not tried: this backbone takes one input size" if one_size else
                                f"multi-scale not tried: it would take about {clock_text(scales_s)}, more than the "
                                f"{clock_text(clock.left())} left" if late else
                                f"multi-scale not tried: one pass at every scale would take about "
                                f"{clock_text(scales_s)}, over {SCALES_BUDGET_SHARE:.0%} of the budget")
    with clock.stage("index") as stage:
        index = _save_model_and_index(folder, net, cfg, photos, embeddings, served_choice, checkpoint, scales)
        stage["done"] = f"{len(index):,} photos in {folder / 'index'} ({index.dim}-d, {_steps_text(index)})"
    with clock.stage("report") as stage:
        record = _record(settings, sizing, str(photos_source), photos, features_val, features_by_class, fitted,
                         choices, (served, served_why), tuned, clock, device, cfg.model.backbone, val_rows, checkpoint)
        record["per_class"].update({f"{name}_post": scores for name, scores in by_class.items()})
        record["chosen"]["why"].insert(0, f"framing: {framing.note}")
        record["chosen"]["why"].append(trial.note)
        record["chosen"]["framing"] = {"preset": framing.preset, "validation_map@r": framing.scores}
        if refit is not None:
            record["chosen"]["why"].insert(1, refit["note"])
            record["refit"] = {k: v for k, v in refit.items() if k != "note"}
        record["chosen"]["multiscale"] = index.preprocessing.get("multiscale")  # as the index records them
        record["chosen"]["post"] = served_choice.to_dict()  # re-chosen on the multi-scale embeddings when kept
        record["chosen"]["pipeline"] = served_text(served, served_choice, scales, framing.words())
        record["served"] = served_choice.metrics
        write_text_atomic(folder / "fit.json", json.dumps(record, indent=2) + "\n")
        write_report(folder, record, photos, val_rows, features[val_rows],
                     None if fitted is None else fitted[val_rows], choices)
        stage["done"] = f"{folder / 'report.html'}, {folder / 'fit.json'}"
    record["seconds"] = {**clock.seconds, "total": clock.elapsed()}
    write_text_atomic(folder / "fit.json", json.dumps(record, indent=2) + "\n")
    clock.line(f"finished in {clock_text(clock.elapsed())} (budget {clock_text(clock.budget_s)}): "
               f"rankopt serve {folder}")
    return record


def _refit(tail: Any, cache: TrunkCache, photos: Photos, tuned: TuneResult, settings: FitSettings, clock: Clock,
           rows_all: np.ndarray, train_rows: np.ndarray) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The chosen candidate again from the pretrained state on every photo, for its chosen steps scaled by the
    photos added (same epochs), within the time left; its record and state."""
    assert tuned.best_candidate is not None
    steps = round(tuned.best_step * len(rows_all) / max(1, len(train_rows)))
    later = sum(v for k, v in clock.planned.items() if k not in ("tune", "refit"))
    seconds = max(0.0, clock.left() - later - REFIT_SPARE * clock.budget_s)
    began = time.monotonic()
    taken = retrain(tail, cache, rows_all, photos.labels, tuned.best_candidate, steps,
                    start_state=tuned.pretrained_state, seconds=seconds, clock=clock, batch_size=settings.batch_size,
                    m=settings.m, seed=settings.seed)
    classes = int(np.unique(photos.labels).size)
    note = (f"the chosen recipe ({tuned.best_candidate.describe()}, {tuned.best_step} steps on "
            f"{np.unique(photos.labels[train_rows]).size} classes) run again on all {classes} classes, the validation "
            f"ones included: {taken} steps" + ("" if taken == steps else f" of {steps} (the time ran out)") +
            "; the validation scores are those of the model before it (a model cannot be scored on classes it "
            "trained on), and the retrained model is the fine-tuned one served or kept")
    return ({"note": note, "steps": taken, "planned_steps": steps, "classes": classes, "photos": int(len(rows_all)),
             "seconds": time.monotonic() - began}, trainable_state(tail))


def served_text(model: str, choice: PostChoice, scales: tuple[float, ...] | None, framing: str = "") -> str:
    """The served pipeline in words: the model, the photos' framing where it was chosen, its scales when several,
    the post-processing steps."""
    framed = f" ({framing})" if framing else ""
    at = "" if scales is None else " at scales " + ", ".join(f"{s:.3g}" for s in scales)
    return f"{model}{framed}{at} + {choice.describe()}"


def _steps_text(index: Index) -> str:
    steps = [] if index.post is None or index.post.whitening is None else [f"{index.post.whitening.kind} whitening"]
    steps += [f"{name} k={e['k']}" for name, e in (("DBA", index.record.dba), ("αQE", index.record.qe)) if e]
    return ", ".join(steps) or "no post-processing"


def _save_model_and_index(folder: Path, net: Any, cfg: Any, photos: Photos, embeddings: torch.Tensor,
                          choice: PostChoice, checkpoint: Path, scales: tuple[float, ...] | None) -> Index:
    """``folder/model.ckpt`` (the chosen weights) and ``folder/index`` (every photo, the chosen steps; the
    whitening refitted on every photo's embedding)."""
    model_path = _save_model(folder / "model.ckpt", net, cfg, checkpoint)
    embedder = Embedder.from_checkpoint(model_path, device=str(next(net.parameters()).device), batch_size=CPU_BATCH,
                                        progress=False)  # a few photos: the parity check
    whitening = None
    if choice.whitening is not None:
        whitening = choice.whitening.fit(embeddings, photos.labels, "every photo of the fit") or choice.fitted
        whitening = dataclasses.replace(whitening, model_fingerprint=embedder.fingerprint, scales=scales)
    post = dataclasses.replace(choice.steps(whitening), scales=scales)
    embedder = embedder.with_postprocessing(post)
    vectors = post.whiten(embeddings)
    split = EmbeddedSplit(vectors, torch.as_tensor(np.asarray(photos.dataset.labels)), list(photos.dataset.paths),
                          dict(photos.dataset.metadata))
    _check_parity(embedder, photos, vectors)
    index = Index.from_split(embedder, photos.dataset, split, postprocessing=post, progress=False)
    index.save(folder / "index")
    return index


def _save_model(path: Path, net: Any, cfg: Any, checkpoint: Path) -> Path:
    """``net`` as a checkpoint at ``path`` with ``cfg`` (named ``fit``, BatchNorm statistics frozen)."""
    cfg = dataclasses.replace(cfg, name="fit", description=f"rankopt fit of {checkpoint.name}",
                              model=dataclasses.replace(cfg.model, freeze_bn=True))
    return save_model_checkpoint(path, net.state_dict(), config_to_dict(cfg), {"fit_from": checkpoint.name})


def _check_parity(embedder: Embedder, photos: Photos, vectors: torch.Tensor, count: int = 4) -> None:
    """The saved model and steps embed a few photos as the index holds them (cached trunk + tail, whitened):
    else queries would not meet their own photos."""
    rows = np.linspace(0, len(photos.dataset) - 1, min(count, len(photos.dataset))).astype(int)
    direct = embedder.embed([photos.dataset.paths[r] for r in rows]).embeddings
    worst = float((direct - vectors[torch.as_tensor(rows)]).abs().max())
    if worst > PARITY_TOLERANCE:
        raise RuntimeError(f"the saved model's embeddings differ from the indexed ones by {worst:.2e}")


def _record(settings: FitSettings, sizing: Sizing, source: str, photos: Photos, features_val: dict, features_by_class: dict,
            fitted: torch.Tensor | None, choices: dict[str, PostChoice], served_why: tuple[str, str], tuned: TuneResult,
            clock: Clock, device: torch.device, backbone: str, val_rows: np.ndarray, checkpoint: Path) -> dict[str, Any]:
    served = served_why[0]
    fitted_val, fitted_by_class = (tuned.pretrained, features_by_class) if fitted is None else \
        _validation_scores(fitted[val_rows], photos, val_rows)
    why = [f"learning rate and state chosen by validation mAP@R among {', '.join(t.candidate.describe() for t in tuned.trials)}"
           f" and the pretrained state: {tuned.best_from}"]
    if sum(t.steps for t in tuned.trials) == 0:
        why.append("no fine-tuning step was taken: the budget was spent before it (a larger --minutes gives it time)")
    elif fitted is None:
        why.append("no fine-tuned state beat the pretrained features on validation: the features are served")
    held = int(np.unique(photos.labels[val_rows]).size)
    if held < SMALL_VALIDATION_CLASSES or val_rows.size < SMALL_VALIDATION_PHOTOS:
        why.append(f"caution: validation holds only {held} classes ({val_rows.size} photos), too few to tell small "
                   "gains from luck; with so few photos a fit can learn little, and its choices are rough guesses")
    if fitted is not None:
        why.append(served_why[1] + (f" (the fine-tuned model is kept in {FINE_TUNED})" if served == "features" else ""))
    why.append(f"served: {served} + {choices[served].describe()} (validation mAP@R: " +
               ", ".join(f"{k} {c.metrics['map@r']:.4f}" for k, c in choices.items()) + ")")
    return {
        "photos": source,
        "backbone": backbone, "weights": checkpoint.name, "device": str(device),
        "validation": {"classes": int(np.unique(photos.labels[val_rows]).size), "photos": int(val_rows.size),
                       "train_classes": int(np.unique(photos.labels[photos.training]).size),
                       "train_photos": int(photos.training.sum())},
        "features": features_val, "fitted": fitted_val,
        "features_post": choices["features"].metrics,
        "fitted_post": choices["fitted"].metrics if "fitted" in choices else None,
        "per_class": {"features": features_by_class, "fitted": fitted_by_class},
        "chosen": {"model": "fitted" if served == "fitted" else "features", "from": tuned.best_from,
                   "fine_tuned_checkpoint": FINE_TUNED if served == "features" and fitted is not None else None,
                   "candidates": [{"loss": t.candidate.loss, "lr": t.candidate.lr, "steps": t.steps,
                                   "history": [{"step": s, **m} for s, m in t.history]} for t in tuned.trials],
                   "post": choices[served].to_dict(), "post_by_model": {k: c.to_dict() for k, c in choices.items()},
                   "post_tried": {k: c.tried for k, c in choices.items()},
                   "why": why, "seconds_per_step": tuned.step_seconds},
        "settings": {**dataclasses.asdict(settings)}, "sizing": sizing.to_dict(),
        "seconds": {**clock.seconds},
        "machine": machine_info(device),
    }
