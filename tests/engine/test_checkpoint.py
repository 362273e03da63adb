"""Atomic, weights-only checkpoints and RNG state round trips (rankopt.engine.checkpoint)."""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from rankopt.engine.checkpoint import load_checkpoint, resolve_resume, rng_state, save_checkpoint, set_rng_state


def test_save_load_round_trip(tmp_path: Path):
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "epoch": 3, "history": [{"map@r": 0.5}],
             "config": {"a": None, "b": [1, 2]}, "rng": rng_state()}
    path = save_checkpoint(tmp_path / "c" / "last.ckpt", state)
    loaded = load_checkpoint(path)
    assert torch.equal(loaded["model"]["w"], state["model"]["w"])
    assert loaded["epoch"] == 3 and loaded["history"] == [{"map@r": 0.5}] and loaded["config"] == state["config"]
    assert [p.name for p in path.parent.iterdir()] == ["last.ckpt"]  # no temp file left behind


def test_failed_save_keeps_previous_checkpoint(tmp_path: Path):
    path = save_checkpoint(tmp_path / "last.ckpt", {"epoch": 1})

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        save_checkpoint(path, {"epoch": 2, "bad": Unpicklable()})
    assert load_checkpoint(path)["epoch"] == 1
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_loading_never_executes_pickled_code(tmp_path: Path):
    path = tmp_path / "evil.ckpt"
    with open(path, "wb") as handle:
        pickle.dump({"model": _Evil()}, handle)
    with pytest.raises(ValueError, match="rankopt never unpickles checkpoints"):
        load_checkpoint(path)
    torch.save({"obj": _Evil()}, path)
    with pytest.raises(ValueError, match="rankopt never unpickles checkpoints") as refused:
        load_checkpoint(path)
    message = str(refused.value)
    assert "system" in message  # names the object it refused
    assert "weights_only=False" in message and "torch.save" in message  # how to convert a trusted file
    assert "add_safe_globals" not in message  # not torch's advice to allow-list the class


def test_a_damaged_checkpoint_is_named(tmp_path: Path):
    path = tmp_path / "half.ckpt"
    save_checkpoint(path, {"epoch": 1, "w": torch.zeros(1000)})
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(ValueError, match="cannot read checkpoint .*half.ckpt"):
        load_checkpoint(path)


def test_missing_and_auto_resume(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.ckpt")
    assert resolve_resume("auto", tmp_path) is None
    save_checkpoint(tmp_path / "checkpoints" / "last.ckpt", {"epoch": 0})
    assert resolve_resume("auto", tmp_path) == tmp_path / "checkpoints" / "last.ckpt"
    with pytest.raises(FileNotFoundError, match="cannot resume"):
        resolve_resume(str(tmp_path / "missing.ckpt"), tmp_path)


def test_rng_state_survives_a_checkpoint(tmp_path: Path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    save_checkpoint(tmp_path / "rng.ckpt", {"rng": rng_state()})
    expected = (random.random(), np.random.rand(3), torch.rand(3))
    random.seed(9), np.random.seed(9), torch.manual_seed(9)
    set_rng_state(load_checkpoint(tmp_path / "rng.ckpt")["rng"])
    got = (random.random(), np.random.rand(3), torch.rand(3))
    assert got[0] == expected[0]
    assert np.array_equal(got[1], expected[1]) and torch.equal(got[2], expected[2])
