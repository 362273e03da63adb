"""The network passes of a fit at scale (:mod:`rankopt.fit.passes`): a trunk cache past its memory share goes to a
temporary file with the same values, the framing looks at a capped sample, and a folder too big for the budget is
said before the passes, with the budget that would fine-tune."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from helpers.images import class_tree

from rankopt.data.image_folder import folder_dataset
from rankopt.data.transforms import build_transform
from rankopt.fit import passes
from rankopt.fit.clock import Clock
from rankopt.fit.sizing import Sizing
from rankopt.fit.trunk import trunk_outputs
from rankopt.fit.validation import sample_by_class
from rankopt.models import create_model
from rankopt.models.stages import cut


def test_a_spilled_trunk_cache_holds_the_values_of_the_one_in_memory(tmp_path):
    torch.manual_seed(0)
    net = create_model("mobilenet_v2", pooling="gem", embedding_dim=16).eval()
    trunk, _ = cut(net, 10)
    dataset = folder_dataset(class_tree(tmp_path / "photos"), build_transform("test", 64))
    kw = {"device": torch.device("cpu"), "batch_size": 5}
    in_memory, shape = trunk_outputs(trunk, dataset, **kw)
    spilled, same = trunk_outputs(trunk, dataset, out=tmp_path / "trunk.npy", **kw)
    assert same == shape and torch.equal(in_memory, spilled)
    assert np.load(tmp_path / "trunk.npy", mmap_mode="r").shape == tuple(in_memory.shape)
    sizing = Sizing("cpu", 2, 0, 32, bytes_per_photo=1000, memory=10**6, cache_budget=250_000)
    assert not sizing.spills(250) and sizing.spills(251)


def test_the_framing_sample_is_capped_by_class():
    labels = np.repeat(np.arange(50), 100)
    rows = np.arange(labels.size)
    sample = sample_by_class(rows, labels, 1000, np.random.default_rng(0))
    assert 950 <= sample.size <= 1050 and np.unique(labels[sample]).size == 50
    assert np.array_equal(sample_by_class(rows[:900], labels, 1000, np.random.default_rng(0)), rows[:900])


def _run(pass_s: float, photos: int = 50_000, budget_s: float = 600.0) -> tuple[SimpleNamespace, list[str]]:
    lines: list[str] = []
    run = SimpleNamespace(clock=Clock(budget_s, lines.append), photos=SimpleNamespace(dataset=range(photos)),
                          pass_s=pass_s, runtime=None)
    return run, lines


@pytest.mark.parametrize(("pass_s", "framing_s", "said"), [
    (900.0, 30.0, "past its budget"),  # the one pass alone over the 600 s budget
    (420.0, 30.0, "too big"),  # 450 s of a 600 s budget: under a quarter left
    (320.0, 10.0, "warning"),  # over half of it, but a quarter or more left
    (100.0, 10.0, None),
])
def test_a_folder_too_big_for_the_budget_is_said_before_the_passes(pass_s, framing_s, said):
    run, lines = _run(pass_s)
    passes._say_the_passes_cost(run, framing_s)  # type: ignore[arg-type]
    if said is None:
        assert lines == []
        return
    (line,) = lines
    assert said in line and "50,000 photos" in line
    if said == "too big":  # half the budget for the passes: 2 x 450 s = 15 min, and the seconds already spent
        minutes = int(re.search(r"--minutes (\d+) would give the fine-tuning half of it", line).group(1))
        assert minutes in (15, 16) and "every photo is indexed" in line
    if said == "past its budget":  # the pass with a fifth to spare: 18 min; the fine-tuning: 2 x 930 s = 31 min
        held, tuned = map(int, re.search(r"--minutes (\d+) would hold the pass, --minutes (\d+) would fine-tune",
                                         line).groups())
        assert held in (18, 19) and tuned in (31, 32)


def test_the_minutes_that_leave_the_fine_tuning_a_share_hold_the_work_spent_and_to_come(monkeypatch):
    """``Clock.minutes_leaving``: 472 s spent and 100 s to come with half the budget free: 1,144 s, 20 minutes."""
    clock = Clock(600.0, lambda _: None)
    monkeypatch.setattr(clock, "elapsed", lambda: 472.0)
    assert clock.minutes_leaving(0.5, 100.0) == 20
    assert clock.minutes_leaving(0.0, 128.0) == 10  # nothing left free: exactly the 600 s
