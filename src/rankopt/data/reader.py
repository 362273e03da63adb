"""Batches of a dataset read by a few threads ahead of their use, so decoding overlaps the forward.

``DataLoader`` without workers reads each batch in the calling thread between two forwards, so an inference
pass costs ``decode + forward``; worker processes fix that on large machines but copy the dataset and pay a
process start each. :func:`read_ahead` reads the items of the next ``ahead`` batches on ``threads`` threads while
the caller runs the current one: PIL's decoders, rankopt's compiled resize and onnxruntime release the GIL, so
the pass costs about ``max(decode, forward)`` on cores the forward does not fill. Items come back in order; an
item that fails to read raises its error (naming the file) when its batch is reached. For datasets whose
``__getitem__`` may be called from several threads at once: a :class:`rankopt.data.base.RetrievalDataset` is (files
are opened per read, a zip archive's members are read through ``zipfile``'s shared-file lock, and the compiled
transform path takes no global state).
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

READ_THREADS = 2
"""Threads reading ahead by default (measured: benchmarks/results/runtimes.md)."""
AHEAD = 2
"""Batches read ahead of the one in use."""
CPU_BATCH = 32
"""Photos per batch read ahead for a forward on CPU, whatever the pass's batch size: the forward runs in chunks of
about that size anyway (onnxruntime's calls, :func:`rankopt.runtime.forward_chunk`), and a larger batch only keeps
more decoded photos alive: 256 photos at 224 px are 154 MB as items and again as their batch, with two more batches
being read (``rankopt index`` on 2,000 photos: 1.6 against 0.9 GB peak, 1.5 against 1.0 s in the kernel)."""
READ_NICENESS = 10
"""How much lower the reading threads' scheduling priority is than the caller's (Linux), so a reading thread never
takes a core from the forward's threads: on a core the forward fills, an intra-op thread preempted by a reader holds
back every other one at the next barrier."""


def _lower_priority() -> None:
    """This thread's niceness raised by :data:`READ_NICENESS` (Linux: per thread; elsewhere it would be the
    process's, so nothing is changed)."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                           os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + READ_NICENESS)
        except OSError:  # a sandbox may refuse it: the threads read at the caller's priority
            pass


def read_ahead(dataset: Any, indices: Sequence[int], batch_size: int, collate: Callable[[list[Any]], Any], *,
               threads: int = READ_THREADS, ahead: int = AHEAD) -> Iterator[Any]:
    """``collate([dataset[i] for i in batch])`` for each batch of ``indices`` in order, read ``ahead`` batches early
    on ``threads`` threads (module docstring)."""
    if threads < 1 or ahead < 1 or batch_size < 1:
        raise ValueError(f"threads, ahead and batch_size must be >= 1, got {threads}, {ahead}, {batch_size}")
    batches = [indices[start:start + batch_size] for start in range(0, len(indices), batch_size)]
    with ThreadPoolExecutor(threads, thread_name_prefix="rankopt-read", initializer=_lower_priority) as pool:
        pending: deque[list[Future[Any]]] = deque()
        following = iter(batches)
        try:
            for batch in following:
                pending.append([pool.submit(dataset.__getitem__, i) for i in batch])
                if len(pending) > ahead:
                    yield collate([f.result() for f in pending.popleft()])
            while pending:
                yield collate([f.result() for f in pending.popleft()])
        finally:
            for futures in pending:
                for f in futures:
                    f.cancel()
