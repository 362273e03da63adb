"""How a fit sizes its work to the machine: threads, loader workers, batches, and the memory of the trunk cache.

On a CPU the photos are decoded in the main process (workers would take the cores the network needs) and the
trunk runs in batches of :data:`rankopt.data.reader.CPU_BATCH` (the batch every CPU pass reads), whose activations
stay within the memory glibc keeps for reuse (``rankopt.runtime.keep_allocations``); on a GPU, loader workers decode
beside it and batches are larger. The trunk outputs are kept in memory, at most :data:`CACHE_SHARE` of it, so that
the whole process stays under half of the machine's memory; the mirrored copies are dropped first, and beyond that
share the outputs are spilled to a temporary file (:meth:`Sizing.spills`).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from rankopt.data.reader import CPU_BATCH

GPU_BATCH = 128
CACHE_SHARE = 0.25
GPU_WORKERS = 8
BUSY_WINDOW_S = 0.5
"""How long the fit watches the machine before it starts, to count the cores other processes keep busy."""


def machine_memory() -> int:
    """Bytes of physical memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class Sizing:
    """The settings a fit runs with (saved in ``fit.json``)."""

    device: str
    threads: int
    workers: int
    trunk_batch: int
    bytes_per_photo: int
    memory: int
    cache_budget: int

    def cache_bytes(self, photos: int) -> int:
        return photos * self.bytes_per_photo

    def spills(self, photos: int) -> bool:
        """Whether the trunk outputs of ``photos`` exceed :attr:`cache_budget`: then they are written to a temporary
        file and read back through the page cache (a memory map) instead of held in the process's memory."""
        return self.cache_bytes(photos) > self.cache_budget

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def size_for(device: torch.device, trunk_output_numel: int) -> Sizing:
    """The :class:`Sizing` of this machine for a trunk whose output has ``trunk_output_numel`` values per photo."""
    memory = machine_memory()
    cuda = device.type == "cuda"
    return Sizing(str(device), torch.get_num_threads(), min(GPU_WORKERS, max(0, (os.cpu_count() or 1) - 1)) if cuda
                  else 0, GPU_BATCH if cuda else CPU_BATCH, 4 * trunk_output_numel, memory, int(CACHE_SHARE * memory))


def _cpu_times() -> tuple[int, int] | None:
    """``(busy, total)`` jiffies of every core since boot (``/proc/stat``), ``None`` where it cannot be read."""
    try:
        with open("/proc/stat") as fh:
            values = [int(v) for v in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    return sum(values) - idle, sum(values)


def busy_cores(window_s: float = BUSY_WINDOW_S) -> float:
    """Cores kept busy by other processes over ``window_s`` (this one sleeps meanwhile); 0 where unknown."""
    before = _cpu_times()
    time.sleep(window_s)
    after = _cpu_times()
    if before is None or after is None or after[1] <= before[1]:
        return 0.0
    share = (after[0] - before[0]) / (after[1] - before[1])
    return share * (os.cpu_count() or 1)


def threads_beside(busy: float, threads: int, cores: int) -> int:
    """The threads a fit runs on when ``busy`` of the ``cores`` it may use are taken: one per free core (rounded),
    at least 1, at most ``threads``. Measured: a network pass on more threads than free cores slows to a crawl, as
    each thread waits for the others at every operator (``benchmarks/results/fit_busy.md``)."""
    return max(1, min(threads, int(cores - busy + 0.5)))
