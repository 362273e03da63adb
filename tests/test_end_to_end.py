"""End to end: `rankopt train` on the embedded SYNTHETIC default (reduced: 8 images per class,
3 short epochs) clearly raises mAP@R above the untrained model's, and writes the run folder."""

from __future__ import annotations

import json

import pytest

from rankopt.cli import main

REDUCED = ["data.kwargs.images_per_class=8", "train.epochs=3", "train.eval_every=3", "schedule.warmup=5",
           "eval.metrics=[recall@1,map@r]", "output.tensorboard=false"]


@pytest.mark.slow
def test_default_training_improves_map_at_r(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *REDUCED, "--output", str(run)]) == 0
    captured = capsys.readouterr()
    out = captured.out + captured.err
    report = json.loads((run / "report.json").read_text())
    before, after = report["untrained"]["map@r"], report["trained"]["map@r"]
    assert after > 2.5 * before and after - before > 0.02, (before, after)
    assert report["trained"]["recall@1"] > report["untrained"]["recall@1"] + 0.05
    for name in ("config.yaml", "metrics.csv", "metrics.json", "checkpoints/last.ckpt", "checkpoints/best.ckpt"):
        assert (run / name).is_file(), name
    assert {p.name for p in (run / "figures").glob("*.png")} >= {"retrieval_grid.png", "training_curves.png"}
    assert "metrics of the untrained model" in out and "final report" in out
