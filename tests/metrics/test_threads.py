"""CPU evaluation on a thread pool (:mod:`rankopt.threads`): query chunks scored and served by
several threads give the brute-force values, in the chunks' order; torch's thread count comes back,
also after an error. All data are synthetic."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
import torch

import rankopt.metrics.evaluation as ev
from rankopt.metrics import evaluate
from rankopt.threads import ThreadPool

from . import reference
from .test_exactness import BINARY, HIER, _assert_close, _case


@pytest.fixture
def fake_threads(monkeypatch):
    """``torch.get_num_threads()`` reports ``threads`` (the pool's size); the real count is put back."""
    real = torch.get_num_threads()
    yield lambda threads: monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    torch.set_num_threads(real)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("seed", range(4))
def test_chunks_on_several_threads_against_brute_force(threads, seed, fake_threads, monkeypatch):
    fake_threads(threads)
    monkeypatch.setattr(ev, "MAX_COUNTED_POSITIVES", 0 if seed % 2 else 32)  # ranks from sorted rows, or counted
    x, y = _case(seed, n=40, num_classes=7, ties=True, levels=2)
    names = BINARY + HIER
    got = evaluate(torch.as_tensor(x), torch.as_tensor(y), metrics=names, similarity="dot", chunk_size=3, method="chunked")
    want, _ = reference.evaluate(x, y, None, None, names, "dot")
    _assert_close(got.metrics, want)


def test_results_in_order_and_errors_raised():
    real = torch.get_num_threads()
    with ThreadPool(3) as pool:
        assert torch.get_num_threads() == 1
        assert list(pool.imap(lambda i: i * i, range(50))) == [i * i for i in range(50)]
    assert torch.get_num_threads() == real

    def fail_on_seven(i: int) -> int:
        if i == 7:
            raise ValueError("item 7")
        return i

    with pytest.raises(ValueError, match="item 7"):
        with ThreadPool(2) as pool:
            list(pool.imap(fail_on_seven, range(10_000)))
    assert torch.get_num_threads() == real


def test_chunk_errors_reach_the_caller(fake_threads, monkeypatch):
    """A failure inside one chunk's work surfaces from ``evaluate`` (the other chunks' work is dropped)."""
    fake_threads(2)
    calls = []

    def broken(self, scores, start):
        calls.append(start)
        time.sleep(0.005)
        raise RuntimeError(f"chunk at {start}")

    monkeypatch.setattr(ev._Context, "from_scores", broken)
    x = torch.as_tensor(np.random.default_rng(0).normal(size=(400, 4)))
    with pytest.raises(RuntimeError, match="chunk at"):
        evaluate(x, torch.arange(400) // 4, metrics=["map"], chunk_size=1, method="chunked")
    assert len(calls) < 100  # about 2 s of queued chunks were dropped


def test_pool_threads_start_once_and_the_caller_works_too():
    """Every pool of a size shares one set of worker threads (started once per process); ``run`` gives the first
    range to the calling thread."""
    def who(_: int, lo: int, hi: int) -> tuple[int, int, int]:
        time.sleep(0.01)  # every range is in flight at once: each needs its own thread
        return threading.get_ident(), lo, hi

    seen = []
    for _ in range(3):
        with ThreadPool(3) as pool:
            assert torch.get_num_threads() == 1
            seen.append(pool.run(who, 30))
    assert [[(lo, hi) for _, lo, hi in run] for run in seen] == [[(0, 10), (10, 20), (20, 30)]] * 3
    assert all(run[0][0] == threading.get_ident() for run in seen)
    workers = [{ident for ident, _, _ in run[1:]} for run in seen]
    assert all(len(w) == 2 and threading.get_ident() not in w for w in workers)
    assert set().union(*workers) <= {t.ident for t in threading.enumerate() if t.name.startswith("rankopt-pool3")}


@pytest.mark.parametrize("failing", [0, 2])
def test_run_raises_after_every_range_stopped(failing):
    """An error in any range (the caller's or a worker's) is raised once the other ranges are done; the pool is
    usable afterwards and torch's thread count is restored."""
    real, done = torch.get_num_threads(), []

    def kernel(index: int, lo: int, hi: int) -> int:
        if index == failing:
            raise ValueError(f"range {index}")
        time.sleep(0.05)
        done.append(index)
        return lo

    with pytest.raises(ValueError, match=f"range {failing}"):
        with ThreadPool(3) as pool:
            pool.run(kernel, 3)
    finished = list(done)
    time.sleep(0.1)
    assert done == finished and set(done) <= {0, 1, 2} - {failing}  # nobody still running when the error came out
    assert torch.get_num_threads() == real
    with ThreadPool(3) as pool:
        assert pool.run(lambda i, lo, hi: hi - lo, 7) == [3, 3, 1]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_its_own_threads():
    with ThreadPool(2) as pool:
        pool.run(lambda i, lo, hi: None, 2)  # the parent's workers exist
    pid = os.fork()
    if pid == 0:  # the child: the parent's worker threads are not here; a pool must start its own
        try:
            with ThreadPool(2) as pool:
                code = 0 if pool.run(lambda i, lo, hi: (lo, hi), 4) == [(0, 2), (2, 4)] else 1
        except BaseException:  # noqa: BLE001 - any failure is the child's exit code
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_work_nested_in_a_pool_thread_runs_in_that_thread():
    """A pool opened inside a pool's worker (e.g. a compiled loss in a pooled job) runs its ranges itself instead of
    queueing them behind the busy workers of the shared executor, which could wait forever."""
    def outer(_: int, lo: int, hi: int) -> list[tuple[int, int, int]]:
        with ThreadPool(2) as inner:
            return inner.run(lambda i, a, b: (threading.get_ident(), a, b), 6)

    with ThreadPool(2) as pool:
        results = pool.run(lambda i, lo, hi: (threading.get_ident(), outer(i, lo, hi)), 2)
    for ident, inner in results:
        assert [(a, b) for _, a, b in inner] == [(0, 3), (3, 6)]
        if ident != threading.get_ident():  # the worker's share: its nested ranges stayed on the worker
            assert {t for t, _, _ in inner} == {ident}
