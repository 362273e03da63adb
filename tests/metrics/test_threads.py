"""CPU evaluation on a thread pool (:mod:`rankopt.threads`): query chunks scored and served by
several threads give the brute-force values, in the chunks' order; torch's thread count comes back,
also after an error. All data are synthetic."""

from __future__ import annotations

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
