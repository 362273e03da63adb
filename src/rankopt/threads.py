"""A thread pool for CPU work split over rows (evaluation, the compiled rank sums), with torch single-threaded
while it runs (:class:`ThreadPool`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")


class ThreadPool:
    """``threads`` threads running GIL-releasing work (torch and numpy operations, numba kernels) at once.

    Inside the pool torch runs single-threaded (restored on exit): each thread computes its own
    products and serves them. torch's OpenMP threads, left waiting after a product of their own,
    would spin for milliseconds against the work that follows (measured: a third of the tiled
    kernels' time at 1M x 10k x 128-d).
    """

    def __init__(self, threads: int) -> None:
        self.threads = max(1, threads)
        self.executor = ThreadPoolExecutor(self.threads, initializer=torch.set_num_threads, initargs=(1,)) if self.threads > 1 else None

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
        """``kernel(index, lo, hi)`` over the ranges of ``[0, total)``, in parallel; the results in order."""
        jobs = [(index, lo, hi) for index, (lo, hi) in enumerate(self.ranges(total))]
        if self.executor is None:
            return [kernel(*job) for job in jobs]
        return list(self.executor.map(lambda job: kernel(*job), jobs))

    def __enter__(self) -> ThreadPool:
        self.torch_threads = torch.get_num_threads()
        if self.executor is not None:
            torch.set_num_threads(1)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if self.executor is not None:
            self.executor.shutdown(cancel_futures=exc_type is not None)  # an error: the queued work is dropped
            torch.set_num_threads(self.torch_threads)
