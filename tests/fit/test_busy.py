"""A fit on a busy machine (:mod:`rankopt.fit.sizing`): it counts the cores other processes keep busy and runs on
the free ones, said in its log. The time it then takes beside a CPU-bound process is measured in
``benchmarks/fit_busy.py`` (not timed here)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from rankopt.fit import run as fit_run
from rankopt.fit.clock import Clock
from rankopt.fit.sizing import busy_cores, threads_beside


def test_threads_are_the_free_cores_at_least_one_at_most_the_default():
    assert threads_beside(0.0, 2, 2) == 2
    assert threads_beside(1.0, 2, 2) == 1
    assert threads_beside(2.0, 2, 2) == 1  # never none
    assert threads_beside(0.4, 4, 8) == 4  # never more than asked
    assert threads_beside(5.6, 8, 8) == 2 and threads_beside(5.4, 8, 8) == 3


@pytest.fixture
def burner():
    """A CPU-bound neighbour: one process spinning on one core."""
    process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_a_busy_core_is_counted(burner):
    assert busy_cores(1.0) >= 0.7  # the spinning neighbour keeps at least most of one core


@pytest.mark.skipif((os.cpu_count() or 1) > 2, reason="one spinning neighbour leaves several free cores")
def test_the_fit_runs_on_the_free_cores_and_says_so(burner, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    chosen: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", chosen.append)
    monkeypatch.setattr(fit_run, "cpu_count", lambda: 2)
    lines: list[str] = []
    fit_run._share_the_cores(Clock(60, say=lines.append))
    assert chosen == [1] and any("cores are busy with other work: the fit runs on 1 thread(s) instead of 2" in line
                                 for line in lines), lines
