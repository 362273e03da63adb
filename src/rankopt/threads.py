"""A thread pool for CPU work split over rows (evaluation, the compiled rank sums), with torch single-threaded
while it runs (:class:`ThreadPool`)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")

_THREAD_PREFIX = "rankopt-pool"
_EXECUTORS: dict[int, ThreadPoolExecutor] = {}
_EXECUTORS_LOCK = threading.Lock()
os.register_at_fork(after_in_child=_EXECUTORS.clear)  # a child process has none of the parent's threads


def _executor(threads: int) -> ThreadPoolExecutor:
    """The process's executor of ``threads`` worker threads (torch single-threaded in each), started once: a
    loss or an evaluation calls the pool hundreds of times, and starting threads each time is a large part of
    a step on busy cores (measured: benchmarks/results/losses.md)."""
    with _EXECUTORS_LOCK:
        executor = _EXECUTORS.get(threads)
        if executor is None:
            executor = _EXECUTORS[threads] = ThreadPoolExecutor(
                threads, thread_name_prefix=f"{_THREAD_PREFIX}{threads}", initializer=torch.set_num_threads,
                initargs=(1,))
        return executor


class ThreadPool:
    """``threads`` threads running GIL-releasing work (torch and numpy operations, numba kernels) at once.

    Inside the pool torch runs single-threaded (restored on exit): each thread computes its own
    products and serves them. torch's OpenMP threads, left waiting after a product of their own,
    would spin for milliseconds against the work that follows (measured: benchmarks/results/metrics.md).
    """

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        # a pool's own worker runs nested work itself: waiting on workers of the shared executor could wait forever
        nested = threading.current_thread().name.startswith(_THREAD_PREFIX)
        self.executor = _executor(self.threads) if self.threads > 1 and not nested else None

    def ranges(self, total: int) -> list[tuple[int, int]]:
        step = -(-total // self.threads)
        return [(lo, min(total, lo + step)) for lo in range(0, total, step)] or [(0, 0)]

    def share(self, t: int, lo: int, hi: int) -> slice:
        """Thread ``t``'s part of ``[lo, hi)`` (possibly empty)."""
        step = -(-(hi - lo) // self.threads)
        return slice(min(hi, lo + t * step), min(hi, lo + (t + 1) * step))

    def each(self, work: Callable[[int], object]) -> None:
        """``work(t)`` on every thread ``t`` at once; returns when all are done."""
        self.run(lambda t, _lo, _hi: work(t), self.threads)

    def imap(self, work: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        """``work(item)`` for each item, in parallel; the results in the items' order."""
        if self.executor is None:
            return map(work, items)
        return self.executor.map(work, items)

    def run(self, kernel: Callable[[int, int, int], object], total: int) -> list[object]:
        """``kernel(index, lo, hi)`` over the ranges of ``[0, total)``, in parallel (the first range in the calling
        thread); the results in order. An error is raised once every range has stopped (the ones not started are
        dropped)."""
        jobs = [(index, lo, hi) for index, (lo, hi) in enumerate(self.ranges(total))]
        if self.executor is None or len(jobs) == 1:
            return [kernel(*job) for job in jobs]
        futures: list[Future] = [self.executor.submit(kernel, *job) for job in jobs[1:]]
        try:
            return [kernel(*jobs[0]), *(future.result() for future in futures)]
        except BaseException:
            for future in futures:
                future.cancel()
            wait(futures)
            raise

    def __enter__(self) -> ThreadPool:
        self.torch_threads = torch.get_num_threads()
        if self.executor is not None:
            torch.set_num_threads(1)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.executor is not None:  # the threads stay for the next pool of this size
            torch.set_num_threads(self.torch_threads)
