"""rankopt.runtime: glibc's allocator thresholds (the command line's start-up setting)."""

from __future__ import annotations

import sys

import pytest

from rankopt.runtime import keep_allocations


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
def test_keep_allocations_applies_on_glibc_and_can_be_turned_off(monkeypatch):
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    assert keep_allocations() is True
    monkeypatch.setenv("RANKOPT_MALLOC", "system")
    assert keep_allocations() is False


ARENAS_AFTER_A_THREAD = """
import ctypes, ctypes.util, re, sys, tempfile, threading
import numpy as np
from rankopt.runtime import keep_allocations
print(keep_allocations())
arrays = []
thread = threading.Thread(target=lambda: arrays.extend(np.ones(1000) for _ in range(100)))
thread.start()
thread.join()
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.fopen.restype = ctypes.c_void_p
with tempfile.NamedTemporaryFile(suffix=".xml") as out:
    stream = ctypes.c_void_p(libc.fopen(out.name.encode(), b"w"))
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    print(len(re.findall(r"<heap nr=", open(out.name).read())))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt is Linux-only")
@pytest.mark.parametrize("malloc", ["rankopt", "system"])
def test_threads_allocate_from_the_main_arena(malloc):
    """With kept allocations a second thread allocates from the main arena (glibc's ``malloc_info`` lists one
    heap), where the raised thresholds hold; glibc's default gives the thread an arena of its own."""
    import os
    import platform
    import subprocess

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    env = {**os.environ, "RANKOPT_MALLOC": malloc}
    applied, heaps = subprocess.run([sys.executable, "-c", ARENAS_AFTER_A_THREAD], env=env, check=True,
                                    capture_output=True, text=True).stdout.split()
    assert applied == str(malloc == "rankopt")
    assert int(heaps) == (1 if malloc == "rankopt" else 2)
