"""The one switch between compiled and reference paths (:mod:`rankopt.kernels`)."""

import pytest
import torch

from rankopt import kernels
from rankopt.rank.surrogates import compiled_sums, compiled_steps


def test_names_and_aliases():
    assert [kernels.check(m) for m in ("auto", "compiled", "reference", "torch", "chunked", "tiled")] == [
        "auto", "compiled", "reference", "reference", "reference", "compiled"]
    with pytest.raises(ValueError, match="unknown method"):
        kernels.check("fast")


def test_rule_and_refusal():
    assert kernels.use_compiled("auto", lambda: [])
    assert not kernels.use_compiled("auto", lambda: [], work=9, min_work=10)
    assert kernels.use_compiled("compiled", lambda: [], work=9, min_work=10)
    assert not kernels.use_compiled("auto", lambda: ["a CPU device"])
    assert not kernels.use_compiled("reference", lambda: pytest.fail("not asked on the reference path"))
    with pytest.raises(ValueError, match="method='compiled' needs a CPU device"):
        kernels.use_compiled("compiled", lambda: ["a CPU device"])


def test_process_wide_default_applies_to_auto_only():
    scores = torch.zeros(2, 3)
    assert compiled_sums("auto", scores) and compiled_steps("auto", scores, 2)
    with kernels.using("reference"):
        assert not compiled_sums("auto", scores) and not compiled_steps("torch", scores, 2)
        assert compiled_sums("compiled", scores)
    assert compiled_sums("auto", scores)
    assert not compiled_steps("auto", scores, kernels.MAX_LEVELS)
