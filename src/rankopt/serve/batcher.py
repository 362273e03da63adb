"""Micro-batching: image queries that arrive together are embedded by one forward pass.

Every torch operation of the service runs on :data:`~rankopt.serve.torch_thread.TORCH_THREAD` (why:
that module's docstring): the batched forward, the searches and the transforms that need torch. The
request threads decode (Pillow, without the GIL) and make the model input where the transform runs no
torch operation (the compiled kernel of the test presets, :meth:`Snapshot.transform_here`): the torch
thread, the service's bottleneck under load, then spends its time on the forward.

Requests put their decoded image on an asyncio queue and await its embedding. One collector takes the
first waiting image and every image already queued; when images are still being decoded
(:meth:`MicroBatcher.expecting`) and the batch is not full, it waits ``max_wait_s`` once for them. Then
the torch thread transforms and embeds up to ``max_batch`` images while new requests queue: under load
the batches grow by themselves, so throughput grows with the number of clients; a lone request never
waits. A query's follow-up (``then``, a :class:`FollowUp`: its search) runs on the torch thread right after
its batch's forward, before the next batch: queued behind the next forward instead, every query would spend
two forwards in the server and the batches would stay half as large. The follow-ups of a batch that share a
key run as one call (one search product for the batch's queries of one ``k`` and filter). Images are grouped
by model and transformed size (a reload or a size-keeping transform may mix them); an image whose transform
fails fails its own request only.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from rankopt.serve.holder import Snapshot
from rankopt.serve.torch_thread import TORCH_THREAD

R = TypeVar("R")


@dataclass(frozen=True)
class FollowUp:
    """What runs on the torch thread right after a job's forward: ``run(embeddings)`` takes the ``(n, D)``
    embeddings of the ``n`` jobs of a batch whose follow-ups share ``key`` (the first one's ``run`` is called for
    them all, so equal keys must mean the same computation) and returns their ``n`` answers in order."""

    key: Hashable
    run: Callable[[torch.Tensor], Sequence[Any]]


def default_threads() -> int:
    """torch's intra-op threads of the torch thread when none are given (``rankopt serve --threads``): 1.

    On a quiet machine torch's default, one thread per core, answers more requests; while another process uses
    the cores, the service's OpenMP team waits at every operation for a thread the scheduler gave to that process:
    throughput collapses, p99 reaches seconds and the other process slows down too. One thread has no team to wait
    for. ``OMP_WAIT_POLICY=PASSIVE`` (idle team threads sleep at once) shares better but slows quiet single queries
    (measured: benchmarks/results/serve_load.md, "Torch threads of the server"). A machine of its own may take
    ``--threads`` up to one per core."""
    return 1


@dataclass
class _Job:
    snapshot: Snapshot
    image: Any  # a decoded image, as the snapshot's transform takes it, or its model input when ``transformed``
    transformed: bool
    then: FollowUp | None  # run on the embedding, on the torch thread
    done: asyncio.Future[Any]
    queued: float  # time.perf_counter() when queued


class MicroBatcher:
    """``await batcher.embed(snapshot, image)`` -> the ``(D,)`` embedding of a decoded image (``transformed=True``:
    ``image`` is already its ``(3, H, W)`` model input; ``then=FollowUp(...)``: the follow-up's answer for it,
    computed on the torch thread); ``await batcher.call(fn, *args)`` -> ``fn(*args)`` on the torch thread.

    Use between :meth:`start` and :meth:`stop`, inside one event loop. ``on_batch(n)`` is told each
    forward's size, ``on_stage(stage, seconds)`` the time of each queue wait, transform, forward and
    follow-up (stage ``"search"``) (metrics)."""

    def __init__(self, *, max_batch: int = 32, max_wait_s: float = 0.002, threads: int | None = None,
                 on_batch: Callable[[int], None] | None = None,
                 on_stage: Callable[[str, float], None] | None = None) -> None:
        if max_batch < 1 or max_wait_s < 0:
            raise ValueError(f"max_batch must be >= 1 and max_wait_s >= 0, got {max_batch} and {max_wait_s}")
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.threads = threads or default_threads()
        self.on_batch = on_batch
        self.on_stage = on_stage
        self._queue: asyncio.Queue[_Job] | None = None
        self._task: asyncio.Task[None] | None = None
        self._expected = 0

    async def start(self) -> None:
        await TORCH_THREAD.call(torch.set_num_threads, self.threads)
        self._queue = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._collect())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = self._queue = None

    @contextlib.contextmanager
    def expecting(self) -> Iterator[None]:
        """Inside: one more image is on its way (being read or decoded); a collector with a batch to fill
        waits ``max_wait_s`` for it, and only then (event-loop thread only)."""
        self._expected += 1
        try:
            yield
        finally:
            self._expected -= 1

    async def call(self, fn: Callable[..., R], *args: Any) -> R:
        """``fn(*args)`` on the torch thread, after the batches already handed to it."""
        return await TORCH_THREAD.call(fn, *args)

    async def embed(self, snapshot: Snapshot, image: Any, *, transformed: bool = False,
                    then: FollowUp | None = None) -> Any:
        if self._queue is None:
            raise RuntimeError("the micro-batcher is not started")
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Job(snapshot, image, transformed, then, done, time.perf_counter()))
        return await done

    def _drain(self, batch: list[_Job]) -> None:
        while len(batch) < self.max_batch and self._queue is not None and not self._queue.empty():
            batch.append(self._queue.get_nowait())

    async def _collect(self) -> None:
        assert self._queue is not None
        while True:
            batch = [await self._queue.get()]
            self._drain(batch)
            if len(batch) < self.max_batch and self.max_wait_s > 0 and self._expected > 0:
                await asyncio.sleep(self.max_wait_s)
                self._drain(batch)
            jobs = [job for job in batch if not job.done.cancelled()]  # a cancelled job: its client went away
            if jobs:
                await self._run_batch(jobs)

    async def _run_batch(self, jobs: list[_Job]) -> None:
        try:
            outcomes, sizes, stages = await self.call(_run_on_torch_thread, jobs)
        except Exception as err:  # noqa: BLE001 - the requests answer with the error; the collector goes on
            outcomes, sizes, stages = [err] * len(jobs), [], []
        for size in sizes:
            if self.on_batch is not None:
                self.on_batch(size)
        for stage, seconds in stages:
            if self.on_stage is not None:
                self.on_stage(stage, seconds)
        for job, outcome in zip(jobs, outcomes):
            if job.done.done():
                continue
            if isinstance(outcome, BaseException):
                job.done.set_exception(outcome)
            else:
                job.done.set_result(outcome)


def _timed(stages: list[tuple[str, float]], stage: str, fn: Callable[..., R], *args: Any) -> R | Exception:
    """``fn(*args)``, or the exception it raised; its time appended to ``stages`` when it succeeded."""
    start = time.perf_counter()
    try:
        out = fn(*args)
    except Exception as err:  # noqa: BLE001 - one request (or one group) answers with the error
        return err
    stages.append((stage, time.perf_counter() - start))
    return out


def _run_on_torch_thread(jobs: list[_Job]) -> tuple[list[Any], list[int], list[tuple[str, float]]]:
    """Each job's outcome (its embedding, or ``then``'s answer, or the error of its transform, forward or
    follow-up), the forwards' sizes and the stages' times (``queue`` per job, ``transform`` per image transformed
    here, ``forward`` per batch, ``search`` per job followed up: its share of its group's call)."""
    now = time.perf_counter()
    stages = [("queue", now - job.queued) for job in jobs]
    outcomes = [job.image if job.transformed else _timed(stages, "transform", job.snapshot.transform, job.image)
                for job in jobs]
    groups: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for position, (job, image) in enumerate(zip(jobs, outcomes)):
        if not isinstance(image, Exception):
            groups.setdefault((id(job.snapshot.embedder), tuple(image.shape)), []).append(position)
    sizes = []
    for positions in groups.values():
        batch = torch.stack([outcomes[p] for p in positions])
        embeddings = _timed(stages, "forward", jobs[positions[0]].snapshot.embed, batch)
        if not isinstance(embeddings, Exception):
            sizes.append(len(positions))
        for row, position in enumerate(positions):
            outcomes[position] = embeddings if isinstance(embeddings, Exception) else embeddings[row]
    _follow_up(jobs, outcomes, stages)
    return outcomes, sizes, stages


def _follow_up(jobs: list[_Job], outcomes: list[Any], stages: list[tuple[str, float]]) -> None:
    """Each embedded job's outcome replaced by its follow-up's answer, one call per key."""
    groups: dict[Hashable, list[int]] = {}
    for position, job in enumerate(jobs):
        if job.then is not None and not isinstance(outcomes[position], Exception):
            groups.setdefault(job.then.key, []).append(position)
    for positions in groups.values():
        run = jobs[positions[0]].then.run  # type: ignore[union-attr]
        answers = _timed(stages, "search", run, torch.stack([outcomes[p] for p in positions]))
        if isinstance(answers, Exception):
            answers = [answers] * len(positions)
        else:  # the call's time as each job's share, so the stage's mean stays per query
            seconds = stages.pop()[1] / len(positions)
            stages.extend([("search", seconds)] * len(positions))
        for position, answer in zip(positions, answers, strict=True):
            outcomes[position] = answer
