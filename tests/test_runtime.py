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


COLLECTION_AT_START = """
import gc, sys, weakref
import torch
from rankopt.engine.embed_and_score import embed_dataset
from rankopt.runtime import freeze_imports, pause_collection, settle_heap
sys.path.insert(0, sys.argv[1])
from helpers.vectors import Points

settle_heap()  # the collector is on: nothing is frozen
freeze_imports()
print(gc.isenabled(), gc.get_freeze_count() == 0)
pause_collection()
print(gc.isenabled())
freeze_imports()  # what is alive once the imports are done: frozen now, not walked by the pass's first collection
print(gc.get_freeze_count() > 0)
class Held:
    pass
held = Held()
held.itself = held  # garbage in a cycle, made while the collector is off
alive = weakref.ref(held)
del held
embed_dataset(torch.nn.Linear(4, 3), Points(11, seed=1), batch_size=5, show_progress=False)  # a long pass starts
print(gc.isenabled(), gc.get_freeze_count() > 0, alive() is None)  # the start's garbage collected, not frozen
cycle = [object()]
cycle.append(cycle)
del cycle
print(gc.collect() > 0)  # what the pass leaves in a cycle is still collected
"""


def test_the_collector_is_off_at_start_and_on_with_the_start_frozen_once_a_pass_begins():
    """:func:`pause_collection` turns the collector off; :func:`freeze_imports` freezes what is alive then (a
    command's imports); the first long pass (an embedding) collects the cyclic garbage made since and turns the
    collector back on with the start's objects frozen; neither changes anything where the collector is on (a
    library caller)."""
    import subprocess
    from pathlib import Path

    tests = str(Path(__file__).parent)
    out = subprocess.run([sys.executable, "-c", COLLECTION_AT_START, tests], check=True, capture_output=True,
                         text=True).stdout.split()
    assert out == ["True", "True", "False", "True", "True", "True", "True", "True"]
