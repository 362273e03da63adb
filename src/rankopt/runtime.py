"""Process-wide settings that make PyTorch on CPU fast: glibc's allocator thresholds.

glibc serves allocations above ``M_MMAP_THRESHOLD`` (at most 32 MiB by its dynamic rule) with fresh
``mmap`` pages and returns freed heap tops above ``M_TRIM_THRESHOLD`` to the kernel. A CNN's activations
(e.g. MobileNetV2, 64 images at 128 px: 33 MB per feature map) are allocated and freed every layer, so
every forward pass faults in and zeroes new pages: measured on this project's 2-core machine, 2/3 of
a MobileNetV2 forward was kernel time (26 images/s; 65 with the thresholds raised, kernel time ~0).
:func:`keep_allocations` raises both thresholds to 1 GiB, so freed memory is reused in the process, and
makes every thread allocate from the main arena (``M_ARENA_MAX`` 1): a thread's own arena grows in heaps
of at most 64 MiB, so a larger activation there is a fresh ``mmap`` again (measured: MobileNetV2 at
batch 16 on a worker thread, as ``rankopt serve`` runs it, 45 images/s and 659k page faults per 7
forwards; 72 images/s and 64k with one arena). The cost: up to 1 GiB of freed memory stays mapped to
the process instead of going back to the system, and threads allocating at once share one lock.
The command line calls it at start; library users may call it themselves. ``RANKOPT_MALLOC=system``
leaves glibc's defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
KEEP_BYTES = 1 << 30


def keep_allocations(threshold: int = KEEP_BYTES) -> bool:
    """Raise glibc's mmap and trim thresholds to ``threshold`` bytes and keep to one arena; True when applied
    (Linux with glibc, and ``RANKOPT_MALLOC`` is not ``system``). Call it before starting threads."""
    if not sys.platform.startswith("linux") or os.environ.get("RANKOPT_MALLOC", "").lower() == "system":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    value = min(int(threshold), 2**31 - 1)
    return all(bool(mallopt(option, setting)) for option, setting in
               ((M_MMAP_THRESHOLD, value), (M_TRIM_THRESHOLD, value), (M_ARENA_MAX, 1)))
