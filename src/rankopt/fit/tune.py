"""Fine-tuning the tail within a time budget, the learning rate chosen on validation.

Candidates (a rank loss and a learning rate each) first train one after the other for equal shares of the time
(:data:`FIRST_ROUND_SHARE` of it in all), each scored on validation every :data:`CHECK_EVERY_S` at most. The first
round is run in two rungs (successive halving, Jamieson & Talwalkar 2016): every candidate trains for
:data:`FIRST_RUNG` of its share, then only the candidates that lead some validation protocol train for the rest of
theirs; the time of the others goes to the winner's continuation. When the best one's learning rate is an end of the
grid, one step beyond it is tried for the same share (at most :data:`GRID_EXTENSIONS` times), so that the choice is
bracketed, even where it spends the time kept for retraining the winner (measured: keeping that time first left out
the extension that won every Extended Yale B fit, and lost 0.036 mAP@R there,
``benchmarks/results/fit_refit_reserve.md``); the best one then trains on for the rest. A candidate stops early after
:data:`PATIENCE` scores without a new best, so a fit ends early once validation stops improving (and a small folder
finishes in seconds). Every evaluation scores each validation protocol (:mod:`rankopt.fit.validation`: new photos of
known classes, photos of new classes) and keeps the best state seen for each; the pretrained state itself is among
them (scored before any step), so a fit is never worse than the features it started from on validation. One protocol
(``primary``) leads: the leader, patience and the reserve. Batches: ``m`` photos of each of ``batch_size / m``
classes, each photo centred or mirrored at random; Adam (the trainer's, :func:`rankopt.engine.optim.build_optimizer`)
with the :data:`WARMUP` schedule, BatchNorm statistics frozen (the trunk is not trained at all). :func:`retrain` runs
the chosen candidate again from the pretrained state, for its chosen steps, on the training and the validation photos
together (``rankopt fit``'s ``refit`` stage).
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
from rankopt.fit.trunk import TrunkCache, load_trainable, trainable_state
from rankopt.fit.validation import SELECT_ON

MAX_EPOCHS = 200
"""Most passes over the training photos one candidate makes, a backstop: :data:`PATIENCE` ends a candidate's
training first, once validation stops improving."""
FIRST_ROUND_SHARE = 0.6
FIRST_RUNG = 0.5
"""The part of its first-round share every candidate trains for before the candidates that lead no validation
protocol are left out (measured on the fits of ``benchmarks/results/fit_queries.md``: the leader of each protocol
at half the share was the leader, or within 0.003 mAP@R of it, at the full share in all 12 fits)."""
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


@dataclass(frozen=True)
class Candidate:
    loss: str
    lr: float

    def describe(self) -> str:
        return f"{self.loss} lr {self.lr:g}"


Scored = dict[str, dict[str, float]]
"""A validation's scores: ``{protocol: {metric: value}}`` (:mod:`rankopt.fit.validation`)."""


@dataclass
class Trial:
    """One candidate's training: its state, optimizer, steps and validation history ``(step, scores)``."""

    candidate: Candidate
    state: dict[str, torch.Tensor]
    optimizer_state: dict[str, Any] | None = None
    steps: int = 0
    history: list[tuple[int, Scored]] = field(default_factory=list)
    stopped: bool = False
    """Ended by :data:`PATIENCE` on its last run."""

    def best(self, protocol: str) -> float:
        return max((m[protocol][SELECT_ON] for _, m in self.history), default=float("-inf"))

    def summary(self, protocol: str) -> str:
        best = f"best validation {SELECT_ON} {self.best(protocol):.4f}" if self.history else "not scored"
        return f"{self.candidate.describe()}: {self.steps} steps, {best}"


@dataclass
class BestState:
    """The best state seen for one protocol (``state`` ``None``: the pretrained state was not beaten)."""

    state: dict[str, torch.Tensor] | None
    metrics: dict[str, float]
    source: str = "pretrained"
    candidate: Candidate | None = None
    step: int = 0


@dataclass
class TuneResult:
    """The best state per protocol, every trial and the pretrained scores; ``primary``: the protocol the tuning
    was led by (its leader, patience and reserve), whose best state the ``best_*`` properties give."""

    best: dict[str, BestState]
    primary: str
    trials: list[Trial]
    pretrained: Scored
    pretrained_state: dict[str, torch.Tensor]
    step_seconds: float

    @property
    def best_state(self) -> dict[str, torch.Tensor] | None:
        return self.best[self.primary].state

    @property
    def best_metrics(self) -> dict[str, float]:
        return self.best[self.primary].metrics

    @property
    def best_from(self) -> str:
        return self.best[self.primary].source

    @property
    def best_candidate(self) -> Candidate | None:
        return self.best[self.primary].candidate

    @property
    def best_step(self) -> int:
        return self.best[self.primary].step


class _Batches:
    """An endless stream of batches of ``labels``' rows: ``m`` photos of each of ``batch_size / m`` classes, a new
    shuffle every pass."""

    def __init__(self, labels: np.ndarray, batch_size: int, m: int, seed: int) -> None:
        size = min(batch_size, m * np.unique(labels).size)
        self.sampler = build_batch_sampler("m_per_class", labels, size, m, seed=seed, small_class_policy="fewer")
        self.epoch, self.queue = 0, []  # type: ignore[var-annotated]

    def __len__(self) -> int:
        return len(self.sampler)

    def next(self) -> np.ndarray:
        if not self.queue:
            self.sampler.set_epoch(self.epoch)
            self.epoch += 1
            self.queue.extend(np.asarray(b) for b in self.sampler)
        return self.queue.pop(0)


def _train_step(tail: nn.Module, loss_fn: nn.Module, optimizer: torch.optim.Optimizer, cache: TrunkCache,
                rows: np.ndarray, labels: np.ndarray, picks: np.ndarray, rng: np.random.Generator, lr: float,
                step: int, total_steps: int) -> float:
    """One step on the cached photos ``rows[picks]`` (each centred or mirrored at random), the learning rate
    warmed up (:data:`WARMUP`); returns the loss."""
    device = next(tail.parameters()).device
    batch = rows[picks]
    mirror = rng.random(len(batch)) < 0.5 if cache.mirrored is not None else None
    x = cache.outputs(batch, mirror).to(device)
    y = torch.as_tensor(labels[picks], device=device)
    for group in optimizer.param_groups:
        group["lr"] = lr * lr_factor(WARMUP, step, total_steps)
    loss = loss_fn(tail(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


def _optimizer(tail: nn.Module, candidate: Candidate) -> torch.optim.Optimizer:
    params = [p for p in tail.parameters() if p.requires_grad]
    return build_optimizer(params, OptimizerConfig("adam", candidate.lr, WEIGHT_DECAY))


class _Tuning:
    """The state of one :func:`tune` call: the trials, the best state per protocol, the step times."""

    def __init__(self, tail: nn.Module, cache: TrunkCache, train_rows: np.ndarray, train_labels: np.ndarray,
                 validate: Callable[[], Scored], primary: str, clock: Clock, batches: _Batches, seed: int,
                 pretrained: Scored | None = None) -> None:
        self.tail, self.cache, self.rows, self.labels = tail, cache, train_rows, train_labels
        self.validate, self.primary, self.clock, self.batches = validate, primary, clock, batches
        self.device = next(tail.parameters()).device
        self.start_state = trainable_state(tail)
        self.pretrained = validate() if pretrained is None else pretrained
        self.best = {p: BestState(None, metrics) for p, metrics in self.pretrained.items()}
        self.rng = np.random.default_rng(seed)
        self.step_times: list[float] = []
        self.total_steps = MAX_EPOCHS * max(1, len(batches))

    def run(self, trial: Trial, share: float, keep: Callable[[], float] = lambda: 0.0,
            scored_share: float | None = None) -> None:
        """Train ``trial`` for ``share`` seconds less ``keep()`` (asked at every step), scored
        :data:`EVALUATIONS_PER_SHARE` times in ``scored_share`` seconds (default ``share``: a rung, part of a share,
        keeps the share's pace) and every :data:`CHECK_EVERY_S` at most; it stops early after :data:`PATIENCE`
        scores without a new best of its own (on the primary protocol), or after :data:`MAX_EPOCHS` passes of its
        own."""
        tail = self.tail
        load_trainable(tail, trial.state)
        loss_fn = losses.build(trial.candidate.loss).to(self.device)
        optimizer = _optimizer(tail, trial.candidate)
        if trial.optimizer_state is not None:
            optimizer.load_state_dict(trial.optimizer_state)
        until = time.monotonic() + share
        check_every = min((scored_share or share) / EVALUATIONS_PER_SHARE, CHECK_EVERY_S)
        next_check, stale = time.monotonic() + check_every, 0
        tail.train()
        while time.monotonic() < until - keep() and trial.steps < self.total_steps and stale < PATIENCE:
            began = time.monotonic()
            value = _train_step(tail, loss_fn, optimizer, self.cache, self.rows, self.labels, self.batches.next(),
                                self.rng, trial.candidate.lr, trial.steps, self.total_steps)
            trial.steps += 1
            self.step_times.append(time.monotonic() - began)
            self.clock.heartbeat(lambda: f"  tuning {trial.candidate.describe()}: step {trial.steps}, "
                                         f"loss {value:.4f}, {1 / np.median(self.step_times[-20:]):.1f} steps/s")
            if time.monotonic() >= next_check:
                stale = 0 if self.score(trial) else stale + 1
                next_check = time.monotonic() + check_every
        if trial.steps and (not trial.history or trial.history[-1][0] != trial.steps):
            stale = 0 if self.score(trial) else stale + 1  # the last steps' state, whatever ended the loop
        trial.state = trainable_state(tail)
        trial.optimizer_state = optimizer.state_dict()
        trial.stopped = stale >= PATIENCE

    def score(self, trial: Trial) -> bool:
        """Validate the tail's state; it becomes the best state of every protocol it beats. True when it is the
        trial's new best on the primary protocol."""
        before = trial.best(self.primary)
        scores = self.validate()
        self.tail.train()
        trial.history.append((trial.steps, scores))
        state = None
        for protocol, metrics in scores.items():
            if metrics[SELECT_ON] > self.best[protocol].metrics[SELECT_ON]:
                state = state or trainable_state(self.tail)
                self.best[protocol] = BestState(state, metrics, f"{trial.candidate.describe()}, step {trial.steps}",
                                                trial.candidate, trial.steps)
        return trial.best(self.primary) > before

    def reserve(self, leader: Trial, per_step: float) -> float:
        """Seconds for retraining the best state; while the leader's last score is the best one, its current state
        (the next score may move the best there)."""
        best = self.best[self.primary]
        improving = best.candidate == leader.candidate and bool(leader.history) and \
            best.step == leader.history[-1][0]
        steps = leader.steps if improving else best.step
        return per_step * steps * (float(np.median(self.step_times[-50:])) if self.step_times else 0.0)

    def result(self, trials: list[Trial]) -> TuneResult:
        load_trainable(self.tail, self.start_state)
        step_s = float(np.median(self.step_times)) if self.step_times else float("nan")
        return TuneResult(self.best, self.primary, trials, self.pretrained, self.start_state, step_s)


def protocol_leaders(trials: Sequence[Trial], protocols: Sequence[str]) -> list[Trial]:
    """The trials with the best validation score on at least one of ``protocols``, in their order."""
    leaders = {id(max(trials, key=lambda t: t.best(p))) for p in protocols}
    return [t for t in trials if id(t) in leaders]


def tune(tail: nn.Module, cache: TrunkCache, train_rows: np.ndarray, train_labels: np.ndarray,
         validate: Callable[[], Scored], candidates: Sequence[Candidate], *, seconds: float, clock: Clock,
         primary: str = "known", batch_size: int = 64, m: int = 4, seed: int = 0,
         reserve_per_step: float = 0.0, pretrained_scores: Scored | None = None) -> TuneResult:
    """Train ``tail`` on the cached trunk outputs of ``train_rows`` for about ``seconds``; ``validate()``
    scores the tail's current state on every validation protocol (``{protocol: metrics}``), ``primary`` leading;
    ``pretrained_scores``: ``validate()`` of the starting state when already known. ``reserve_per_step``: the best
    candidate's continuation leaves ``reserve_per_step`` × (the best state's step) × (one step's time) of
    ``seconds`` unused, the time of retraining the winner (:func:`retrain`), recomputed at every step as the best
    state moves. With no time (``seconds <= 0``) no candidate runs: the first optimizer alone loads torch's
    compiler, seconds on a busy machine."""
    tuning = _Tuning(tail, cache, train_rows, train_labels, validate, primary, clock,
                     _Batches(train_labels, batch_size, m, seed), seed, pretrained_scores)
    pretrained = tuning.pretrained[primary][SELECT_ON]
    trials = [Trial(c, copy.deepcopy(tuning.start_state)) for c in candidates]
    if seconds <= 0:
        return tuning.result(trials)
    began = time.monotonic()
    share = FIRST_ROUND_SHARE if len(trials) > 1 else 1.0
    each = seconds * share / len(trials)
    rung = FIRST_RUNG if len(trials) > 1 else 1.0
    for trial in trials:
        tuning.run(trial, each * rung, scored_share=each)
        clock.line(f"  {trial.summary(primary)} (pretrained {pretrained:.4f})")
    if rung < 1.0:
        kept = protocol_leaders(trials, list(tuning.best))
        for trial in kept:
            if not trial.stopped:
                tuning.run(trial, each * (1.0 - rung), scored_share=each)
        dropped = [t.candidate.describe() for t in trials if all(t is not k for k in kept)]
        clock.line(f"  after {rung:.0%} of its share each, trained on: "
                   f"{', '.join(t.summary(primary) for t in kept)}"
                   + (f"; left out (leading no protocol): {', '.join(dropped)}" if dropped else ""))
    left = lambda: seconds - (time.monotonic() - began)
    if len(trials) > 1:
        leader = max(trials, key=lambda t: t.best(primary))
        for _ in range(GRID_EXTENSIONS):  # the best rate at an end of the grid: try one step beyond it, in the same time
            same_loss = [t.candidate.lr for t in trials if t.candidate.loss == leader.candidate.loss]
            beyond = lr_beyond(same_loss, leader.candidate.lr)
            if beyond is None or leader.best(primary) <= pretrained or left() < each:
                break
            trials.append(Trial(Candidate(leader.candidate.loss, beyond), copy.deepcopy(tuning.start_state)))
            tuning.run(trials[-1], each)
            clock.line(f"  {trials[-1].summary(primary)} (one step beyond the grid's end {leader.candidate.lr:g})")
            leader = max(trials, key=lambda t: t.best(primary))
        tuning.run(leader, left(), keep=lambda: tuning.reserve(leader, reserve_per_step))
        clock.line(f"  continued {leader.summary(primary)}")
    return tuning.result(trials)


def retrain(tail: nn.Module, cache: TrunkCache, rows: np.ndarray, labels: np.ndarray, candidate: Candidate,
            steps: int, *, start_state: dict[str, torch.Tensor], seconds: float, clock: Clock, batch_size: int = 64,
            m: int = 4, seed: int = 0) -> int:
    """The chosen recipe again from ``start_state``: ``candidate`` for ``steps`` steps on ``rows`` (the training
    and the validation photos), stopped after ``seconds`` at most; the tail keeps the result. Returns the steps
    taken."""
    load_trainable(tail, start_state)
    loss_fn = losses.build(candidate.loss).to(next(tail.parameters()).device)
    optimizer = _optimizer(tail, candidate)
    batches = _Batches(labels, batch_size, m, seed)
    rng = np.random.default_rng(seed)
    until, taken = time.monotonic() + seconds, 0
    tail.train()
    while taken < steps and time.monotonic() < until:
        value = _train_step(tail, loss_fn, optimizer, cache, rows, labels, batches.next(), rng, candidate.lr, taken,
                            MAX_EPOCHS * max(1, len(batches)))
        taken += 1
        clock.heartbeat(lambda: f"  retraining {candidate.describe()} on every class: step {taken} of {steps}, "
                                f"loss {value:.4f}")
    tail.eval()
    return taken

