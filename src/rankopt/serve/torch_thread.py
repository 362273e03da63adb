"""The one thread that runs every torch operation of the service: :data:`TORCH_THREAD`.

On a CPU, torch's intra-op parallelism is an OpenMP team per calling thread. Once two threads of a
process have run parallel torch ops, OpenMP manages more threads than there are cores and stops
letting idle team threads spin between parallel regions: each of the ~150 operations of a forward
then waits for sleeping threads to wake, for the rest of the process (measured:
benchmarks/results/serve_load.md). So the service loads its index and model, transforms, embeds and
searches on this thread only; other threads decode images and answer HTTP.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import torch

R = TypeVar("R")


class TorchThread:
    """A single worker thread: :meth:`run` (blocking) and :meth:`call` (awaitable) run a function on it, in order."""

    def __init__(self, name: str = "rankopt-torch") -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name, initializer=self._remember)
        self._thread: threading.Thread | None = None

    def _remember(self) -> None:
        self._thread = threading.current_thread()

    def run(self, fn: Callable[..., R], *args: Any) -> R:
        """``fn(*args)`` on the torch thread, waiting for it (directly when called from the torch thread)."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        return self._executor.submit(fn, *args).result()

    async def call(self, fn: Callable[..., R], *args: Any) -> R:
        """``fn(*args)`` on the torch thread, after what was handed to it before."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def set_threads(self, threads: int) -> None:
        """torch's intra-op threads for the torch thread's operations."""
        self.run(torch.set_num_threads, threads)


TORCH_THREAD = TorchThread()
"""The process's torch thread (shared by every service of the process)."""
