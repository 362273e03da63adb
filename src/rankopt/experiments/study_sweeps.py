"""The studies that train a sweep of runs and table their last evaluations: ROADMAP's λ, SupRank's ρ,
SupAP vs ROADMAP across batch sizes, and Smooth-AP's Table 5 ablations (τ, |P|, B), each on a validation
split carved from the training classes unless ``eval_split="test"``."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

from rankopt.config import load_config
from rankopt.experiments.study_settings import CALIBRATION_LOSSES, StudySettings, seeded_runs, value_text
from rankopt.experiments.study_tables import Cell, Findings, Table, finite_summary
from rankopt.layout import REPORT_JSON
from rankopt.report.compare import load_run
from rankopt.report.stats import Summary
from rankopt.viz import plot_sweep

STUDY_METRICS = ("map@r", "recall@1")
"""The metrics the sweep tables report (ROADMAP Figs. 4-5: mAP@R; and R@1)."""
BATCH_SIZES = (32, 64, 128, 256)
LAMBDAS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
RHOS = (0.0, 1.0, 10.0, 100.0, 1000.0)
SMOOTH_AP_TABLE5 = {"loss.kwargs.tau": 0.01, "train.m": 4, "train.batch_size": 128}
"""Smooth-AP Table 5: the settings of the parameters an ablation sweep does not vary."""
SMOOTH_AP_TAUS = (0.1, 0.01, 0.001)
SMOOTH_AP_POSITIVES = (4, 8, 16)
SMOOTH_AP_BATCH_SIZES = (64, 128, 256)


# ---------------------------------------------------------------- reading trained runs

def _trained_metrics(run_dir: Path, s: StudySettings) -> dict[str, float]:
    """``report.json["trained"]`` (the last evaluation) of a run, checked to be on the study's split."""
    record = load_run(run_dir)
    evaluated = list(record.report.get("data", {}).get("eval", {}))
    if (s.eval_split == "validation") != (evaluated == ["validation"]):
        raise ValueError(f"{run_dir} was evaluated on {evaluated}, not on the {s.eval_split} split")
    return {m: record.metric(m) for m in STUDY_METRICS}


def _split_description(run_dir: Path, split: str) -> str:
    """What ``split`` is, with its images and classes per level (a run's ``report.json``)."""
    report = json.loads((run_dir / REPORT_JSON).read_text())
    data = report.get("data", {}).get("eval", {}).get(split, {})
    classes = ", ".join(f"{level} {n}" for level, n in data.get("classes", {}).items())
    what = ("a class-disjoint VALIDATION split carved from the training classes (data.validation_fraction=0.2)"
            if split == "validation" else "the TEST split")
    return f"{what}: {data.get('images', '?')} images, classes per level: {classes or '?'}"


def _sweep_measured_on(s: StudySettings, run_dir: Path) -> str:
    return (f"each run's last evaluation (report.json \"trained\"), on {_split_description(run_dir, s.eval_split)}; "
            f"mean ± std over seeds {', '.join(map(str, s.seeds))}")


# ---------------------------------------------------------------- the sweeps

def _sweep(s: StudySettings, *, param: str, symbol: str, key: str, loss: str, defaults: Sequence[float],
           title: str, fixed: Sequence[str] = (), per_value: Callable[[float], Sequence[str]] | None = None,
           integer: bool = False) -> Findings:
    """Train ``loss`` at each value of ``key`` for every seed; table and figure of :data:`STUDY_METRICS`.
    ``fixed``: default overrides of every run (the user's ``--set`` still wins); ``per_value(v)``: more
    overrides of the runs at ``v``; ``integer``: the values are written as ints."""
    values = s.sweep_values(defaults)
    written = {v: str(int(v)) if integer else str(v) for v in values}
    runs = s.train_groups({v: seeded_runs(s, f"{param}{value_text(v)}", f"loss.name={loss}", f"{key}={written[v]}",
                                          *(per_value(v) if per_value else ()), defaults=fixed, tuned=True)
                           for v in values})
    table = Table([symbol, *STUDY_METRICS, "seeds"])
    stats: dict[str, list[Summary]] = {m: [] for m in STUDY_METRICS}
    for v in values:
        metrics = [_trained_metrics(r, s) for r in runs[v]]
        cells = [finite_summary([m[name] for m in metrics]) for name in STUDY_METRICS]
        for name, cell in zip(STUDY_METRICS, cells, strict=True):
            stats[name].append(cell)
        table.rows.append([value_text(v), *cells, len(metrics)])
    figure = plot_sweep(symbol, values, {m: [c.mean for c in stats[m]] for m in STUDY_METRICS},
                        s.out_dir / f"{s.name}.png", errors={m: [c.std for c in stats[m]] for m in STUDY_METRICS},
                        title_note=f"{s.recipe}, {s.eval_split} split")
    return Findings(title, _sweep_measured_on(s, runs[values[0]][0]), table, [figure])


def lambda_study(s: StudySettings) -> Findings:
    """ROADMAP's ``L = (1 - λ) L_SupAP + λ L_calibr`` (ROADMAP Eq. 2) for λ in :data:`LAMBDAS`
    (λ = 0: SupAP alone, λ = 1: the calibration term alone; ROADMAP Fig. 4a)."""
    return _sweep(s, param="lam", symbol="λ", key="loss.kwargs.lam", loss="roadmap", defaults=LAMBDAS,
                  title="ROADMAP's λ (ROADMAP Fig. 4a): (1 - λ)·SupAP + λ·calibration")


def rho_study(s: StudySettings) -> Findings:
    """SupAP with SupRank's slope ``ρ`` of ``H⁻(t) = ρ (t - δ) + σ(δ/τ) + 1/2`` for ``t > δ``
    (ROADMAP Eq. 4) for ρ in :data:`RHOS` (ρ = 0: the sigmoid's plateau; ROADMAP Fig. 4b)."""
    return _sweep(s, param="rho", symbol="ρ", key="loss.kwargs.rho", loss="sup_ap", defaults=RHOS,
                  title="SupAP's slope ρ of H⁻ above δ (ROADMAP Fig. 4b, Eq. 4)")


def _steps_for(s: StudySettings, batch_sizes: Sequence[int]) -> dict[int, int | None]:
    """``train.max_steps_per_epoch`` per batch size so that each sees about as many images:
    ``steps(B) = round(steps_0 · B_0 / B)`` from the effective config's ``steps_0`` and ``B_0``.
    Without a step cap, the samplers' epochs already hold about ``N / B`` batches: no override."""
    base = load_config(s.recipe, s.overrides(tuned=True)).train
    if base.max_steps_per_epoch is None:
        return dict.fromkeys(batch_sizes)
    return {b: max(1, round(base.max_steps_per_epoch * base.batch_size / b)) for b in batch_sizes}


def batch_size_study(s: StudySettings) -> Findings:
    """SupAP alone vs ROADMAP (SupAP + calibration, λ = 0.5) at batch sizes :data:`BATCH_SIZES`
    (m = ``train.m``, the same number of images per epoch for every B) and the gain of the calibration
    term, ``Δ = metric(ROADMAP) - metric(SupAP)`` paired by seed, relative gain ``100 Δ / metric(SupAP)``
    (ROADMAP Fig. 5, TPAMI Fig. 6: the gain grows as B shrinks)."""
    sizes = [int(v) for v in s.sweep_values(BATCH_SIZES)]
    steps = _steps_for(s, sizes)
    capped = {b: [f"train.max_steps_per_epoch={steps[b]}"] if steps[b] else [] for b in sizes}
    runs = s.train_groups({(loss, b): seeded_runs(s, f"bs{b}-{loss}", f"loss.name={loss}", f"train.batch_size={b}",
                                                  *capped[b], tuned=True)
                           for b in sizes for loss in CALIBRATION_LOSSES})
    table = Table(["B", "steps/epoch"] + [f"{head} {m}" for m in STUDY_METRICS
                                          for head in ("SupAP", "ROADMAP", "gain", "gain %")])
    metrics = {key: [_trained_metrics(r, s) for r in group] for key, group in runs.items()}
    series: dict[str, list[Summary]] = {}
    for b in sizes:
        row: list[Cell] = [b, steps[b] if steps[b] else "epoch"]
        for m in STUDY_METRICS:
            sup = [r[m] for r in metrics[("sup_ap", b)]]
            road = [r[m] for r in metrics[("roadmap", b)]]
            cells = {"SupAP": finite_summary(sup), "ROADMAP": finite_summary(road),
                     "gain": finite_summary([r - p for r, p in zip(road, sup, strict=True)])}
            relative = 100.0 * cells["gain"].mean / cells["SupAP"].mean if cells["SupAP"].mean else math.nan
            row += [cells["SupAP"], cells["ROADMAP"], cells["gain"], relative]
            for head, cell in cells.items():
                series.setdefault(f"{head} {m}", []).append(cell)
        table.rows.append(row)
    note = f"{s.recipe}, {s.eval_split} split"
    metric_keys = [f"{head} {m}" for m in STUDY_METRICS for head in ("SupAP", "ROADMAP")]
    gain_keys = [f"gain {m}" for m in STUDY_METRICS]
    figures = [
        plot_sweep("batch size B", sizes, {k: [c.mean for c in series[k]] for k in metric_keys},
                   s.out_dir / "batch_size_metrics.png", log_x=True,
                   errors={k: [c.std for c in series[k]] for k in metric_keys}, title_note=note),
        plot_sweep("batch size B", sizes, {k: [c.mean for c in series[k]] for k in gain_keys},
                   s.out_dir / "batch_size_gain.png", log_x=True, baselines={"no gain": 0.0},
                   errors={k: [c.std for c in series[k]] for k in gain_keys}, ylabel="ROADMAP - SupAP",
                   title_note=note),
    ]
    first = runs[("sup_ap", sizes[0])][0]
    return Findings("SupAP vs ROADMAP across batch sizes: the gain of the calibration term "
                    "(ROADMAP Fig. 5, TPAMI Fig. 6)", _sweep_measured_on(s, first), table, figures,
                    notes=["gain = ROADMAP - SupAP per seed (paired); gain % = 100 · mean gain / mean SupAP."])


def _smooth_ap_ablation(s: StudySettings, key: str, **sweep: object) -> Findings:
    """One sweep of Smooth-AP Table 5: ``key`` varies, the other parameters at :data:`SMOOTH_AP_TABLE5`."""
    fixed = tuple(f"{k}={v}" for k, v in SMOOTH_AP_TABLE5.items() if k != key)
    return _sweep(s, key=key, loss="smooth_ap", fixed=fixed, **sweep)  # type: ignore[arg-type]


def smooth_ap_tau_study(s: StudySettings) -> Findings:
    """Smooth-AP's sigmoid temperature τ (Eq. 6) at |P| = 4, B = 128 (Smooth-AP Table 5, left)."""
    return _smooth_ap_ablation(s, "loss.kwargs.tau", param="tau", symbol="τ", defaults=SMOOTH_AP_TAUS,
                               title="Smooth-AP's sigmoid temperature τ (Smooth-AP Table 5, §6.4), |P| = 4, B = 128")


def smooth_ap_positives_study(s: StudySettings) -> Findings:
    """Smooth-AP with |P| = ``train.m`` images per class in a batch, τ = 0.01, B = 128 (Smooth-AP Table 5, middle)."""
    return _smooth_ap_ablation(s, "train.m", param="m", symbol="|P|", defaults=SMOOTH_AP_POSITIVES, integer=True,
                               title="Smooth-AP's positives per class |P| (Smooth-AP Table 5, §6.4), τ = 0.01, B = "
                                     "128")


def smooth_ap_batch_study(s: StudySettings) -> Findings:
    """Smooth-AP at batch sizes B, τ = 0.01, |P| = 4 (Smooth-AP Table 5, right), each B seeing about as many
    images per epoch (:func:`_steps_for`)."""
    sizes = [int(v) for v in s.sweep_values(SMOOTH_AP_BATCH_SIZES)]
    steps = _steps_for(s, sizes)
    return _smooth_ap_ablation(
        s, "train.batch_size", param="bs", symbol="B", defaults=sizes, integer=True,
        per_value=lambda b: [f"train.max_steps_per_epoch={steps[int(b)]}"] if steps[int(b)] else [],
        title="Smooth-AP's batch size B (Smooth-AP Table 5, §6.4), τ = 0.01, |P| = 4")
