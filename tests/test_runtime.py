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
