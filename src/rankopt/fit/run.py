"""``fit``: photos in, a validated model and a served index out, within a time budget.

The stages (each prints one line with its time and the work left, :mod:`rankopt.fit.clock`):

1. ``check``: every photo decoded once before a model is loaded (the unreadable ones left out and listed); the
   validation split (:mod:`rankopt.fit.validation`: a share of every class's photos kept back as new photos of
   known classes and, where the folder has enough classes, whole classes held out as new classes; near-duplicates on
   one side, :mod:`rankopt.data.near_duplicates`). A flat folder (no classes) goes to :mod:`rankopt.fit.flat`;
2. ``model``: the pretrained backbone, cut into a fixed trunk and a trainable tail (:mod:`rankopt.fit.trunk`), both
   frozen parts on the faster runtime (:mod:`rankopt.export.runtimes`); ``framing``: the model's centre crop or the
   whole photo (:mod:`rankopt.fit.framing`);
3. ``trunk``: the trunk's outputs of every photo, once (and mirrored for the training photos when the budget allows);
   these network passes are :mod:`rankopt.fit.passes`, the state the stages fill :class:`rankopt.fit.state.FitState`;
4. ``features``: the pretrained embeddings scored as the index is searched, and their post-processing chosen for
   each kind of query (:func:`rankopt.fit.post.choose_for_protocols`);
5. ``tune``: the tail fine-tuned by a rank loss on the training photos, the learning rate and state chosen on
   validation (:mod:`rankopt.fit.tune`);
6. ``post``: post-processing chosen for each fine-tuned state as for the features; the served pipeline chosen by the
   searches the person states (``--queries``, :func:`rankopt.fit.validation.choose_served`);
7. ``refit``: the chosen recipe (loss, learning rate, steps) run again from the pretrained state on every photo,
   kept-back photos and held-out classes included (``--no-refit``: not);
8. ``scales``: multi-scale tried when the budget allows (:mod:`rankopt.fit.scales`);
9. ``index``: every photo's embedding with the served pipeline in ``RUN/index``, the model in ``RUN/model.ckpt``;
10. ``report``: ``RUN/fit.json`` (:mod:`rankopt.fit.record`) and ``RUN/report.html`` (:mod:`rankopt.fit.page`).

Until the report is written the run folder holds ``fit.unfinished.json`` (:mod:`rankopt.layout`), so that a fit
stopped part-way is never served.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rankopt import layout
from rankopt.describe import machine_info
from rankopt.engine.assembly import resolve_device, seed_everything
from rankopt.files import write_text_atomic
from rankopt.fit.clock import Clock, clock_text
from rankopt.fit.flat import fit_flat, is_flat
from rankopt.fit.output import save_index, save_model, served_text, steps_text
from rankopt.fit.page import write_report
from rankopt.fit.passes import frame_and_cache, model_stage
from rankopt.fit.photos import Photos, read_photos, split_photos
from rankopt.fit.post import PostChoice, choose_for_protocols
from rankopt.fit.record import FitRecord, pipeline_record, split_record, tuning_record
from rankopt.fit.scales import BUDGET_SHARE as SCALES_BUDGET_SHARE
from rankopt.fit.scales import MultiScaleTrial, estimated_seconds, try_multiscale
from rankopt.fit.settings import FitSettings, check_run_folder
from rankopt.fit.sizing import busy_cores, threads_beside
from rankopt.fit.state import FitState
from rankopt.fit.trunk import TailStates, embed_cached, trainable_state
from rankopt.fit.tune import Candidate, retrain, tune
from rankopt.fit.validation import (
    KNOWN,
    NEW,
    QUERIES,
    Pipeline,
    choose_served,
    open_floor,
    score_all,
)
from rankopt.models.multiscale import DEFAULT_SCALES
from rankopt.runtime import cpu_count
from rankopt.search.index import Index

SMALL_VALIDATION_CLASSES, SMALL_VALIDATION_PHOTOS = 5, 100
"""Below either, the report says that validation is too small to trust small differences."""
RESERVE_S = 15.0
"""Seconds kept for saving the index, the model and the report (1-6 s on Caltech-101's 8,242 photos)."""
POST_MARGIN = 1.25
"""Each fine-tuned model's post-processing choice is planned at this multiple of the features' (measured)."""
NO_TIME_S = 1.0
"""Below this many seconds for the tuning, the fit says that the budget left no time to fine-tune."""
SCORING_SHARE_MAX = 0.5
"""The tuning runs only when scoring each candidate once on validation takes at most this share of its time (a
large folder's validation, ~30 s, would otherwise turn seconds of tuning into minutes of scoring)."""
TUNE_SPARE, REFIT_SPARE = 0.05, 0.02
"""Shares of the budget left unplanned after the tuning (for the retraining to run over its estimate) and after
the retraining (for the stages after it)."""
REFIT_MARGIN = 1.2
"""The time kept for retraining, as a multiple of the chosen steps' time (scaled to every photo)."""
FEATURES = "features"
"""The pretrained model's name among the pipelines; a fine-tuned state's is :func:`_tuned_name`'s."""
FINE_TUNED = "fine-tuned"
"""``fit.json``'s ``chosen.model`` when a fine-tuned state is served (:data:`FEATURES` otherwise)."""


def fit(photos_source: str | os.PathLike[str], out: str | os.PathLike[str], settings: FitSettings = FitSettings(),
        *, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every stage (module docstring); returns what ``RUN/fit.json`` holds."""
    if settings.queries not in QUERIES:
        raise ValueError(f"queries must be one of {', '.join(QUERIES)}, got {settings.queries!r}")
    folder = check_run_folder(out, settings.overwrite)
    clock = Clock(settings.minutes * 60.0, say)
    seed_everything(settings.seed)
    threads = torch.get_num_threads()
    try:
        _share_the_cores(clock)
        return _fit(photos_source, folder, settings, clock)
    finally:
        torch.set_num_threads(threads)


def _share_the_cores(clock: Clock) -> None:
    """Fewer threads when other processes keep cores busy (:func:`rankopt.fit.sizing.threads_beside`), said."""
    cores, busy, threads = cpu_count(), busy_cores(), torch.get_num_threads()
    fewer = threads_beside(busy, threads, cores)
    if fewer < threads:
        clock.line(f"{busy:.1f} of the {cores} cores are busy with other work: the fit runs on {fewer} thread(s) "
                   f"instead of {threads}")
        torch.set_num_threads(fewer)


def _fit(photos_source: str | os.PathLike[str], folder: Path, settings: FitSettings, clock: Clock
         ) -> dict[str, Any]:
    """:func:`fit` after its checks: the stages."""
    with clock.stage("check") as stage:
        dataset = read_photos(photos_source, None, strict=settings.strict)
        skipped = list(dataset.metadata["bad_images"])
        flat = is_flat(dataset)
        photos = None if flat else split_photos(dataset, settings.seed, settings.validation_fraction)
        stage["done"] = "; ".join([f"{len(dataset):,} photos in no class folder: the pretrained features will be "
                                   "served" if photos is None else photos.split.summary(),
                                   *_check_notes(dataset, photos, folder)])
    folder.mkdir(parents=True, exist_ok=True)
    if skipped:
        write_text_atomic(folder / layout.SKIPPED_TXT, "".join(f"{line}\n" for line in skipped))
    mark = lambda name: layout.write_unfinished(folder, stage=name, photos=str(photos_source), out=str(folder))
    mark("model")
    clock.on_stage = mark
    if photos is None:
        record = fit_flat(dataset, str(photos_source), folder, settings, clock, resolve_device(settings.device),
                          skipped)
    else:
        run = FitState(settings, str(photos_source), folder, clock, resolve_device(settings.device), photos,
                       skipped=skipped)
        with tempfile.TemporaryDirectory(prefix="rankopt-fit-") as scratch:
            run.scratch = Path(scratch)
            record = _stages(run)
    layout.clear_unfinished(folder)
    clock.line(f"finished in {clock_text(clock.elapsed())} (budget {clock_text(clock.budget_s)}): "
               f"rankopt serve {folder}")
    return record.to_json()


def _check_notes(dataset: Any, photos: Photos | None, folder: Path) -> list[str]:
    """What the check says besides the split: the loader's notes (empty class folders, photos in sub-folders,
    other files), classes with one photo, and the unreadable photos left out."""
    notes = list(dataset.metadata.get("notes") or [])
    single = 0 if photos is None else int((np.bincount(photos.labels) == 1).sum())
    if single:
        notes.append(f"{single} class(es) with one photo: trained on and indexed, never a validation query")
    if photos is not None and photos.near_duplicates:
        notes.append(f"{photos.near_duplicates:,} photos with a near-duplicate in their class (copies, resized or "
                     "burst shots: their difference hashes within a few bits), each group kept on one side of every "
                     "split")
    skipped = dataset.metadata["bad_images"]
    if skipped:
        notes.append(f"{len(skipped):,} unreadable photo(s) left out, listed in {folder / layout.SKIPPED_TXT} "
                     "(--strict: refuse instead)")
    return notes


def _stages(run: FitState) -> FitRecord:
    """The stages after ``check`` (module docstring), each in turn; the record as written to ``fit.json``."""
    clock, folder, settings = run.clock, run.folder, run.settings
    model_stage(run)
    frame_and_cache(run)
    _features(run)
    _tune(run)
    _choose(run)
    if settings.refit:
        _refit(run)
    embeddings, choice, scales, trial = _scales(run)
    with clock.stage("index") as stage:
        if embeddings is None:  # one scale: every photo through the served tail (the cached trunk's outputs)
            embeddings = _served_embeddings(run)
        index = _save_model_and_index(run, embeddings, choice, scales)
        stage["done"] = f"{len(index):,} photos in {folder / layout.INDEX_DIR} ({index.dim}-d, {steps_text(index)})"
    with clock.stage("report") as stage:
        record = _record(run, index, choice, scales, trial)
        write_text_atomic(folder / layout.FIT_JSON, json.dumps(record.to_json(), indent=2) + "\n")
        write_report(folder, record, run.photos, _example_embeddings(run))
        stage["done"] = f"{folder / layout.REPORT_HTML}, {folder / layout.FIT_JSON}"
    record.seconds = {**clock.seconds, "total": clock.elapsed()}
    write_text_atomic(folder / layout.FIT_JSON, json.dumps(record.to_json(), indent=2) + "\n")
    return record


def _add_pipelines(run: FitState, model: str, x: torch.Tensor) -> None:
    """The pipelines of ``model`` (validation embeddings ``x``): alone, and with the post-processing chosen for each
    protocol and for both (a choice equal to one already listed is not repeated)."""
    split = run.split
    floor = open_floor(run.pipelines) if model != FEATURES and NEW in split.protocols else None
    began = time.monotonic()
    run.pipelines.append(Pipeline(model, None, score_all(x, split), "none"))
    if model == FEATURES:
        run.score_s = time.monotonic() - began
    listed = {"none"}
    for protocol, choice in choose_for_protocols(x, split, dba=run.settings.dba, floor=floor).items():
        run.choices[model, protocol] = choice
        if choice.describe() not in listed:
            listed.add(choice.describe())
            run.pipelines.append(Pipeline(model, protocol, score_all(x, split, choice.steps(choice.fitted_whitening)),
                                          choice.describe()))


def _features(run: FitState) -> None:
    """The ``features`` stage: the pretrained embeddings of every photo and the features' pipelines."""
    assert run.states is not None
    run.clock.plan("features", run.pass_s * 0.2)
    run.clock.plan("tune", 0.5 * run.clock.left())
    with run.clock.stage("features") as stage:
        began = time.monotonic()
        run.pretrained_embeddings = run.states.embed(TailStates.PRETRAINED, run.all_rows)
        run.tail_s = time.monotonic() - began
        began = time.monotonic()
        _add_pipelines(run, FEATURES, run.pretrained_embeddings[torch.as_tensor(run.split.rows)])
        run.post_s = time.monotonic() - began
        stage["done"] = "pretrained features on validation: " + "; ".join(_scores_text(p) for p in run.pipelines)


def _scores_text(pipeline: Pipeline) -> str:
    values = ", ".join(f"{protocol} queries {s.value:.4f}" for protocol, s in pipeline.scores.items())
    steps = "" if pipeline.steps == "none" else f" + {pipeline.steps}"
    return f"{pipeline.model}{steps}: mAP@R {values}"


def _primary(run: FitState) -> str:
    """The protocol that leads the tuning and decides the served pipeline."""
    return KNOWN if run.settings.queries in (KNOWN, "both") or NEW not in run.split.protocols else NEW


def _tune(run: FitState) -> None:
    """The ``tune`` stage: the tail trained on the training photos, its best state per protocol kept."""
    clock, split, states = run.clock, run.split, run.states
    assert states is not None
    clock.plan("post", POST_MARGIN * run.post_s * len(split.protocols))  # a tuned state per protocol at most
    clock.plan("index", run.tail_s + RESERVE_S)
    scales_s = estimated_seconds(len(run.all_rows), run.rate) + POST_MARGIN * run.post_s
    if getattr(run.net.backbone, "fixed_input_size", None) is None and \
            scales_s <= SCALES_BUDGET_SHARE * clock.budget_s:
        clock.plan("scales", scales_s)

    def validate() -> dict[str, dict[str, float]]:
        x = embed_cached(states.tail, states.cache, split.rows)
        return {protocol: s.metrics for protocol, s in score_all(x, split).items()}

    candidates = [Candidate(loss, lr) for loss in run.settings.losses for lr in run.settings.lrs]
    with clock.stage("tune") as stage:
        after = sum(v for k, v in clock.planned.items() if k != "tune")  # the stages after it, as planned
        available = max(0.0, clock.left() - after - TUNE_SPARE * clock.budget_s)
        scoring_s = run.score_s + run.tail_s * len(split.rows) / max(1, len(run.all_rows))  # one validate()
        least = max(NO_TIME_S, len(candidates) * scoring_s / SCORING_SHARE_MAX)
        seconds = available if available >= least else 0.0
        clock.plan("tune", seconds)
        refit_ratio = len(run.all_rows) / max(1, split.train.size) if run.settings.refit else 0.0
        features = next(p for p in run.pipelines if p.model == FEATURES and p.steps_for is None)  # scored
        run.tuned = tune(states.tail, states.cache, split.train, split.labels[split.train], validate, candidates,
                         seconds=seconds, clock=clock, primary=_primary(run), batch_size=run.settings.batch_size,
                         m=run.settings.m, seed=run.settings.seed, reserve_per_step=REFIT_MARGIN * refit_ratio,
                         pretrained_scores={p: s.metrics for p, s in features.scores.items()})
        for protocol, best in sorted(run.tuned.best.items(), key=lambda kv: kv[0] != run.tuned.primary):
            if best.state is not None and all(b.state is not best.state for b in run.tuned_states.values()):
                name = _tuned_name(protocol, run.tuned.primary)
                run.tuned_states[name] = best
                states.add(name, best.state)
        stage["done"] = "; ".join(f"best on {p} queries: {b.source} (mAP@R {b.metrics['map@r']:.4f})"
                                  for p, b in run.tuned.best.items())
        stage["done"] += f"; {sum(t.steps for t in run.tuned.trials)} steps ({available:.0f} s were available)"
        if seconds == 0.0:
            run.no_time_to_tune = _no_time_to_tune(clock, available, least, after, len(candidates), scoring_s)
            stage["done"] += f"; no time was left to fine-tune: {run.no_time_to_tune}"


def _no_time_to_tune(clock: Clock, available: float, least: float, after: float, candidates: int,
                     score_s: float) -> str:
    """Why the tuning did not run (``available`` seconds, under the ``least`` it needs), with the ``--minutes``
    that would give it about half the budget and at least ``least``."""
    minutes = max(clock.minutes_leaving(0.5, after), math.ceil(least / 0.5 / 60))
    need = "" if least <= NO_TIME_S else \
        (f" ({clock_text(available)} were left for it; its {candidates} candidates need {clock_text(least)}, so that "
         f"scoring each once on validation, {score_s:.0f} s, takes at most half of it)")
    return (f"the stages before took {clock_text(clock.elapsed())} of the {clock_text(clock.budget_s)} budget{need}, "
            f"and scoring and indexing a fine-tuned state would take about {clock_text(after)} more: --minutes "
            f"{minutes} would give the fine-tuning about half of it")


def _tuned_name(protocol: str, primary: str) -> str:
    return FINE_TUNED if protocol == primary else f"{FINE_TUNED} (best on {protocol} queries)"


def _choose(run: FitState) -> None:
    """The ``post`` stage: each fine-tuned state's pipelines, then the served one (:func:`choose_served`)."""
    assert run.states is not None
    with run.clock.stage("post") as stage:
        for name in run.tuned_states:
            _add_pipelines(run, name, run.states.embed(name, run.split.rows))
        run.served, run.why = choose_served(run.pipelines, run.settings.queries, run.split.protocols)
        stage["done"] = "; ".join(_scores_text(p) for p in run.pipelines if p.trained) or "no fine-tuned state"
        stage["done"] += f"; {run.why[-1]}"


def _refit(run: FitState) -> None:
    """The ``refit`` stage: the recipe of the served fine-tuned state (else of the leading one, kept beside the
    served features) run again from the pretrained state on every photo, within the time left."""
    assert run.states is not None and run.tuned is not None and run.served is not None
    model = run.served.model if run.served.trained else next(iter(run.tuned_states), None)
    if model is None:
        return
    best = run.tuned_states[model]
    assert best.candidate is not None
    split, clock = run.split, run.clock
    with clock.stage("refit") as stage:
        steps = round(best.step * len(run.all_rows) / max(1, split.train.size))
        later = sum(v for k, v in clock.planned.items() if k not in ("tune", "post", "refit"))
        seconds = max(0.0, clock.left() - later - REFIT_SPARE * clock.budget_s)
        began = time.monotonic()
        taken = retrain(run.states.tail, run.states.cache, run.all_rows, split.labels, best.candidate, steps,
                        start_state=run.tuned.pretrained_state, seconds=seconds, clock=clock,
                        batch_size=run.settings.batch_size, m=run.settings.m, seed=run.settings.seed)
        if taken:
            run.states.add("refit", trainable_state(run.states.tail))
        classes = int(np.unique(split.labels).size)
        note = (f"the chosen recipe ({best.candidate.describe()}, {best.step} steps on {split.train.size:,} photos) run "
                f"again on all {len(run.all_rows):,} photos of the {classes} classes, the kept-back ones included: "
                f"{taken} steps" + ("" if taken == steps else f" of {steps} (the time ran out)") +
                "; the validation scores are those of the model before it (a model cannot be scored on photos it "
                "trained on), and the retrained model is the fine-tuned one " +
                ("served" if run.served.trained else f"kept in {layout.FINE_TUNED_CKPT}"))
        run.refit = {"note": note, "model": model, "steps": taken, "planned_steps": steps, "classes": classes,
                     "photos": int(len(run.all_rows)), "seconds": time.monotonic() - began}
        stage["done"] = note


def _served_state(run: FitState) -> str:
    """The tail state the served model embeds with: the retraining of the served fine-tuned state, if any."""
    assert run.served is not None and run.states is not None
    if not run.served.trained:
        return TailStates.PRETRAINED
    refit = run.refit is not None and run.refit["model"] == run.served.model and "refit" in run.states.states
    return "refit" if refit else run.served.model


def _served_choice(run: FitState) -> PostChoice:
    assert run.served is not None
    if run.served.steps_for is None:
        return PostChoice(None, None, None, {}, [])
    return run.choices[run.served.model, run.served.steps_for]


def _served_embeddings(run: FitState) -> torch.Tensor:
    """Every photo's embedding by the served model at one scale; the served tail state left loaded."""
    assert run.states is not None
    state = _served_state(run)
    embeddings = run.pretrained_embeddings if state == TailStates.PRETRAINED else run.states.embed(state,
                                                                                                   run.all_rows)
    assert embeddings is not None
    run.states.load(state)
    return embeddings


def _scales(run: FitState) -> tuple[torch.Tensor | None, PostChoice, tuple[float, ...] | None, MultiScaleTrial]:
    """The ``scales`` stage when planned and the time allows; the index's steps either way, and its embeddings when
    multi-scale is kept (``None``: one scale, :func:`_served_embeddings`)."""
    assert run.states is not None and run.served is not None and run.sizing is not None
    states, clock, served = run.states, run.clock, run.served
    state = _served_state(run)
    states.load(state)
    choice, planned = _served_choice(run), "scales" in clock.planned
    scales_s = clock.planned.get("scales", 0.0)
    late = planned and clock.left() < scales_s + clock.planned.get("index", 0.0)
    if not planned or late:
        one_size = getattr(run.net.backbone, "fixed_input_size", None) is not None
        return None, choice, None, MultiScaleTrial(
            "multi-scale not tried: this backbone takes one input size" if one_size else
            f"multi-scale not tried: it would take about {clock_text(scales_s)}, more than the "
            f"{clock_text(clock.left() - clock.planned.get('index', 0.0))} left before the index" if late else
            "multi-scale not tried: one pass at every scale would take over "
            f"{SCALES_BUDGET_SHARE:.0%} of the budget")
    decide_on = [_primary(run)] + ([NEW] if run.settings.queries == "both" and NEW in run.split.protocols
                                   and _primary(run) != NEW else [])
    with clock.stage("scales") as stage:
        retrained = state == "refit"  # validation may score only a model that did not train on it
        if retrained:
            states.load(served.model)
        trial = try_multiscale(run.net, run.photos.dataset, run.split, {p: served.scores[p].value for p in decide_on},
                               steps_for=served.steps_for or decide_on[0], device=run.device, batch_size=run.sizing.trunk_batch, workers=run.sizing.workers,
                               dba=run.settings.dba, decide_on=decide_on,
                               retrained=(lambda: states.load("refit")) if retrained else None,
                               time_left=lambda: clock.left() - clock.planned.get("index", 0.0),
                               pass_s=estimated_seconds(len(run.all_rows), run.rate))
        states.load(state)
        stage["done"] = trial.note
    if trial.choice is not None and trial.embeddings is not None:
        return trial.embeddings, trial.choice, DEFAULT_SCALES, trial
    return None, choice, None, trial


def _save_model_and_index(run: FitState, embeddings: torch.Tensor, choice: PostChoice,
                          scales: tuple[float, ...] | None) -> Index:
    """``RUN/model.ckpt`` and ``RUN/index`` (:func:`rankopt.fit.output.save_index`); ``RUN/fine_tuned.ckpt`` the
    fine-tuned weights when the features are served."""
    assert run.states is not None and run.served is not None
    cfg = dataclasses.replace(run.cfg, name="fit", description=f"rankopt fit of {run.checkpoint.name}",
                              model=dataclasses.replace(run.cfg.model, freeze_bn=True))
    if not run.served.trained and run.tuned_states:  # kept for a look (and a fair score)
        run.states.load("refit" if "refit" in run.states.states else next(iter(run.tuned_states)))
        save_model(run.folder / layout.FINE_TUNED_CKPT, run.net, cfg, run.checkpoint)
    run.states.load(_served_state(run))
    model_path = save_model(run.folder / layout.MODEL_CKPT, run.net, cfg, run.checkpoint)
    return save_index(run.folder / layout.INDEX_DIR, model_path, run.photos, embeddings, choice, scales, run.device,
                      run.settings.runtime)


def _example_embeddings(run: FitState) -> dict[str, torch.Tensor]:
    """Validation embeddings of the features and of the served model (when fine-tuned), for the report's examples."""
    assert run.pretrained_embeddings is not None and run.states is not None and run.served is not None
    out = {"pretrained features": run.pretrained_embeddings[torch.as_tensor(run.split.rows)]}
    if run.served.trained:
        out["served model (fine-tuned)"] = run.states.embed(run.served.model, run.split.rows)
    return out


def _why(run: FitState, trial: MultiScaleTrial) -> list[str]:
    assert run.tuned is not None
    why = [f"framing: {run.framing.note}"]
    if run.refit is not None:
        why.append(run.refit["note"])
    why.append(f"learning rate and state chosen by validation mAP@R among "
               f"{', '.join(t.candidate.describe() for t in run.tuned.trials)} and the pretrained state: "
               + "; ".join(f"on {p} queries {b.source}" for p, b in run.tuned.best.items()))
    if sum(t.steps for t in run.tuned.trials) == 0:
        why.append("no fine-tuning step was taken: " + (run.no_time_to_tune or "the budget was spent before it"))
    elif not run.tuned_states:
        why.append("no fine-tuned state beat the pretrained features on validation: the features are served")
    classes = np.unique(run.split.labels[np.union1d(run.split.known_queries, run.split.new_queries)]).size
    queries = run.split.known_queries.size + run.split.new_queries.size
    if classes < SMALL_VALIDATION_CLASSES or queries < SMALL_VALIDATION_PHOTOS:
        why.append(f"caution: validation holds only {queries} query photos of {classes} classes, too few to tell small "
                   "gains from luck; with so few photos a fit can learn little, and its choices are rough guesses")
    if run.split.open_note:
        why.append(run.split.open_note)
    return why + run.why + [trial.note]


def _record(run: FitState, index: Index, choice: PostChoice, scales: tuple[float, ...] | None,
            trial: MultiScaleTrial) -> FitRecord:
    assert run.tuned is not None and run.served is not None and run.sizing is not None
    served, state = run.served, run.tuned_states.get(run.served.model)
    fine_tuned = layout.FINE_TUNED_CKPT if not served.trained and run.tuned_states else None
    chosen = {"model": FINE_TUNED if served.trained else FEATURES, "served_name": served.name,
              "from": state.source if state is not None else "pretrained", "decided_on": _primary(run),
              "pipeline": served_text(served.model, choice, scales, run.framing.words()),
              "post": choice.to_dict(), "multiscale": index.preprocessing.get("multiscale"),
              "framing": {"preset": run.framing.preset, "validation_map@r": run.framing.scores},
              "fine_tuned_checkpoint": fine_tuned, "why": _why(run, trial),
              "candidates": tuning_record(run.tuned), "seconds_per_step": run.tuned.step_seconds}
    pipelines = [pipeline_record(p, None if p.steps_for is None else run.choices[p.model, p.steps_for].to_dict())
                 for p in run.pipelines]
    served_scores = {p: s.metrics for p, s in served.scores.items()}
    if trial.choice is not None and trial.embeddings is not None:  # multi-scale served: its own validation scores
        served_scores[_primary(run)] = dict(trial.choice.metrics)
    return FitRecord(run.source, run.cfg.model.backbone, run.checkpoint.name, str(run.device), run.settings.queries,
                     split_record(run.split, run.photos.near_duplicates), pipelines, chosen, served_scores,
                     dataclasses.asdict(run.settings), run.sizing.to_dict(),
                     {**machine_info(run.device), "runtime": run.runtime and run.runtime.to_dict()},
                     None if run.refit is None else {k: v for k, v in run.refit.items() if k != "note"},
                     dict(run.clock.seconds), run.skipped)
