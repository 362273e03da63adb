"""``torchrun --nproc_per_node=2 -m rankopt index`` (2 gloo processes on the CPU) makes the single-process index."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from rankopt.cli import main
from rankopt.search import Index, storage


@pytest.mark.slow  # two processes importing torch: 10 s of CPU, 20-45 s of wall time on a busy 2-core machine
def test_two_ranks_build_the_single_process_index(tmp_path, checkpoint, tree):
    (tree / "beta" / "four" / "img2.png").unlink()  # 11 images: uneven shards of 6 and 5
    options = ["--images", str(tree), "--device", "cpu", "--no-progress", "--similarity", "dot"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "-m", "rankopt", "index", str(checkpoint), *options, "--out", str(tmp_path / "two")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("saved ") == 1  # rank 0 alone reports and writes
    assert main(["index", str(checkpoint), *options, "--out", str(tmp_path / "one")]) == 0
    two, one = Index.load(tmp_path / "two"), Index.load(tmp_path / "one")
    assert len(two) == 11 and storage.version(tmp_path / "two") == 1  # saved once
    assert two.ids == one.ids and two.paths == one.paths and two.metadata == one.metadata
    assert torch.equal(two.labels, one.labels) and two.label_names == one.label_names
    assert two.fingerprint == one.fingerprint and two.items.stamps == one.items.stamps
    torch.testing.assert_close(two.embeddings, one.embeddings, atol=1e-6, rtol=1e-5)
    described = [json.loads((tmp_path / name / "index.json").read_text()) for name in ("two", "one")]
    for info in described:
        for key in ("created_utc", "changed_utc", "uid"):  # unique to each folder
            info.pop(key)
    assert described[0] == described[1]
