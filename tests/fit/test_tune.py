"""The fine-tuning of ``rankopt fit`` (:mod:`rankopt.fit.tune`): patience, the grid's extension, the reserve kept
for retraining, the best state per protocol; on SYNTHETIC clustered vectors through a linear tail."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from helpers.vectors import clustered
from rankopt.fit import tune as tune_module
from rankopt.fit.clock import Clock
from rankopt.fit.post import score_self_retrieval
from rankopt.fit.trunk import TrunkCache, embed_cached
from rankopt.fit.tune import Candidate, retrain, tune


def known(value: float) -> dict[str, dict[str, float]]:
    """A validation's scores with one protocol."""
    return {"known": {"map@r": value, "recall@1": 0.0}}


def test_tuning_never_returns_a_state_worse_than_the_pretrained_one():
    torch.manual_seed(0)
    tail = torch.nn.Sequential(torch.nn.Flatten(1), torch.nn.Linear(8, 8))
    x, labels = clustered(8, 6, 8, 0.3, 0)
    cache = TrunkCache(x.clone(), (8,))
    train_rows, val_rows = np.arange(0, 24), np.arange(24, 48)

    def validate():
        return {"known": score_self_retrieval(embed_cached(tail, cache, val_rows), labels[val_rows])}

    result = tune(tail, cache, train_rows, labels[train_rows], validate, [Candidate("sup_ap", 50.0)], seconds=0.5,
                  clock=Clock(10, say=lambda _: None), batch_size=16, m=4)
    assert result.best_metrics["map@r"] >= result.pretrained["known"]["map@r"]
    steps = result.trials[0].history
    assert steps and all(s > 0 for s, _ in steps)
    if result.best_state is None:  # every state scored was worse or level: the pretrained one is kept
        assert max(m["known"]["map@r"] for _, m in steps) <= result.pretrained["known"]["map@r"]


def test_with_no_time_no_candidate_runs_and_known_pretrained_scores_are_not_recomputed(monkeypatch):
    tail = torch.nn.Sequential(torch.nn.Flatten(1), torch.nn.Linear(8, 8))
    x, labels = clustered(8, 6, 8, 0.3, 0)
    built = []
    monkeypatch.setattr(tune_module, "_optimizer", lambda *a: built.append(a) or pytest.fail("no optimizer"))

    def validate():
        pytest.fail("the pretrained scores were given")

    result = tune(tail, TrunkCache(x.clone(), (8,)), np.arange(24), labels[:24], validate,
                  [Candidate("sup_ap", 1e-3), Candidate("sup_ap", 1e-2)], seconds=0.0,
                  clock=Clock(10, say=lambda _: None), pretrained_scores=known(0.5))
    assert not built and [t.steps for t in result.trials] == [0, 0]
    assert result.best_state is None and result.best_metrics == known(0.5)["known"]


def _linear_tail_setup(seed: int = 0):
    torch.manual_seed(seed)
    tail = torch.nn.Sequential(torch.nn.Flatten(1), torch.nn.Linear(8, 8))
    x, labels = clustered(8, 6, 8, 0.3, seed)
    start = [p.detach().clone() for p in tail.parameters()]

    def moved() -> float:  # how far the tail went from its start: grows faster with a larger learning rate
        return float(sum((p.detach() - s).abs().sum() for p, s in zip(tail.parameters(), start)))

    return tail, TrunkCache(x.clone(), (8,)), labels, moved


def test_a_candidate_stops_after_patience_scores_without_a_new_best(monkeypatch):
    monkeypatch.setattr(tune_module, "CHECK_EVERY_S", 0.0)  # a score after every step
    tail, cache, labels, _ = _linear_tail_setup()
    train_rows = np.arange(24)
    began = time.monotonic()
    result = tune(tail, cache, train_rows, labels[train_rows], lambda: known(0.5),
                  [Candidate("sup_ap", 1e-3)], seconds=60.0, clock=Clock(100, say=lambda _: None),
                  batch_size=16, m=4)
    trial = result.trials[0]
    # the first score (0.5) is the trial's best, then PATIENCE level scores end it, long before its 60 s
    assert [s for s, _ in trial.history] == list(range(1, tune_module.PATIENCE + 2))
    assert trial.steps == tune_module.PATIENCE + 1 and time.monotonic() - began < 30
    assert result.best_state is None and result.best_from == "pretrained"  # level with the pretrained state


def test_the_learning_rate_grid_is_extended_beyond_a_winning_end(monkeypatch):
    monkeypatch.setattr(tune_module, "FIRST_ROUND_SHARE", 0.3)  # time for both extensions
    tail, cache, labels, moved = _linear_tail_setup()
    train_rows = np.arange(24)
    result = tune(tail, cache, train_rows, labels[train_rows], lambda: known(moved()),
                  [Candidate("sup_ap", 1e-4), Candidate("sup_ap", 1e-3)], seconds=4.0,
                  clock=Clock(100, say=lambda _: None), batch_size=16, m=4)
    lrs = [t.candidate.lr for t in result.trials]
    assert lrs == [pytest.approx(v) for v in (1e-4, 1e-3, 1e-2, 1e-1)]  # the winning top end, twice one step up
    assert result.best_from.startswith("sup_ap lr 0.1,")
    # a pretrained state that no candidate beats: the grid is not extended
    tail, cache, labels, moved = _linear_tail_setup()
    kept = tune(tail, cache, train_rows, labels[train_rows], lambda: known(-moved()),
                [Candidate("sup_ap", 1e-4), Candidate("sup_ap", 1e-3)], seconds=2.0,
                clock=Clock(100, say=lambda _: None), batch_size=16, m=4)
    assert [t.candidate.lr for t in kept.trials] == [1e-4, 1e-3] and kept.best_state is None


def test_the_leaders_continuation_leaves_the_time_to_retrain_its_best_state_as_it_moves(monkeypatch):
    step_s = 0.01
    monkeypatch.setattr(tune_module, "_train_step", lambda *args: (time.sleep(step_s), 0.0)[1])
    monkeypatch.setattr(tune_module, "GRID_EXTENSIONS", 0)
    tail, cache, labels, _ = _linear_tail_setup()
    train_rows, scores = np.arange(24), iter(range(10**6))  # every score a new best: the best step keeps moving
    seconds, per_step = 3.0, 1.0
    tune_module._optimizer(tail, Candidate("sup_ap", 1e-3)), tune_module.losses.build("sup_ap")  # imports done
    began = time.monotonic()
    result = tune(tail, cache, train_rows, labels[train_rows], lambda: known(float(next(scores))),
                  [Candidate("sup_ap", 1e-4), Candidate("sup_ap", 1e-3)], seconds=seconds,
                  clock=Clock(100, say=lambda _: None), batch_size=16, m=4, reserve_per_step=per_step)
    left = seconds - (time.monotonic() - began)
    needed = per_step * result.best_step * result.step_seconds  # retraining the state returned
    assert result.best_candidate == result.trials[-1].candidate and result.best_step == result.trials[-1].steps
    assert needed > 0.5 and left >= 0.9 * needed, (left, needed)  # reserved at the end, not at the start
    assert left <= needed + 0.5  # and the rest of the time was used


def test_retraining_repeats_the_chosen_recipe_from_the_pretrained_state():
    tail, cache, labels, moved = _linear_tail_setup()
    start = {n: p.detach().clone() for n, p in tail.named_parameters()}
    rows = np.arange(48)

    def again(steps: int, seconds: float = 60.0) -> tuple[int, dict[str, torch.Tensor]]:
        with torch.no_grad():  # an earlier state must not matter: retraining starts from start_state
            for p in tail.parameters():
                p.add_(1.0)
        taken = retrain(tail, cache, rows, labels, Candidate("sup_ap", 1e-2), steps, start_state=start,
                        seconds=seconds, clock=Clock(100, say=lambda _: None), batch_size=16, m=4, seed=3)
        return taken, {n: p.detach().clone() for n, p in tail.named_parameters()}

    taken, first = again(7)
    assert taken == 7 and moved() > 0
    assert all(torch.equal(first[n], v) for n, v in again(7)[1].items())  # same recipe, same seed: same state
    taken, none = again(7, seconds=0.0)  # no time: no step, the start state
    assert taken == 0 and all(torch.equal(none[n], start[n]) for n in start)


def test_only_photos_with_a_mirrored_copy_are_mirrored():
    centre = torch.arange(4 * 6, dtype=torch.float32).view(4, 6)
    cache = TrunkCache(centre, (1, 2, 3), mirrored=-centre[[1, 3]], rows=np.array([1, 3]))
    out = cache.outputs(np.array([0, 1, 2, 3]), np.array([True, True, True, False])).view(4, -1)
    assert torch.equal(out, torch.stack([centre[0], -centre[1], centre[2], centre[3]]))


def test_each_protocol_keeps_its_own_best_state():
    """Two protocols that peak at different steps: each keeps the state of its own best score, and the primary one
    leads (its best is the result's ``best_*``)."""
    tail, cache, labels, moved = _linear_tail_setup()
    train_rows = np.arange(24)
    calls = iter(range(10**6))

    def validate():
        step = next(calls)  # known rises to step 3 then falls; new keeps rising
        return {"known": {"map@r": float(-abs(step - 3)), "recall@1": 0.0},
                "new": {"map@r": float(step), "recall@1": 0.0}}

    tune_module.CHECK_EVERY_S, saved = 0.0, tune_module.CHECK_EVERY_S
    try:
        result = tune(tail, cache, train_rows, labels[train_rows], validate, [Candidate("sup_ap", 1e-3)],
                      seconds=60.0, clock=Clock(100, say=lambda _: None), primary="known", batch_size=16, m=4)
    finally:
        tune_module.CHECK_EVERY_S = saved
    assert result.best["known"].step == 3 and result.best_step == 3
    assert result.best["new"].step == result.trials[0].steps > 3  # patience on known ended it; new's last is best
    assert result.best["known"].state is not None and result.best["new"].state is not None
    assert any(not torch.equal(result.best["known"].state[k], result.best["new"].state[k])
               for k in result.best["known"].state)


def test_after_the_first_rung_only_the_leaders_of_some_protocol_train_on(monkeypatch):
    """Three candidates: the largest rate leads on known, the smallest on new, the middle one on neither; after half
    its share each, only the two leaders train on (successive halving), each for the rest of its share."""
    monkeypatch.setattr(tune_module, "CHECK_EVERY_S", 0.0)
    monkeypatch.setattr(tune_module, "GRID_EXTENSIONS", 0)
    step_s = 0.005
    monkeypatch.setattr(tune_module, "_train_step", lambda *args: (time.sleep(step_s), 0.0)[1])
    tail, cache, labels, _ = _linear_tail_setup()
    train_rows = np.arange(24)
    rank = {1e-4: (0.0, 2.0), 1e-3: (1.0, 1.0), 1e-2: (2.0, 0.0)}  # lr: (known, new), each rising with its steps
    current: list = []

    def validate():
        if not current:  # the pretrained state
            return {"known": {"map@r": -1.0, "recall@1": 0.0}, "new": {"map@r": -1.0, "recall@1": 0.0}}
        trial = current[0]
        known_value, new_value = rank[trial.candidate.lr]
        grow = trial.steps * 1e-6
        return {"known": {"map@r": known_value + grow, "recall@1": 0.0},
                "new": {"map@r": new_value + grow, "recall@1": 0.0}}

    original_run = tune_module._Tuning.run

    def run(self, trial, share, keep=lambda: 0.0, scored_share=None):
        current[:] = [trial]
        original_run(self, trial, share, keep, scored_share)

    monkeypatch.setattr(tune_module._Tuning, "run", run)
    lines: list[str] = []
    result = tune(tail, cache, train_rows, labels[train_rows], validate,
                  [Candidate("sup_ap", lr) for lr in (1e-4, 1e-3, 1e-2)], seconds=3.0,
                  clock=Clock(100, say=lines.append), primary="known", batch_size=16, m=4)
    steps = {t.candidate.lr: t.steps for t in result.trials}
    assert steps[1e-3] > 0 and steps[1e-4] > 1.6 * steps[1e-3] and steps[1e-2] > 1.6 * steps[1e-3], steps
    assert result.best["known"].candidate.lr == 1e-2 and result.best["new"].candidate.lr == 1e-4
    assert any("left out (leading no protocol): sup_ap lr 0.001" in line for line in lines), lines
    assert tune_module.protocol_leaders(result.trials, ["known"]) == [result.trials[2]]


def test_a_rung_keeps_the_pace_of_scores_of_a_whole_share(monkeypatch):
    """Half a share, scored at the pace of the whole share (``scored_share``): half the scores, not as many as a
    whole share (a validation on a large folder takes seconds; rungs must not double it)."""
    monkeypatch.setattr(tune_module, "CHECK_EVERY_S", 100.0)
    monkeypatch.setattr(tune_module, "_train_step", lambda *args: (time.sleep(0.01), 0.0)[1])
    tail, cache, labels, _ = _linear_tail_setup()
    train_rows, scores = np.arange(24), iter(range(10**6))
    tuning = tune_module._Tuning(tail, cache, train_rows, labels[train_rows], lambda: known(float(next(scores))),
                                 "known", Clock(100, say=lambda _: None),
                                 tune_module._Batches(labels[train_rows], 16, 4, 0), 0)
    paced, own = (tune_module.Trial(Candidate("sup_ap", 1e-3), tune_module.trainable_state(tail)) for _ in range(2))
    tuning.run(paced, 0.4, scored_share=0.8)  # a score every 0.2 s: 2, and one at the end
    tuning.run(own, 0.4)  # a score every 0.1 s: 4, and one at the end
    assert len(paced.history) <= 3 < 4 <= len(own.history), (len(paced.history), len(own.history))
