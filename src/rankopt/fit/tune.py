"""Fine-tuning the tail within a time budget, the learning rate chosen on the validation classes.

Candidates (a rank loss and a learning rate each) first train one after the other for equal shares of the time
(:data:`FIRST_ROUND_SHARE` of it in all), each scored on the validation classes every :data:`CHECK_EVERY_S` at
most. When the best one's learning rate is an end of the grid, one step beyond it is tried for the same share (at
most :data:`GRID_EXTENSIONS` times), so that the choice is bracketed; the best one then trains on for the rest. A
candidate stops early after :data:`PATIENCE` scores without a new best, so a fit ends early once validation stops
improving (and a small folder finishes in seconds). Every evaluation is kept: the state returned is the best one
seen on validation, and the pretrained state itself is among them (scored before any step), so a fit is never
worse than the features it started from on validation. Batches: ``m`` photos of each of
``batch_size / m`` classes, each photo centred or mirrored at random; Adam (the trainer's,
:func:`rankopt.engine.optim.build_optimizer`) with the :data:`WARMUP` schedule, BatchNorm statistics frozen (the
trunk is not trained at all).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from rankopt import losses
from rankopt.config import OptimizerConfig, ScheduleConfig
from rankopt.data.samplers import build_batch_sampler
from rankopt.engine.optim import build_optimizer, lr_beyond, lr_factor
from rankopt.fit.clock import Clock
from rankopt.fit.trunk import TrunkCache

MAX_EPOCHS = 200
"""Most passes over the training photos one candidate makes, a backstop: :data:`PATIENCE` ends a candidate's
training first, once validation stops improving."""
FIRST_ROUND_SHARE = 0.6
EVALUATIONS_PER_SHARE = 4
CHECK_EVERY_S = 15.0
"""Longest time between two validation scores of a training candidate."""
PATIENCE = 4
"""Validation scores in a row without a new best that end a candidate's training (the best state is kept)."""
GRID_EXTENSIONS = 2
"""Learning rates tried at most beyond the grid's end while the best one sits on that end."""
WARMUP = ScheduleConfig(name="constant", interval="step", warmup=10)
"""A linear warm-up over the first 10 steps, then the candidate's learning rate."""
WEIGHT_DECAY = 1e-4
SELECT_ON = "map@r"


@dataclass(frozen=True)
class Candidate:
    loss: str
    lr: float

    def describe(self) -> str:
        return f"{self.loss} lr {self.lr:g}"


@dataclass
class Trial:
    """One candidate's training: its state, optimizer, steps and validation history ``(step, metrics)``."""

    candidate: Candidate
    state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any] | None = None
    steps: int = 0
    history: list[tuple[int, dict[str, float]]] = field(default_factory=list)

    def best(self) -> float:
        return max((m[SELECT_ON] for _, m in self.history), default=float("-inf"))

    def summary(self) -> str:
        best = f"best validation {SELECT_ON} {self.best():.4f}" if self.history else "not scored"
        return f"{self.candidate.describe()}: {self.steps} steps, {best}"


@dataclass
class TuneResult:
    """The best state on validation (``None``: the pretrained state was not beaten) and every trial."""

    best_state: dict[str, torch.Tensor] | None
    best_metrics: dict[str, float]
    best_from: str
    trials: list[Trial]
    pretrained: dict[str, float]
    pretrained_state: dict[str, torch.Tensor]
    step_seconds: float


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of ``model``'s trainable parameters."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in state:
                p.copy_(state[name])


def _batches(labels: np.ndarray, batch_size: int, m: int, seed: int) -> Any:
    classes = np.unique(labels).size
    size = min(batch_size, m * classes)
    return build_batch_sampler("m_per_class", labels, size, m, seed=seed, small_class_policy="fewer")


def tune(tail: nn.Module, cache: TrunkCache, train_rows: np.ndarray, train_labels: np.ndarray,
         validate: Callable[[], dict[str, float]], candidates: Sequence[Candidate], *, seconds: float,
         clock: Clock, batch_size: int = 64, m: int = 4, seed: int = 0) -> TuneResult:
    """Train ``tail`` on the cached trunk outputs of ``train_rows`` for about ``seconds``; ``validate()``
    scores the tail's current state on the validation classes."""
    device = next(tail.parameters()).device
    start_state = trainable_state(tail)
    pretrained = validate()
    best = {"state": None, "metrics": pretrained, "from": "pretrained"}
    trials = [Trial(c, copy.deepcopy(start_state)) for c in candidates]
    sampler = _batches(train_labels, batch_size, m, seed)
    rng = np.random.default_rng(seed)
    batches: list[np.ndarray] = []
    epoch = 0
    step_times: list[float] = []

    def next_batch() -> np.ndarray:
        nonlocal epoch
        if not batches:
            sampler.set_epoch(epoch)
            epoch += 1
            batches.extend(np.asarray(b) for b in sampler)
        return batches.pop(0)

    total_steps = MAX_EPOCHS * max(1, len(sampler))
    began = time.monotonic()

    def run(trial: Trial, share: float) -> None:
        """Train ``trial`` for ``share`` seconds, scored every :data:`CHECK_EVERY_S` at most; it stops early after
        :data:`PATIENCE` scores without a new best of its own, or after :data:`MAX_EPOCHS` passes of its own."""
        load_trainable(tail, trial.state)
        loss_fn = losses.build(trial.candidate.loss).to(device)
        params = [p for p in tail.parameters() if p.requires_grad]
        optimizer = build_optimizer(params, OptimizerConfig("adam", trial.candidate.lr, WEIGHT_DECAY))
        if trial.optimizer_state is not None:
            optimizer.load_state_dict(trial.optimizer_state)
        until = time.monotonic() + share
        check_every = min(share / EVALUATIONS_PER_SHARE, CHECK_EVERY_S)
        next_check, stale = time.monotonic() + check_every, 0
        tail.train()
        while time.monotonic() < until and trial.steps < total_steps and stale < PATIENCE:
            began = time.monotonic()
            picks = next_batch()
            rows = train_rows[picks]
            mirror = rng.random(len(rows)) < 0.5 if cache.mirrored is not None else None
            x = cache.features(rows, mirror).to(device)
            y = torch.as_tensor(train_labels[picks], device=device)
            for group in optimizer.param_groups:
                group["lr"] = trial.candidate.lr * lr_factor(WARMUP, trial.steps, total_steps)
            loss = loss_fn(tail(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            trial.steps += 1
            step_times.append(time.monotonic() - began)
            value = loss.item()
            clock.heartbeat(lambda: f"  tuning {trial.candidate.describe()}: step {trial.steps}, "
                                    f"loss {value:.4f}, {1 / np.median(step_times[-20:]):.1f} steps/s")
            if time.monotonic() >= next_check or time.monotonic() >= until or trial.steps == total_steps:
                before = trial.best()
                _score(trial)
                stale = 0 if trial.best() > before else stale + 1
                next_check = time.monotonic() + check_every
        trial.state = trainable_state(tail)
        trial.optimizer_state = optimizer.state_dict()

    def _score(trial: Trial) -> None:
        metrics = validate()
        tail.train()
        trial.history.append((trial.steps, metrics))
        if metrics[SELECT_ON] > best["metrics"][SELECT_ON]:
            best.update(state=trainable_state(tail), metrics=metrics,
                        **{"from": f"{trial.candidate.describe()}, step {trial.steps}"})

    share = FIRST_ROUND_SHARE if len(trials) > 1 else 1.0
    each = seconds * share / len(trials)
    for trial in trials:
        run(trial, each)
        clock.line(f"  {trial.summary()} (pretrained {pretrained[SELECT_ON]:.4f})")
    left = lambda: seconds - (time.monotonic() - began)  # noqa: E731
    if len(trials) > 1:
        leader = max(trials, key=Trial.best)
        for _ in range(GRID_EXTENSIONS):  # the best rate at an end of the grid: try one step beyond it, in the same time
            same_loss = [t.candidate.lr for t in trials if t.candidate.loss == leader.candidate.loss]
            beyond = lr_beyond(same_loss, leader.candidate.lr)
            if beyond is None or leader.best() <= pretrained[SELECT_ON] or left() < each:
                break
            trials.append(Trial(Candidate(leader.candidate.loss, beyond), copy.deepcopy(start_state)))
            run(trials[-1], each)
            clock.line(f"  {trials[-1].summary()} (one step beyond the grid's end {leader.candidate.lr:g})")
            leader = max(trials, key=Trial.best)
        run(leader, left())
        clock.line(f"  continued {leader.summary()}")
    load_trainable(tail, start_state)
    return TuneResult(best["state"], best["metrics"], best["from"], trials, pretrained, start_state,
                      float(np.median(step_times)) if step_times else float("nan"))
