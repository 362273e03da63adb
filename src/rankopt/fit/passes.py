"""The stages of ``rankopt fit`` that pass photos through the frozen network: ``model`` (the network, its cut,
its runtime, the cost of one pass), ``framing`` and ``trunk`` (:mod:`rankopt.fit.run` runs them in order).

Their cost grows with the folder; the rest of a fit runs on cached trunk outputs or capped validation sets. The
framing choice looks at :data:`FRAMING_MAX` kept-back photos at most (sampled by class), and a folder whose one
pass leaves the fine-tuning less than :data:`MIN_TUNE_SHARE` of the budget is said to be too big for it, with the
budget that would fine-tune; the framing is then not compared (the model's own is kept).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from rankopt.data.reader import READ_THREADS
from rankopt.data.transforms import build_transform
from rankopt.engine.assembly import inference_preprocessing, model_from_checkpoint
from rankopt.engine.weights import resolve_checkpoint
from rankopt.fit.backbones import choose
from rankopt.fit.clock import clock_text
from rankopt.fit.framing import FramingChoice, choose_framing
from rankopt.fit.photos import save_split
from rankopt.fit.sizing import size_for
from rankopt.fit.state import FitState
from rankopt.fit.trunk import TailStates, TrunkCache, final_resolution_cut, frozen_forwards, trunk_outputs
from rankopt.fit.validation import sample_by_class
from rankopt.models.stages import cut

TRUNK_SHARE = 0.5
"""Above this share of the budget for one pass over the photos, the fit warns that little time is left to train."""
MIRROR_SHARE = 0.25
"""The mirrored training copies are computed when they take at most this share of the budget left."""
FRAMING_COST = 2.5
"""The framing choice's time, as a multiple of its photos' pass through the trunk (two framings, whole network)."""
FRAMING_MAX = 1000
"""Kept-back photos the framing choice compares the two framings on, at most (sampled by class)."""
MIN_TUNE_SHARE = 0.25
PASS_MARGIN = 1.2
"""The budget said to hold one pass over the photos, as a multiple of its estimate."""
"""Below this share of the budget left after the network passes, the fit says the fine-tuning has too little time."""


def model_stage(run: FitState) -> None:
    """The ``model`` stage: the pretrained network (``--backbone auto``: :mod:`rankopt.fit.backbones`), its
    transform, its cut into trunk and tail, the time of one pass over the photos; the split saved."""
    with run.clock.stage("model") as stage:
        save_split(run.photos, run.folder)
        loaded: list[str] = []

        def load(backbone: str) -> tuple[float, str]:
            loaded[:] = [_load(run, backbone)]
            return run.pass_s, run.cfg.model.backbone

        stage["done"] = choose(run.settings.backbone, run.settings.weights, load, run.clock.left) + loaded[0]


def _load(run: FitState, backbone: str) -> str:
    """``backbone``'s network, cut, frozen forwards, sizing and one-pass time (``run.pass_s``) into ``run``; what was
    loaded, in words."""
    run.checkpoint = resolve_checkpoint(backbone, run.settings.weights, say=run.clock.line)
    run.net, run.cfg = model_from_checkpoint(run.checkpoint, run.device)
    dataset = run.photos.dataset
    dataset.transform = build_transform(run.cfg.data.test_transform, run.cfg.data.image_size)
    size = tuple(dataset[0]["image"].shape[-2:])
    run.net.freeze_bn = True
    at = final_resolution_cut(run.net.cpu(), size)  # type: ignore[arg-type]
    run.net.to(run.device)
    run.trunk, tail = cut(run.net, at)
    for p in run.trunk.parameters():
        p.requires_grad_(False)
    run.states = TailStates(tail, TrunkCache(torch.empty(0), ()))
    trainable = sum(p.numel() for p in tail.parameters() if p.requires_grad)
    run.frozen_net, run.frozen_trunk, run.runtime = frozen_forwards(
        run.net, run.trunk, inference_preprocessing(run.cfg), run.settings.runtime, run.device, run.clock.line)
    with torch.no_grad():
        run.sizing = size_for(run.device, run.trunk.eval()(dataset[0]["image"].unsqueeze(0).to(run.device)).numel())
        count = min(run.sizing.trunk_batch, len(dataset))
        began = time.monotonic()  # one batch, decoding included: the time every photo will take
        run.frozen_trunk(torch.stack([dataset[i]["image"] for i in range(count)]).to(run.device))
        run.pass_s = len(dataset) * (time.monotonic() - began) / count
    return (f"{run.cfg.model.backbone} at {size[0]}x{size[1]} px: the last {len(tail.stages)} of "
            f"{at + len(tail.stages)} stages and the head fine-tuned ({trainable / 1e6:.2f} M parameters); frozen "
            f"passes on {run.runtime.describe()}")


def frame_and_cache(run: FitState) -> None:
    """The ``framing`` stage (on the photos kept back, through the pretrained network) and the ``trunk`` stage."""
    clock, split, dataset, sizing = run.clock, run.split, run.photos.dataset, run.sizing
    assert sizing is not None and run.states is not None
    framed = sample_by_class(np.union1d(split.never_trained(), split.known_queries), split.labels, FRAMING_MAX,
                             np.random.default_rng(run.settings.seed))
    framing_s = FRAMING_COST * run.pass_s * framed.size / len(dataset)
    clock.plan("framing", framing_s)
    clock.plan("trunk", run.pass_s)
    _say_the_passes_cost(run, framing_s)
    compare = run.pass_s + framing_s <= (1 - MIN_TUNE_SHARE) * clock.left()
    with clock.stage("framing") as stage:
        if compare:
            run.framing = choose_framing(run.frozen_net, run.photos.part(framed, "kept back"),
                                         split.labels[framed], split.class_names, run.cfg.data.test_transform,
                                         run.cfg.data.image_size, device=run.device, batch_size=sizing.trunk_batch,
                                         workers=sizing.workers)
        else:  # the budget first goes to the one pass every photo needs
            own = run.cfg.data.test_transform
            run.framing = FramingChoice(own, note=f"the model's own ({own}), not compared with the whole photo: that "
                                        f"would take about {clock_text(framing_s)} of the "
                                        f"{clock_text(clock.left())} left, which the pass over every photo needs")
        run.cfg = dataclasses.replace(run.cfg, data=dataclasses.replace(run.cfg.data,
                                                                         test_transform=run.framing.preset))
        dataset.transform = build_transform(run.framing.preset, run.cfg.data.image_size)
        stage["done"] = run.framing.note
    kw = {"device": run.device, "batch_size": sizing.trunk_batch, "workers": sizing.workers,
          "network": run.frozen_trunk, "read_threads": READ_THREADS}
    spilled = sizing.spills(len(dataset))
    with clock.stage("trunk") as stage:
        began = time.monotonic()
        center, shape = trunk_outputs(run.trunk, dataset, out=run.scratch / "trunk.npy" if spilled else None,
                                      **kw)  # type: ignore[arg-type]
        run.rate = len(dataset) / max(time.monotonic() - began, 1e-6)
        cache = TrunkCache(center, shape)
        if split.train.size / run.rate <= MIRROR_SHARE * clock.left() and \
                sizing.cache_bytes(len(dataset) + split.train.size) <= sizing.cache_budget:
            cache.mirrored, _ = trunk_outputs(run.trunk, run.photos.part(split.train, "train"), mirror=True,
                                              desc="trunk (mirrored)", **kw)  # type: ignore[arg-type]
            cache.rows = split.train
        run.states.cache = cache
        stage["done"] = (f"{len(dataset):,} photos at {run.rate:.0f}/s, "
                         f"{'with' if cache.mirrored is not None else 'without'} mirrored copies of the training "
                         f"photos ({cache.nbytes() / 2**20:.0f} MiB" + (f", in a temporary file: more than "
                         f"{sizing.cache_budget / 2**30:.1f} GiB, the memory share of the cache)" if spilled else ")"))


def _say_the_passes_cost(run: FitState, framing_s: float) -> None:
    """One line, before the passes, when they leave the fine-tuning little of the budget: too big a folder for it to
    do more than the features (less than :data:`MIN_TUNE_SHARE` left, with the ``--minutes`` that would leave it
    that share), or most of the budget (over :data:`TRUNK_SHARE`)."""
    clock, photos = run.clock, len(run.photos.dataset)
    passes_s = run.pass_s + framing_s
    left = clock.left()
    said = (f"passing the {photos:,} photos through the network once takes about {clock_text(run.pass_s)} here "
            f"(on {run.runtime.describe() if run.runtime else 'PyTorch'})")
    tuning_minutes = clock.minutes_for(passes_s / (1 - 2 * MIN_TUNE_SHARE))
    if run.pass_s > left:
        clock.line(f"this folder is too big for a {clock_text(clock.budget_s)} fit: {said}, more than the "
                   f"{clock_text(left)} left; every photo is still indexed, so the fit will end past its budget, "
                   f"with the pretrained features (--minutes {clock.minutes_for(PASS_MARGIN * run.pass_s)} would "
                   f"hold the pass, --minutes {tuning_minutes} would fine-tune too)")
    elif passes_s > (1 - MIN_TUNE_SHARE) * left:
        minutes = tuning_minutes
        clock.line(f"this folder is too big for a {clock_text(clock.budget_s)} fit to do more than the pretrained "
                   f"features: {said}, which leaves the fine-tuning under {MIN_TUNE_SHARE:.0%} of the budget; expect "
                   f"the features to be served (every photo is indexed either way). --minutes {minutes} would give "
                   "the fine-tuning half of it")
    elif run.pass_s > TRUNK_SHARE * left:
        clock.line(f"warning: {said}, most of the {clock_text(clock.budget_s)} budget: the fine-tuning gets little "
                   "time (a larger --minutes gives it more)")
