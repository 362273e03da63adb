"""``rankopt study``: the pure computations on small fixed tensors, the study tables from hand-written
run folders (no training), and one end-to-end ``--quick`` study on the real Omniglot data."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from rankopt.cli.study import STUDY_NAMES
from rankopt.config import load_config
from rankopt.engine.diagnostics import DIAGNOSTICS, SURROGATES, surrogate_ap_errors
from rankopt.experiments.runner import RunSpec
from rankopt.experiments.studies import STUDIES, run_study
from rankopt.experiments.study_analyses import operating_fractions
from rankopt.experiments.study_settings import CALIBRATION_LOSSES, QUICK_OVERRIDES, StudySettings
from rankopt.experiments.study_tables import NO_VALUE, Table
from rankopt.metrics import evaluate
from rankopt.rank import default_delta
from rankopt.report.stats import summarize

# 8 unit vectors at these angles: every score difference of every query is >= 0.15 away from 0,
# and the ranking is imperfect (batch mAP 0.644)
ANGLES = torch.tensor([4.0, 5.2, 3.15, 5.55, 2.05, 0.4, 2.75, 1.7], dtype=torch.float64)
LABELS = torch.tensor([0, 1, 0, 1, 0, 1, 2, 2])


def separated_batch() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.stack([ANGLES.cos(), ANGLES.sin()], dim=1), LABELS


# ---------------------------------------------------------------- pure computations

def test_surrogate_errors_vanish_for_the_sharp_sigmoid_on_a_well_separated_batch():
    emb, labels = separated_batch()
    out = surrogate_ap_errors(emb, labels)
    true_ap = evaluate(emb, labels, metrics=["map"]).metrics["map"]
    assert out["ap/true"] == pytest.approx(true_ap)
    assert 0.5 < true_ap < 0.8
    assert out["error/smooth_ap_tau0.001"] < 1e-6  # sigma(d / tau) is the step here: the exact AP
    assert out["error/smooth_ap_tau0.1"] > out["error/smooth_ap_tau0.01"] >= out["error/smooth_ap_tau0.001"]
    assert out["ap/sup_ap"] <= true_ap  # SupAP bounds 1 - AP from above
    for name in SURROGATES:
        assert out[f"error/{name}"] == pytest.approx(abs(out[f"ap/{name}"] - true_ap))
    assert DIAGNOSTICS["surrogate_ap"] is surrogate_ap_errors


def test_surrogate_errors_take_hierarchical_labels_and_low_precision():
    emb, labels = separated_batch()
    flat = surrogate_ap_errors(emb.float(), labels)
    two_levels = surrogate_ap_errors(emb.bfloat16(), torch.stack([labels, labels % 2], dim=1))
    assert two_levels.keys() == flat.keys()
    assert two_levels["ap/true"] == pytest.approx(flat["ap/true"])  # the finest level decides


def brute_force_fraction(emb: torch.Tensor, labels: torch.Tensor, half_width: float) -> float:
    x = torch.nn.functional.normalize(emb.double(), dim=1)
    scores = x @ x.T
    inside = total = 0
    n = len(labels)
    for i in range(n):
        for j in range(n):
            if j == i or labels[j] != labels[i]:
                continue
            for k in range(n):
                if k in (i, j):
                    continue
                total += 1
                inside += abs(float(scores[i, k] - scores[i, j])) < half_width
    return inside / total


def test_operating_fraction_matches_a_brute_force_count():
    gen = torch.Generator().manual_seed(3)
    emb = torch.randn(24, 5, generator=gen)
    labels = torch.arange(6).repeat_interleave(4)
    batches = [list(range(0, 12)), list(range(8, 24)), [0, 1, 4, 5, 9, 10, 11]]
    taus = (0.01, 0.05, 0.5)
    got = operating_fractions(emb, labels, batches, taus)
    assert got.shape == (3, 3)
    for b, batch in enumerate(batches):
        for t, tau in enumerate(taus):
            assert got[b, t] == pytest.approx(brute_force_fraction(emb[batch], labels[batch], default_delta(tau)))


# ---------------------------------------------------------------- settings and tables

def settings(tmp_path: Path, **kw) -> StudySettings:
    base = {"name": "lambda", "recipe": "omniglot", "root": None, "out_dir": tmp_path, "seeds": (0,), "jobs": 1,
            "quick": False, "extra_overrides": (), "eval_split": "validation", "values": None, "from_run": None}
    return StudySettings(**{**base, **kw})


def test_overrides_order_later_keys_win(tmp_path):
    s = settings(tmp_path, root="/data/o", quick=True, extra_overrides=("train.epochs=3", "loss.name=fastap"))
    got = s.overrides("loss.kwargs.lam=0.3", "train.seed=1", defaults=("loss.name=smooth_ap",), tuned=True)
    keys = [o.split("=")[0] for o in got]
    assert len(keys) == len(set(keys))
    assert "data.root=/data/o" in got and "data.validation_fraction=0.2" in got
    assert "train.epochs=3" in got and "train.epochs=1" not in got  # --set beats --quick
    assert "loss.name=fastap" in got  # --set beats the study's default
    assert set(QUICK_OVERRIDES) - {"train.epochs=1"} <= set(got)
    test_split = settings(tmp_path, eval_split="test").overrides("train.seed=0", tuned=True)
    assert not any(o.startswith("data.validation_fraction") for o in test_split)


def test_table_markdown_and_csv(tmp_path):
    table = Table(["x", "metric", "note"], [[1, summarize([0.2, 0.4]), "a"], [2, NO_VALUE, 0.5]])
    md = table.markdown()
    assert "| 1 | 0.3 ± 0.14 | a |" in md and "| 2 | – | 0.5 |" in md
    rows = list(csv.reader(open(table.write_csv(tmp_path / "t.csv"))))
    assert rows[0] == ["x", "metric mean", "metric std", "metric n", "note"]
    assert float(rows[1][1]) == pytest.approx(0.3) and rows[1][3] == "2"
    assert rows[2] == ["2", "", "", "0", "0.5"]


def test_cli_lists_every_study():
    assert set(STUDY_NAMES) == set(STUDIES)


# ---------------------------------------------------------------- study tables from hand-made run folders

def fake_run(run_dir: Path, trained: dict[str, float], *, split: str = "validation", loss: str = "roadmap") -> Path:
    """A finished run folder as ``rankopt train`` leaves it, as far as the studies read it."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"loss": {"name": loss}}))
    (run_dir / "metrics.json").write_text("[]")
    report = {"trained": trained, "loss": {"name": loss},
              "data": {"eval": {split: {"images": 300, "classes": {"character": 15, "alphabet": 1}}}}}
    (run_dir / "report.json").write_text(json.dumps(report))
    return run_dir


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_lambda_table_from_finished_runs(tmp_path):
    values = {("0", 0): 0.2, ("0", 1): 0.4, ("0.5", 0): 0.5, ("0.5", 1): 0.5}
    for (lam, seed), v in values.items():
        fake_run(tmp_path / "runs" / f"lam{lam}-s{seed}", {"map@r": v, "recall@1": 2 * v, "num_queries": 300})
    result = run_study("lambda", out_dir=tmp_path, seeds=[0, 1], values=[0.0, 0.5])
    rows = read_csv(result.csv_path)
    assert [r["λ"] for r in rows] == ["0", "0.5"]
    assert float(rows[0]["map@r mean"]) == pytest.approx(0.3)
    assert float(rows[0]["map@r std"]) == pytest.approx(math.sqrt(0.02))
    assert float(rows[1]["recall@1 mean"]) == pytest.approx(1.0) and rows[1]["seeds"] == "2"
    text = result.table_md_path.read_text()
    assert "VALIDATION split" in text and "300 images" in text
    assert "rankopt study lambda --recipe omniglot" in text and "--values 0 0.5" in text
    assert "wall time" in text and "machine" in text
    assert [p.name for p in result.figure_paths] == ["lambda.png"] and result.figure_paths[0].is_file()


def test_sweep_refuses_runs_evaluated_on_another_split(tmp_path):
    fake_run(tmp_path / "runs" / "rho10-s0", {"map@r": 0.1, "recall@1": 0.2}, split="test")
    with pytest.raises(ValueError, match="evaluated on \\['test'\\], not on the validation split"):
        run_study("rho", out_dir=tmp_path, seeds=[0], values=[10])
    result = run_study("rho", out_dir=tmp_path, seeds=[0], values=[10], eval_split="test")
    assert "the TEST split" in result.table_md_path.read_text()


def test_existing_run_with_other_settings_is_an_error(tmp_path):
    s = settings(tmp_path)
    spec = RunSpec("lam0-s0", "omniglot", s.overrides("train.seed=0", tuned=True))
    run_dir = fake_run(tmp_path / "runs" / spec.name, {"map@r": 0.1, "recall@1": 0.2})
    (run_dir / "run.json").write_text(json.dumps({"recipe": "omniglot", "overrides": list(QUICK_OVERRIDES)}))
    with pytest.raises(ValueError, match="trained with other settings"):
        s.train([spec])
    command = spec.command(s.runs_dir)
    same = command[command.index("train") + 2 : command.index("--output")]
    (run_dir / "run.json").write_text(json.dumps({"recipe": "omniglot", "overrides": same}))
    assert s.train([spec]) == [run_dir]


def test_batch_size_gain_is_paired_by_seed(tmp_path):
    sup = {(32, 0): 0.30, (32, 1): 0.20, (64, 0): 0.40, (64, 1): 0.30}
    gain = {(32, 0): 0.05, (32, 1): 0.03, (64, 0): 0.01, (64, 1): 0.01}
    for (b, seed), v in sup.items():
        fake_run(tmp_path / "runs" / f"bs{b}-sup_ap-s{seed}", {"map@r": v, "recall@1": v}, loss="sup_ap")
        fake_run(tmp_path / "runs" / f"bs{b}-roadmap-s{seed}", {"map@r": v + gain[b, seed], "recall@1": v})
    result = run_study("batch_size", out_dir=tmp_path, seeds=[0, 1], values=[32, 64])
    rows = read_csv(result.csv_path)
    base = load_config("omniglot", ["data.validation_fraction=0.2"]).train
    expected_steps = [round(base.max_steps_per_epoch * base.batch_size / b) for b in (32, 64)]
    assert [int(r["steps/epoch"]) for r in rows] == expected_steps
    assert float(rows[0]["gain map@r mean"]) == pytest.approx(0.04)
    assert float(rows[0]["gain map@r std"]) == pytest.approx(math.sqrt(2e-4))
    assert float(rows[0]["gain % map@r"]) == pytest.approx(100 * 0.04 / 0.25)
    assert float(rows[1]["gain recall@1 mean"]) == pytest.approx(0.0)
    assert {p.name for p in result.figure_paths} == {"batch_size_metrics.png", "batch_size_gain.png"}


def test_approximation_error_table_from_steps_csv(tmp_path):
    run_dir = fake_run(tmp_path / "runs" / "diag-s0", {"map@r": 0.1, "recall@1": 0.2}, split="test", loss="smooth_ap")
    rows = []
    for step in range(1, 21):
        row = {"epoch": 1, "step": step, "loss": 0.5}
        if step % 2 == 1:  # logged every 2 steps: 10 logged steps
            row["diag/ap/true"] = 0.5
            row.update({f"diag/error/{n}": step / 100 for n in SURROGATES})
        rows.append(row)
    with open(run_dir / "steps.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))  # step 1 is logged: every column
        writer.writeheader()
        writer.writerows(rows)
    result = run_study("approximation_error", out_dir=tmp_path, seeds=[0])
    table = {r["surrogate"]: r for r in read_csv(result.csv_path)}
    first, last = (f"{edge} 20% of steps mean" for edge in ("first", "last"))
    assert float(table["fastap"][first]) == pytest.approx((0.01 + 0.03) / 2)  # logged steps 1 and 3
    assert float(table["fastap"][last]) == pytest.approx((0.17 + 0.19) / 2)
    assert float(table["true batch AP (for scale)"][last]) == pytest.approx(0.5)
    assert "trained with smooth_ap" in result.table_md_path.read_text()


@pytest.mark.slow
def test_decomposability_gap_table_from_hand_made_checkpoints(omniglot, tmp_path):
    from rankopt.config import config_to_dict
    from rankopt.engine.checkpoint import save_checkpoint
    from rankopt.engine.assembly import build_model, seed_everything

    cfg = load_config("omniglot", [f"data.root={omniglot}", "data.kwargs.alphabets=1"])
    for loss, init_seed in (("sup_ap", 0), ("roadmap", 1)):  # "sup_ap" holds the untrained model of seed 0
        run_dir = fake_run(tmp_path / "runs" / f"{loss}-s0", {"map@r": 0.1}, split="test", loss=loss)
        seed_everything(init_seed)
        save_checkpoint(run_dir / "checkpoints" / "last.ckpt",
                        {"model": build_model(cfg).state_dict(), "config": config_to_dict(cfg)})
    result = run_study("decomposability_gap", out_dir=tmp_path, seeds=[0], values=[64, 4096])
    rows = {r["model"]: r for r in read_csv(result.csv_path)}
    untrained, sup, road = rows["untrained"], rows[CALIBRATION_LOSSES["sup_ap"]], rows[CALIBRATION_LOSSES["roadmap"]]
    assert float(untrained["DG@64 mean"]) == pytest.approx(float(sup["DG@64 mean"]))
    assert float(road["DG@64 mean"]) != pytest.approx(float(sup["DG@64 mean"]))
    assert float(sup["DG@64 mean"]) > 0  # batches of 64 are easier than the whole test set
    assert untrained["DG@4096 mean"] == ""  # more than the test images of one alphabet
    decrease = rows["decrease of DG, SupAP -> ROADMAP (%)"]["DG@64 mean"]
    expected = 100 * (float(sup["DG@64 mean"]) - float(road["DG@64 mean"])) / float(sup["DG@64 mean"])
    assert float(decrease) == pytest.approx(expected)
    assert "left out" in result.table_md_path.read_text()


def test_run_study_checks_its_arguments(tmp_path):
    with pytest.raises(ValueError, match="unknown study"):
        run_study("tau", out_dir=tmp_path)
    with pytest.raises(ValueError, match="eval_split"):
        run_study("lambda", out_dir=tmp_path, eval_split="train")
    with pytest.raises(ValueError, match="operating_region study only"):
        run_study("lambda", out_dir=tmp_path, from_run=tmp_path)


# ---------------------------------------------------------------- end to end (real data, trains)

@pytest.mark.slow
def test_quick_operating_region_study_on_omniglot(omniglot, tmp_path):
    result = run_study("operating_region", root=str(omniglot), out_dir=tmp_path, quick=True, values=[16, 32, 512])
    rows = read_csv(result.csv_path)
    expected = [(m, b) for m in ("untrained", "trained") for b in ("16", "32", "512")]
    assert [(r["model"], r["B"]) for r in rows] == expected
    for r in rows:
        if r["B"] == "512":  # 128 classes per batch: more than the 3 quick alphabets hold
            assert r["batches"] == "0" and r["τ=0.01 mean"] == ""
            continue
        fractions = [float(r[f"τ={t} mean"]) for t in ("0.001", "0.005", "0.01", "0.05", "0.1")]
        assert all(0.0 <= f <= 1.0 for f in fractions)
        assert fractions == sorted(fractions)  # a wider sigmoid covers more differences
    report = json.loads((tmp_path / "runs" / "smooth_ap-s0" / "report.json").read_text())
    assert report["loss"]["name"] == "smooth_ap" and report["steps"] == 8
    assert "left out" in result.table_md_path.read_text()
    assert result.figure_paths[0].stat().st_size > 0


@pytest.mark.parametrize(("name", "key", "values", "runs"), [
    ("smooth_ap_tau", "loss.kwargs.tau", [0.1, 0.001], ["tau0.1-s0", "tau0.001-s0"]),
    ("smooth_ap_positives", "train.m", [4, 16], ["m4-s0", "m16-s0"]),
    ("smooth_ap_batch", "train.batch_size", [64, 256], ["bs64-s0", "bs256-s0"]),
])
def test_smooth_ap_ablation_varies_one_parameter_at_a_time(name, key, values, runs, tmp_path, monkeypatch):
    """Smooth-AP Table 5: the swept key takes each value, the two others stay at tau 0.01, |P| 4, B 128."""
    trained = []

    def train(self, specs):
        trained.extend(specs)
        return [fake_run(self.runs_dir / spec.name, {"map@r": 0.1, "recall@1": 0.2}, loss="smooth_ap") for spec in specs]

    monkeypatch.setattr(StudySettings, "train", train)
    result = run_study(name, out_dir=tmp_path, seeds=[0], values=values)
    assert [spec.name for spec in trained] == runs
    table5 = {"loss.kwargs.tau": "0.01", "train.m": "4", "train.batch_size": "128"}
    for spec, value in zip(trained, values):
        settings = dict(o.split("=", 1) for o in spec.overrides)
        assert settings["loss.name"] == "smooth_ap"
        assert float(settings[key]) == value
        assert {k: settings[k] for k in table5 if k != key} == {k: v for k, v in table5.items() if k != key}
    if key != "loss.kwargs.tau":  # ints, as the config expects them
        assert all(dict(o.split("=", 1) for o in spec.overrides)[key].isdigit() for spec in trained)
    rows = read_csv(result.csv_path)
    assert len(rows) == 2 and float(rows[0]["map@r mean"]) == pytest.approx(0.1)
