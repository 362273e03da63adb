"""The grid runner and the Omniglot benchmark definition (rankopt.experiments)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rankopt.experiments import RunSpec, run_grid
from rankopt.describe import source_commit
from rankopt.engine.optim import lr_beyond
from rankopt.experiments.benchmark import LOSSES, benchmark_specs, select_learning_rate, tuning_specs
from rankopt.experiments.runner import RunOutcome


def test_benchmark_grid_is_every_loss_times_every_seed(tmp_path):
    root = str(tmp_path)
    specs = benchmark_specs("omniglot", root=root, seeds=(0, 1))
    assert [s.name for s in specs[:3]] == ["smooth_ap-s0", "smooth_ap-s1", "sup_ap-s0"]
    assert len(specs) == 2 * len(LOSSES) == 32
    assert {s.recipe for s in specs} == {"omniglot"}
    assert "loss.name=roadmap" in specs[4].overrides and "train.seed=0" in specs[4].overrides
    assert all(f"data.root={root}" in s.overrides for s in specs)
    quick = benchmark_specs("omniglot", losses=["fastap"], seeds=(3,), quick=True)
    assert len(quick) == 1 and "data.kwargs.alphabets=4" in quick[0].overrides
    with pytest.raises(ValueError, match="unknown benchmark loss"):
        benchmark_specs("omniglot", losses=["nope"])
    with pytest.raises(ValueError, match="unknown benchmark"):
        benchmark_specs("mnist")


def test_a_missing_dataset_folder_is_a_clear_error_before_any_run(tmp_path):
    from rankopt.cli import main

    with pytest.raises(FileNotFoundError, match="does not exist"):
        benchmark_specs("omniglot", root=str(tmp_path / "nope"))
    assert main(["benchmark", "omniglot", "--root", str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 1
    assert not (tmp_path / "out").exists()


def test_tuning_runs_only_on_the_validation_split():
    from rankopt.config import load_config

    specs = tuning_specs("omniglot", lrs=(1e-3, 3e-3), losses=("roadmap",))
    assert [s.name for s in specs] == ["roadmap-lr0.001", "roadmap-lr0.003"]
    cfg = load_config(specs[0].recipe, list(specs[0].overrides))
    assert cfg.data.validation_fraction > 0 and cfg.optim.lr == 1e-3


def test_select_learning_rate_takes_the_best_mean(tmp_path):
    outcomes = []
    for lr, values in {"0.001": (0.30, 0.20), "0.003": (0.31, 0.25)}.items():
        for loss, value in zip(("roadmap", "triplet"), values):
            run = tmp_path / f"{loss}-{lr}"
            run.mkdir()
            (run / "report.json").write_text(json.dumps({"trained": {"map@r": value}}))
            outcomes.append(RunOutcome(RunSpec(run.name, "omniglot", tags={"loss": loss, "lr": lr}), run, "done", 1.0,
                                       run / "train.log"))
    lr, table = select_learning_rate(outcomes)
    assert lr == 0.003 and table["0.001"] == {"roadmap": 0.30, "triplet": 0.20}


def test_grid_names_must_be_unique_plain_folders(tmp_path):
    with pytest.raises(ValueError, match="twice"):
        run_grid([RunSpec("a", "default"), RunSpec("a", "default")], tmp_path)
    with pytest.raises(ValueError, match="plain folder"):
        run_grid([RunSpec("../a", "default")], tmp_path)


@pytest.mark.slow
def test_grid_skips_finished_runs_and_resumes_interrupted_ones(omniglot, tmp_path):
    """A tiny real-data grid: a finished run is skipped; a run stopped after its first epoch resumes from
    its checkpoint and ends exactly where an uninterrupted run ends (constant learning rate)."""
    tiny = (f"data.root={omniglot}", "data.kwargs.alphabets=2", "train.batch_size=32",
            "train.sampler_kwargs.super_classes_per_batch=2", "train.sampler_kwargs.batches_per_super_tuple=3",
            "train.epochs=2", "train.eval_every=1", "schedule.name=constant", "output.figures=false",
            "eval.metrics=[recall@1,map@r]", "train.best_metric=map@r")
    specs = [RunSpec("roadmap", "omniglot", ("loss.name=roadmap", *tiny)),
             RunSpec("smooth_ap", "omniglot", ("loss.name=smooth_ap", *tiny))]
    first = run_grid(specs, tmp_path / "grid", jobs=2)
    assert [o.status for o in first] == ["done", "done"], [o.log.read_text()[-2000:] for o in first]

    # An interrupted run: the same spec trained for one epoch only, without its final report.
    interrupted = tmp_path / "grid2" / "roadmap"
    cmd = [sys.executable, "-m", "rankopt", "train", "omniglot", "loss.name=roadmap", *tiny, "train.epochs=1",
           "output.progress=false", "--output", str(interrupted)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # as the grid's jobs=2 children
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    (interrupted / "report.json").unlink()
    (tmp_path / "grid2" / "smooth_ap").symlink_to(tmp_path / "grid" / "smooth_ap")
    second = run_grid(specs, tmp_path / "grid2", jobs=2)
    assert [o.status for o in second] == ["done", "skipped"]
    assert "resumed from" in (interrupted / "train.log").read_text()
    resumed = json.loads((interrupted / "report.json").read_text())["trained"]
    straight = json.loads((tmp_path / "grid" / "roadmap" / "report.json").read_text())["trained"]
    assert resumed == straight
    # one run at a time instead of two: each still on one torch thread, so the same numbers to the last digit
    alone = run_grid(specs[:1], tmp_path / "grid3", jobs=1)
    assert [o.status for o in alone] == ["done"]
    assert json.loads((tmp_path / "grid3" / "roadmap" / "report.json").read_text())["trained"] == straight
    assert json.loads((tmp_path / "grid3" / "roadmap" / "report.json").read_text())["machine"]["torch_threads"] == 1
    assert json.loads((tmp_path / "grid3" / "roadmap" / "run.json").read_text())["commit"] in (None, source_commit())


def test_a_grid_whose_best_value_is_an_end_is_extended_one_step_beyond_it():
    assert lr_beyond([1e-5, 1e-4, 1e-3], 1e-3) == pytest.approx(1e-2)
    assert lr_beyond([1e-5, 3e-5, 1e-4], 1e-5) == pytest.approx(3.33e-6)
    assert lr_beyond([1e-5, 3e-5, 1e-4], 3e-5) is None
    assert lr_beyond([1e-5, 1e-4, 1e-3, 1e-2], 1e-2) == pytest.approx(1e-1)  # after one extension
    assert lr_beyond([1e-3], 1e-3) == pytest.approx(1e-2)


def test_photo_and_face_benchmarks_have_reference_rows_and_need_their_weights(tmp_path, monkeypatch):
    from rankopt.config import load_config
    from rankopt.experiments.benchmark import BENCHMARKS, CALTECH_LRS

    weights = tmp_path / "w.pt"
    weights.write_bytes(b"x")
    monkeypatch.delenv("RANKOPT_WEIGHTS_MOBILENETV2", raising=False)
    specs = benchmark_specs("caltech101", root=str(tmp_path), seeds=(0,), weights=str(weights))
    by_name = {s.name: s for s in specs}
    assert {"pretrained-s0", "roadmap_random_init-s0", "multi_similarity-s0", "contrastive-s0"} <= set(by_name)
    assert len(specs) == 15  # thirteen losses and two reference rows
    for row in ("arcface", "normalized_softmax", "rod_ap"):  # class weights from class means (chosen on validation)
        assert load_config("caltech101", list(by_name[f"{row}-s0"].overrides)).loss.init == "class_means"
    for row in ("proxy_anchor", "supcon"):  # Proxy-Anchor: its paper's random proxies were better on validation
        assert load_config("caltech101", list(by_name[f"{row}-s0"].overrides)).loss.init == "random"
    lrs = {row: load_config("caltech101", list(by_name[f"{row}-s0"].overrides)).optim.lr
           for row in ("sup_ap", "arcface", "supcon", "proxy_anchor")}  # each baseline's own tuned rate
    assert lrs == {"sup_ap": 3e-5, **CALTECH_LRS}
    faces_rows = {s.name: s for s in benchmark_specs("yaleb", root=str(tmp_path), seeds=(0,), weights=str(weights))}
    summed = load_config("yaleb_mobilefacenet", list(faces_rows["arcface_smooth_ap-s0"].overrides))
    assert summed.loss.name == "arcface+smooth_ap" and summed.loss.init == "class_means"
    assert summed.loss.kwargs["smooth_ap"]["tau"] == 0.01
    assert "train.epochs=0" in by_name["pretrained-s0"].overrides
    assert f"model.kwargs.pretrained_path={weights}" in by_name["smooth_ap-s0"].overrides
    random_init = load_config("caltech101", list(by_name["roadmap_random_init-s0"].overrides))
    assert not random_init.model.pretrained and random_init.model.freeze == [] and random_init.name == "roadmap_random_init"
    tuned = load_config("caltech101", list(by_name["sup_ap-s0"].overrides))
    assert tuned.loss.name == "sup_ap" and tuned.model.freeze and tuned.name == "sup_ap"
    with pytest.raises(ValueError, match="--weights"):
        benchmark_specs("caltech101", root=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="weights file"):
        benchmark_specs("caltech101", root=str(tmp_path), weights=str(tmp_path / "nope.pt"))
    assert BENCHMARKS["yaleb"].baseline == "released" and BENCHMARKS["caltech101"].group_by == ("name",)
    faces = tuning_specs("yaleb", root=str(tmp_path), weights=str(weights))
    assert {s.tags["loss"] for s in faces} == {"smooth_ap", "contrastive"} and len(faces) == 6
