"""Micro-batching: image queries that arrive together are embedded by one forward pass.

Requests put their transformed image on an asyncio queue and await its embedding. One collector
takes the first waiting image, then every image already queued, waits ``max_wait_s`` once for more
when the batch is not full, and runs the forward of up to ``max_batch`` images in its own thread
(torch with ``threads`` intra-op threads) while new requests queue: under load the batches grow by
themselves, so throughput grows with the number of clients; alone, a request waits ``max_wait_s``.
Images are grouped by model and size (a reload or a size-keeping transform may mix them).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from rankopt.serve.holder import Snapshot


@dataclass
class _Job:
    snapshot: Snapshot
    image: torch.Tensor
    done: asyncio.Future[torch.Tensor]


class MicroBatcher:
    """``await batcher.embed(snapshot, image)`` -> the ``(D,)`` embedding of a ``(3, H, W)`` image.

    Use between :meth:`start` and :meth:`stop`, inside one event loop. ``on_batch(n)`` is told each
    forward's size (metrics)."""

    def __init__(self, *, max_batch: int = 32, max_wait_s: float = 0.002, threads: int | None = None,
                 on_batch: Callable[[int], None] | None = None) -> None:
        if max_batch < 1 or max_wait_s < 0:
            raise ValueError(f"max_batch must be >= 1 and max_wait_s >= 0, got {max_batch} and {max_wait_s}")
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.threads = threads or torch.get_num_threads()
        self.on_batch = on_batch
        self._queue: asyncio.Queue[_Job] | None = None
        self._task: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="rankopt-forward",
                                            initializer=torch.set_num_threads, initargs=(self.threads,))
        self._task = asyncio.get_running_loop().create_task(self._collect())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self._task = self._executor = self._queue = None

    async def embed(self, snapshot: Snapshot, image: torch.Tensor) -> torch.Tensor:
        if self._queue is None:
            raise RuntimeError("the micro-batcher is not started")
        done: asyncio.Future[torch.Tensor] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Job(snapshot, image, done))
        return await done

    def _drain(self, batch: list[_Job]) -> None:
        while len(batch) < self.max_batch and self._queue is not None and not self._queue.empty():
            batch.append(self._queue.get_nowait())

    async def _collect(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            self._drain(batch)
            if len(batch) < self.max_batch and self.max_wait_s > 0:
                await asyncio.sleep(self.max_wait_s)
                self._drain(batch)
            groups: dict[tuple[int, tuple[int, ...]], list[_Job]] = {}
            for job in batch:
                if not job.done.cancelled():  # its client went away
                    groups.setdefault((id(job.snapshot.forward), tuple(job.image.shape)), []).append(job)
            for jobs in groups.values():
                await self._forward(loop, jobs)

    async def _forward(self, loop: asyncio.AbstractEventLoop, jobs: list[_Job]) -> None:
        def forward() -> torch.Tensor:
            return jobs[0].snapshot.embed(torch.stack([job.image for job in jobs]))

        try:
            embeddings = await loop.run_in_executor(self._executor, forward)
        except Exception as err:  # noqa: BLE001 - the requests answer with the error; the collector goes on
            for job in jobs:
                if not job.done.done():
                    job.done.set_exception(err)
            return
        if self.on_batch is not None:
            self.on_batch(len(jobs))
        for job, embedding in zip(jobs, embeddings):
            if not job.done.done():
                job.done.set_result(embedding)
