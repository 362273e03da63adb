"""The papers' studies as commands: ``rankopt study NAME`` trains what a study needs through the grid
runner (:mod:`rankopt.experiments.runner`: one ``rankopt train`` process per run, finished runs
skipped, interrupted ones resumed), measures, and writes ``OUT/study.md`` (the table, the command,
the machine, the date, the wall time), ``OUT/study.csv`` and ``OUT/*.png``; the runs live in ``OUT/runs/``.

* ``batch_size``: SupAP vs ROADMAP at B = 32 ... 256, the gain of the calibration term (ROADMAP Fig. 5, TPAMI Fig. 6);
* ``lambda``: ROADMAP's weight λ of the calibration term, λ = 1 being it alone (ROADMAP Fig. 4a, Eq. 2);
* ``rho``: the slope ρ of SupRank's H⁻ above δ (ROADMAP Fig. 4b, Eq. 4);
* ``decomposability_gap``: DG_AP on the test set at several B, SupAP vs ROADMAP (ROADMAP Eq. 6, Table 10);
* ``approximation_error``: |surrogate AP - true AP| on the training batches during training (Smooth-AP Eq. 8, Fig. 4);
* ``operating_region``: the fraction of score differences with |d| < δ(τ) vs B and τ (Smooth-AP supp. Fig. S7);
* ``smooth_ap_tau``, ``smooth_ap_positives``, ``smooth_ap_batch``: Smooth-AP's ablation, one parameter at a time —
  the sigmoid temperature τ, the positives per class |P| (``train.m``) and the batch size B, the others at
  τ = 0.01, |P| = 4, B = 128 (Smooth-AP Table 5, §6.4; the paper runs it on VGGFace2 with SENet-50:
  ``--recipe smooth_ap_vggface2_senet50``).

Honesty: the sweeps (``batch_size``, ``lambda``, ``rho``) choose hyper-parameters, so their runs
evaluate on a class-disjoint validation split carved from the training classes
(``data.validation_fraction=0.2``) unless ``eval_split="test"``; the table says which. Metrics are each
run's last evaluation (``report.json["trained"]``), never the best epoch. The other studies tune
nothing: the decomposability gap is measured on the test split, as in the paper.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from rankopt.config import ExperimentConfig
from rankopt.experiments.runner import RunOutcome, RunSpec, run_grid
from rankopt.files import write_text_atomic
from rankopt.report.stats import Summary, summarize

STUDY_METRICS = ("map@r", "recall@1")
"""The metrics the sweep tables report (ROADMAP Figs. 4-5: mAP@R; and R@1)."""
QUICK_OVERRIDES = ("data.kwargs.alphabets=3", "train.epochs=1", "train.max_steps_per_epoch=8", "train.batch_size=32",
                   "output.map_points=300", "train.sampler=m_per_class")
"""``--quick``: tiny settings for tests and CI (one seed)."""
VALIDATION_OVERRIDES = ("data.validation_fraction=0.2",)
EVAL_SPLITS = ("validation", "test")
TRAINED_CHECKPOINT = Path("checkpoints") / "last.ckpt"

BATCH_SIZES = (32, 64, 128, 256)
LAMBDAS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
RHOS = (0.0, 1.0, 10.0, 100.0, 1000.0)
GAP_BATCH_SIZES = (32, 64, 128, 256, 512)
CALIBRATION_LOSSES = {"sup_ap": "SupAP (no calibration)", "roadmap": "ROADMAP (SupAP + calibration)"}
"""ROADMAP without and with its calibration term (``batch_size`` and ``decomposability_gap``)."""
DIAGNOSTICS_EVERY, QUICK_DIAGNOSTICS_EVERY = 10, 2
EDGE_FRACTION = 0.2  # approximation_error: the first / last 20 % of the logged steps
OPERATING_BATCH_SIZES = (32, 64, 128, 256, 512)
OPERATING_TAUS = (0.001, 0.005, 0.01, 0.05, 0.1)
SMOOTH_AP_TABLE5 = {"loss.kwargs.tau": 0.01, "train.m": 4, "train.batch_size": 128}
"""Smooth-AP Table 5: the settings of the parameters an ablation sweep does not vary."""
SMOOTH_AP_TAUS = (0.1, 0.01, 0.001)
SMOOTH_AP_POSITIVES = (4, 8, 16)
SMOOTH_AP_BATCH_SIZES = (64, 128, 256)
OPERATING_BATCHES, QUICK_OPERATING_BATCHES = 20, 4


class StudyError(RuntimeError):
    """Some training runs of a study failed (their ``train.log`` says why)."""


@dataclass(frozen=True)
class StudyResult:
    """The files a study wrote."""

    table_md_path: Path
    csv_path: Path
    figure_paths: tuple[Path, ...]


Cell = str | int | float | Summary | None
K = TypeVar("K")


@dataclass
class Table:
    """A result table: ``Summary`` cells print as ``mean ± std`` (and become two CSV columns)."""

    columns: list[str]
    rows: list[list[Cell]] = field(default_factory=list)

    def markdown(self) -> str:
        """A Markdown table (``|`` inside a cell escaped)."""
        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        lines = [line(self.columns), "|" + "---|" * len(self.columns)]
        lines += [line([_text(c) for c in row]) for row in self.rows]
        return "\n".join(lines)

    def write_csv(self, path: Path) -> Path:
        """Numbers only: a ``Summary`` column ``c`` becomes ``c mean``, ``c std``, ``c n``."""
        summary_cols = {i for row in self.rows for i, c in enumerate(row) if isinstance(c, Summary)}
        header = [h for i, col in enumerate(self.columns)
                  for h in ((f"{col} mean", f"{col} std", f"{col} n") if i in summary_cols else (col,))]
        buffer = io.StringIO()
        writer = csv.writer(buffer)
        writer.writerow(header)
        for row in self.rows:
            writer.writerow([v for i, c in enumerate(row) for v in _csv_values(c, i in summary_cols)])
        return write_text_atomic(path, buffer.getvalue())


def _text(cell: Cell) -> str:
    if isinstance(cell, Summary):
        if cell.n == 0:
            return "–"
        return f"{cell.mean:.4g}" if cell.n == 1 else f"{cell.mean:.4g} ± {cell.std:.2g}"
    if isinstance(cell, float):
        return "–" if math.isnan(cell) else f"{cell:.4g}"
    return "–" if cell is None else str(cell)


def _csv_values(cell: Cell, summary_column: bool) -> list[object]:
    if isinstance(cell, Summary):
        return [cell.mean, cell.std, cell.n] if cell.n else ["", "", 0]
    value = "" if cell is None else cell
    return [value, "", ""] if summary_column else [value]


NO_VALUE = Summary(math.nan, math.nan, 0, math.nan, math.nan)
"""The summary of no value (shown as ``–``)."""


def _summary(values: Sequence[float]) -> Summary:
    """Mean ± std (``ddof=1``) of the finite ``values``; :data:`NO_VALUE` when there is none."""
    finite = [float(v) for v in values if math.isfinite(v)]
    return summarize(finite) if finite else NO_VALUE


@dataclass
class Findings:
    """What a study function returns to :func:`run_study`."""

    title: str
    measured_on: str
    table: Table
    figures: list[Path]
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Settings:
    """How a study was asked for (the arguments of :func:`run_study`)."""

    name: str
    recipe: str
    root: str | None
    out_dir: Path
    seeds: tuple[int, ...]
    jobs: int
    quick: bool
    extra_overrides: tuple[str, ...]
    eval_split: str
    values: tuple[float, ...] | None
    from_run: Path | None

    @property
    def runs_dir(self) -> Path:
        return self.out_dir / "runs"

    def overrides(self, *study: str, defaults: Sequence[str] = (), tuned: bool = False) -> tuple[str, ...]:
        """A run's overrides: ``data.root``, the quick settings, the validation split (``tuned``
        studies unless ``eval_split="test"``), the study's ``defaults``, the user's ``--set``, then the
        study's own ``study`` keys. A key given twice keeps its last value."""
        groups = [(f"data.root={self.root}",) if self.root else (), QUICK_OVERRIDES if self.quick else (),
                  VALIDATION_OVERRIDES if tuned and self.eval_split == "validation" else (),
                  defaults, self.extra_overrides, study]
        merged: dict[str, str] = {}
        for item in (o for group in groups for o in group):
            key = item.split("=", 1)[0]
            merged.pop(key, None)
            merged[key] = item
        return tuple(merged.values())

    def sweep_values(self, defaults: Sequence[float]) -> tuple[float, ...]:
        return tuple(self.values) if self.values else tuple(float(v) for v in defaults)

    def train(self, specs: Sequence[RunSpec]) -> list[Path]:
        """Run ``specs`` (finished runs skipped, interrupted ones resumed); their run folders, in order.
        :class:`StudyError` naming the logs when a run fails; ``ValueError`` when an existing run folder
        was trained with other settings (a ``--quick`` run, another split)."""
        for spec in specs:
            _check_same_settings(spec, self.runs_dir)
        print(f"{self.name}: {len(specs)} training run(s) in {self.runs_dir} ({self.jobs} at a time)", flush=True)

        def show(outcome: RunOutcome) -> None:
            print(f"  {outcome.spec.name}: {outcome.status} ({outcome.seconds:.0f} s)", flush=True)

        outcomes = run_grid(specs, self.runs_dir, jobs=self.jobs, on_outcome=show)
        failed = [o for o in outcomes if o.status == "failed"]
        if failed:
            raise StudyError(f"{len(failed)} of {len(outcomes)} run(s) failed: "
                             + ", ".join(f"{o.spec.name} (see {o.log})" for o in failed))
        return [o.run_dir for o in outcomes]

    def train_groups(self, groups: Mapping[K, Sequence[RunSpec]]) -> dict[K, list[Path]]:
        """:meth:`train` on every group's specs as one grid (``jobs`` apply across groups); run folders by group."""
        dirs = iter(self.train([spec for specs in groups.values() for spec in specs]))
        return {key: [next(dirs) for _ in specs] for key, specs in groups.items()}


def _check_same_settings(spec: RunSpec, runs_dir: Path) -> None:
    """An existing run folder must come from the same ``rankopt train`` arguments (its ``run.json``)."""
    record_path = runs_dir / spec.name / "run.json"
    if not record_path.is_file():
        return
    record = json.loads(record_path.read_text())
    command = spec.command(runs_dir)
    start = command.index("train") + 1
    expected = {"recipe": command[start], "overrides": command[start + 1 : command.index("--output")]}
    if {"recipe": record.get("recipe"), "overrides": record.get("overrides")} != expected:
        raise ValueError(f"{runs_dir / spec.name} was trained with other settings ({record.get('recipe')} "
                         f"{' '.join(record.get('overrides') or [])}); use another --out or delete it")


def _seeded(s: Settings, name: str, *overrides: str, defaults: Sequence[str] = (),
            tuned: bool = False) -> list[RunSpec]:
    """One run ``<name>-s<seed>`` per seed."""
    return [RunSpec(f"{name}-s{seed}", s.recipe, s.overrides(*overrides, f"train.seed={seed}", defaults=defaults,
                                                                  tuned=tuned)) for seed in s.seeds]


# ---------------------------------------------------------------- reading trained runs

def _trained_metrics(run_dir: Path, s: Settings) -> dict[str, float]:
    """``report.json["trained"]`` (the last evaluation) of a run, checked to be on the study's split."""
    from rankopt.report.compare import load_run

    record = load_run(run_dir)
    evaluated = list(record.report.get("data", {}).get("eval", {}))
    if (s.eval_split == "validation") != (evaluated == ["validation"]):
        raise ValueError(f"{run_dir} was evaluated on {evaluated}, not on the {s.eval_split} split")
    return {m: record.metric(m) for m in STUDY_METRICS}


def _split_description(run_dir: Path, split: str) -> str:
    """What ``split`` is, with its images and classes per level (a run's ``report.json``)."""
    report = json.loads((run_dir / "report.json").read_text())
    data = report.get("data", {}).get("eval", {}).get(split, {})
    classes = ", ".join(f"{level} {n}" for level, n in data.get("classes", {}).items())
    what = ("a class-disjoint VALIDATION split carved from the training classes (data.validation_fraction=0.2)"
            if split == "validation" else "the TEST split")
    return f"{what}: {data.get('images', '?')} images, classes per level: {classes or '?'}"


def _sweep_measured_on(s: Settings, run_dir: Path) -> str:
    return (f"each run's last evaluation (report.json \"trained\"), on {_split_description(run_dir, s.eval_split)}; "
            f"mean ± std over seeds {', '.join(map(str, s.seeds))}")


def _fmt(value: float) -> str:
    return f"{value:g}"


# ---------------------------------------------------------------- the sweeps

def _sweep(s: Settings, *, param: str, symbol: str, key: str, loss: str, defaults: Sequence[float],
           title: str, fixed: Sequence[str] = (), per_value: Callable[[float], Sequence[str]] | None = None,
           integer: bool = False) -> Findings:
    """Train ``loss`` at each value of ``key`` for every seed; table and figure of :data:`STUDY_METRICS`.
    ``fixed``: default overrides of every run (the user's ``--set`` still wins); ``per_value(v)``: more
    overrides of the runs at ``v``; ``integer``: the values are written as ints."""
    values = s.sweep_values(defaults)
    written = {v: str(int(v)) if integer else str(v) for v in values}
    runs = s.train_groups({v: _seeded(s, f"{param}{_fmt(v)}", f"loss.name={loss}", f"{key}={written[v]}",
                                      *(per_value(v) if per_value else ()), defaults=fixed, tuned=True)
                           for v in values})
    table = Table([symbol, *STUDY_METRICS, "seeds"])
    stats: dict[str, list[Summary]] = {m: [] for m in STUDY_METRICS}
    for v in values:
        metrics = [_trained_metrics(r, s) for r in runs[v]]
        cells = [_summary([m[name] for m in metrics]) for name in STUDY_METRICS]
        for name, cell in zip(STUDY_METRICS, cells, strict=True):
            stats[name].append(cell)
        table.rows.append([_fmt(v), *cells, len(metrics)])
    from rankopt.viz import plot_sweep

    figure = plot_sweep(symbol, values, {m: [c.mean for c in stats[m]] for m in STUDY_METRICS},
                        s.out_dir / f"{s.name}.png", errors={m: [c.std for c in stats[m]] for m in STUDY_METRICS},
                        title_note=f"{s.recipe}, {s.eval_split} split")
    return Findings(title, _sweep_measured_on(s, runs[values[0]][0]), table, [figure])


def lambda_study(s: Settings) -> Findings:
    """ROADMAP's ``L = (1 - λ) L_SupAP + λ L_calibr`` (ROADMAP Eq. 2) for λ in :data:`LAMBDAS`
    (λ = 0: SupAP alone, λ = 1: the calibration term alone; ROADMAP Fig. 4a)."""
    return _sweep(s, param="lam", symbol="λ", key="loss.kwargs.lam", loss="roadmap", defaults=LAMBDAS,
                  title="ROADMAP's λ (ROADMAP Fig. 4a): (1 - λ)·SupAP + λ·calibration")


def rho_study(s: Settings) -> Findings:
    """SupAP with SupRank's slope ``ρ`` of ``H⁻(t) = ρ (t - δ) + σ(δ/τ) + 1/2`` for ``t > δ``
    (ROADMAP Eq. 4) for ρ in :data:`RHOS` (ρ = 0: the sigmoid's plateau; ROADMAP Fig. 4b)."""
    return _sweep(s, param="rho", symbol="ρ", key="loss.kwargs.rho", loss="sup_ap", defaults=RHOS,
                  title="SupAP's slope ρ of H⁻ above δ (ROADMAP Fig. 4b, Eq. 4)")


def _steps_for(s: Settings, batch_sizes: Sequence[int]) -> dict[int, int | None]:
    """``train.max_steps_per_epoch`` per batch size so that each sees about as many images:
    ``steps(B) = round(steps_0 · B_0 / B)`` from the effective config's ``steps_0`` and ``B_0``.
    Without a step cap, the samplers' epochs already hold about ``N / B`` batches: no override."""
    from rankopt.config import load_config

    base = load_config(s.recipe, s.overrides(tuned=True)).train
    if base.max_steps_per_epoch is None:
        return dict.fromkeys(batch_sizes)
    return {b: max(1, round(base.max_steps_per_epoch * base.batch_size / b)) for b in batch_sizes}


def batch_size_study(s: Settings) -> Findings:
    """SupAP alone vs ROADMAP (SupAP + calibration, λ = 0.5) at batch sizes :data:`BATCH_SIZES`
    (m = ``train.m``, the same number of images per epoch for every B) and the gain of the calibration
    term, ``Δ = metric(ROADMAP) - metric(SupAP)`` paired by seed, relative gain ``100 Δ / metric(SupAP)``
    (ROADMAP Fig. 5, TPAMI Fig. 6: the gain grows as B shrinks)."""
    sizes = [int(v) for v in s.sweep_values(BATCH_SIZES)]
    steps = _steps_for(s, sizes)
    capped = {b: [f"train.max_steps_per_epoch={steps[b]}"] if steps[b] else [] for b in sizes}
    runs = s.train_groups({(loss, b): _seeded(s, f"bs{b}-{loss}", f"loss.name={loss}", f"train.batch_size={b}",
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
            cells = {"SupAP": _summary(sup), "ROADMAP": _summary(road),
                     "gain": _summary([r - p for r, p in zip(road, sup, strict=True)])}
            relative = 100.0 * cells["gain"].mean / cells["SupAP"].mean if cells["SupAP"].mean else math.nan
            row += [cells["SupAP"], cells["ROADMAP"], cells["gain"], relative]
            for head, cell in cells.items():
                series.setdefault(f"{head} {m}", []).append(cell)
        table.rows.append(row)
    from rankopt.viz import plot_sweep

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


# ---------------------------------------------------------------- measuring models

def _device() -> torch.device:
    from rankopt.engine.assembly import resolve_device

    return resolve_device("auto")


def _untrained(cfg: ExperimentConfig, seed: int) -> torch.nn.Module:
    """The recipe's model as initialised with ``seed`` (eval mode)."""
    from rankopt.engine.assembly import build_model, seed_everything

    seed_everything(seed)
    return build_model(cfg).to(_device()).eval()


def _embed(model: torch.nn.Module, cfg: ExperimentConfig, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings and labels of the training split (``split="train"``: the one the run trained on) or of
    the evaluation split (``"eval"``, self-retrieval only), always with the test transform."""
    from rankopt.engine.evaluation import embed_dataset
    from rankopt.engine.assembly import build_datasets, build_transforms

    train_ds, evals = build_datasets(cfg, train=split == "train")
    if split != "train" and len(evals) != 1:
        raise ValueError(f"{cfg.data.name}: evaluation splits {list(evals)}; this study needs one self-retrieval split")
    dataset = train_ds if split == "train" else next(iter(evals.values()))
    test_tf = build_transforms(cfg)[1]
    batch_tf = test_tf if cfg.data.batch_transform else None
    if batch_tf is None:
        dataset.transform = test_tf
    out = embed_dataset(model, dataset, batch_size=cfg.eval.batch_size, device=_device(), show_progress=False,
                        batch_transform=batch_tf)
    return out.embeddings, out.labels


def decomposability_gap_study(s: Settings) -> Findings:
    """``DG_AP = (1/K) sum_b AP(B_b) - AP(whole set)`` (ROADMAP Eq. 6) on the TEST split at batch
    sizes :data:`GAP_BATCH_SIZES` (random batches, ``rankopt.metrics.decomposability_gap``) for SupAP
    and ROADMAP models (last checkpoint) and the untrained model, with the relative decrease
    ``100 (DG_SupAP - DG_ROADMAP) / DG_SupAP`` (ROADMAP Table 10)."""
    from rankopt.engine.assembly import model_from_checkpoint
    from rankopt.metrics import decomposability_gap, evaluate

    sizes = [int(v) for v in s.sweep_values(GAP_BATCH_SIZES)]
    runs = s.train_groups({loss: _seeded(s, loss, f"loss.name={loss}") for loss in CALIBRATION_LOSSES})
    gaps: dict[str, list[list[float]]] = {"untrained": [], **{loss: [] for loss in CALIBRATION_LOSSES}}
    whole: dict[str, list[float]] = {name: [] for name in gaps}
    test_size = 0
    for i, seed in enumerate(s.seeds):
        loaded = {loss: model_from_checkpoint(runs[loss][i] / TRAINED_CHECKPOINT, _device())
                  for loss in CALIBRATION_LOSSES}
        cfg = loaded["sup_ap"][1]
        cfg = replace(cfg, data=replace(cfg.data, validation_fraction=0.0))  # the test split, whatever the run used
        models = {"untrained": _untrained(cfg, seed), **{loss: model for loss, (model, _) in loaded.items()}}
        for name, model in models.items():
            emb, labels = _embed(model, cfg, "eval")
            test_size = emb.shape[0]
            whole[name].append(evaluate(emb, labels, metrics=["map"]).metrics["map"])
            gaps[name].append([decomposability_gap(emb, labels, b, seed=seed).gap if b <= test_size else math.nan
                               for b in sizes])
    table = Table(["model", "AP (whole test set)", *[f"DG@{b}" for b in sizes]])
    cells = {name: [_summary([g[j] for g in gaps[name]]) for j in range(len(sizes))] for name in gaps}
    for name in gaps:
        table.rows.append([CALIBRATION_LOSSES.get(name, name), _summary(whole[name]), *cells[name]])
    sup, road = ([c.mean for c in cells[n]] for n in CALIBRATION_LOSSES)
    table.rows.append(["decrease of DG, SupAP -> ROADMAP (%)", None,
                       *[100.0 * (a - b) / a if a else math.nan for a, b in zip(sup, road, strict=True)]])
    from rankopt.viz import plot_decomposability_gap

    figure = plot_decomposability_gap(sizes, {n: [c.mean for c in cells[n]] for n in gaps},
                                      s.out_dir / "decomposability_gap.png",
                                      errors={n: [c.std for c in cells[n]] for n in gaps},
                                      title_note=f"{s.recipe}, test split")
    notes = [f"batch sizes above the {test_size} test images are left out (–)."] if max(sizes) > test_size else []
    return Findings(
        "Decomposability gap of AP on the test set (ROADMAP Eq. 6, Table 10)",
        f"the TEST split ({test_size} images; no hyper-parameter is chosen here); batches drawn at random "
        f"(rankopt.metrics.decomposability_gap, seed = the run's seed); mean ± std over seeds "
        f"{', '.join(map(str, s.seeds))}",
        table, [figure], notes)


def approximation_error_study(s: Settings) -> Findings:
    """``AP_e = |AP_pred - AP|`` (Smooth-AP Eq. 8) of each surrogate on the training batches while one
    model trains (the recipe with ``loss.name=smooth_ap`` unless ``--set loss.name=...``): the
    ``surrogate_ap`` diagnostic (:mod:`rankopt.engine.diagnostics`) logged every
    ``train.diagnostics_every`` steps into ``steps.csv`` (Smooth-AP Fig. 4)."""
    from rankopt.engine.diagnostics import SURROGATES
    from rankopt.report.run_report import read_run

    if s.values:
        raise ValueError("approximation_error sweeps nothing: --values does not apply")
    every = QUICK_DIAGNOSTICS_EVERY if s.quick else DIAGNOSTICS_EVERY
    runs = s.train(_seeded(s, "diag", "train.diagnostics=[surrogate_ap]",
                           defaults=("loss.name=smooth_ap", f"train.diagnostics_every={every}")))
    folders = [read_run(run) for run in runs]
    per_seed = []
    for run, folder in zip(runs, folders, strict=True):
        steps = folder.steps
        if steps is None or "diag/ap/true" not in steps:
            raise ValueError(f"{run / 'steps.csv'} has no diag/ columns: the trainer did not log the "
                             "surrogate_ap diagnostic")
        logged = np.isfinite(steps["diag/ap/true"])
        per_seed.append({"step": steps["step"][logged], "true": steps["diag/ap/true"][logged],
                         **{n: steps[f"diag/error/{n}"][logged] for n in SURROGATES}})
    count = min(len(p["step"]) for p in per_seed)
    edge = max(1, round(EDGE_FRACTION * count))
    table = Table(["surrogate", f"first {EDGE_FRACTION:.0%} of steps", f"last {EDGE_FRACTION:.0%} of steps"])
    for name in ("true", *SURROGATES):
        first = _summary([float(np.mean(p[name][:edge])) for p in per_seed])
        last = _summary([float(np.mean(p[name][count - edge : count])) for p in per_seed])
        table.rows.append(["true batch AP (for scale)" if name == "true" else name, first, last])
    from rankopt.viz import plot_approximation_error

    loss = folders[0].report.get("loss", {}).get("name", "?")
    mean_errors = {n: np.mean([p[n][:count] for p in per_seed], axis=0).tolist() for n in SURROGATES}
    figure = plot_approximation_error(per_seed[0]["step"][:count], mean_errors, s.out_dir / "approximation_error.png",
                                      title_note=f"{s.recipe}, trained with {loss}")
    return Findings(
        "AP approximation error of the surrogates during training (Smooth-AP Fig. 4, Eq. 8)",
        f"the training batches of a model trained with {loss} (embeddings detached), every "
        f"{folders[0].setting('train.diagnostics_every', '?')} steps ({count} logged steps): the mean of "
        f"|AP_pred - AP| over the first and the last logged steps, AP_pred = 1 - loss value (the first row: the "
        f"true batch AP itself); mean ± std over seeds {', '.join(map(str, s.seeds))}",
        table, [figure])


def operating_fractions(embeddings: torch.Tensor, labels: torch.Tensor, batches: Sequence[Sequence[int]],
                        taus: Sequence[float], *, similarity: str = "cosine") -> np.ndarray:
    """``(len(batches), len(taus))``: per batch, the fraction of its score differences
    ``d = s_k - s_j`` (every query, positive ``j``, other item ``k``) with ``|d| < δ(τ)``,
    ``δ(τ) = τ ln((1 - ε)/ε)``, ``ε = 0.01`` (where ``σ'`` falls below ~ε: ROADMAP supp. A.3).

    Smooth-AP supp. Eq. 1 counts ``|dG/dD| > 0.005`` instead; both measure the sigmoid's operating region."""
    from rankopt.rank import default_delta, operating_fraction, score_differences

    out = np.full((len(batches), len(taus)), math.nan)
    for i, batch in enumerate(batches):
        index = torch.as_tensor(list(batch), dtype=torch.long)
        diffs = score_differences(embeddings[index], labels[index], similarity=similarity, max_queries=len(index))
        out[i] = [operating_fraction(diffs, default_delta(tau)) for tau in taus]
    return out


def _operating_batches(labels: torch.Tensor, batch_size: int, m: int, seed: int, count: int) -> list[np.ndarray]:
    """The first ``count`` m-per-class batches of epoch 0 (none when fewer than ``batch_size / m`` classes
    have ``m`` images)."""
    from rankopt.data import build_batch_sampler

    if batch_size % m:
        raise ValueError(f"batch size {batch_size} is not a multiple of train.m = {m}")
    sizes = np.unique(labels[:, 0].numpy(), return_counts=True)[1]
    if int((sizes >= m).sum()) < batch_size // m:
        return []
    sampler = build_batch_sampler("m_per_class", labels.numpy(), batch_size=batch_size, m=m, seed=seed)
    return sampler.global_batches(0)[:count]


def operating_region_study(s: Settings) -> Findings:
    """The fraction of score differences in the sigmoid's operating region ``|d| < δ(τ)`` for
    τ in :data:`OPERATING_TAUS` and batch sizes :data:`OPERATING_BATCH_SIZES` (m-per-class batches of
    the training split, test transform), for the untrained model and a model trained with Smooth-AP
    (one run, or ``from_run``): Smooth-AP supp. Fig. S7a."""
    from rankopt.engine.assembly import model_from_checkpoint

    sizes = [int(v) for v in s.sweep_values(OPERATING_BATCH_SIZES)]
    run = s.from_run or s.train(_seeded(replace(s, seeds=s.seeds[:1]), "smooth_ap",
                                        defaults=("loss.name=smooth_ap",)))[0]
    trained, cfg = model_from_checkpoint(run / TRAINED_CHECKPOINT, _device())
    count = QUICK_OPERATING_BATCHES if s.quick else OPERATING_BATCHES
    similarity = str(cfg.loss.kwargs.get("similarity", "cosine"))
    taus = [f"τ={t:g}" for t in OPERATING_TAUS]
    table = Table(["model", "B", "batches", *taus])
    fractions: dict[str, dict[str, list[float]]] = {}
    notes = []
    for name, model in (("untrained", _untrained(cfg, cfg.train.seed)), ("trained", trained)):
        emb, labels = _embed(model, cfg, "train")
        by_tau = fractions.setdefault(name, {t: [] for t in taus})
        for b in sizes:
            batches = _operating_batches(labels, b, cfg.train.m, cfg.train.seed, count)
            if not batches:
                notes.append(f"B={b} needs {b // cfg.train.m} classes with >= {cfg.train.m} images; the training "
                             f"split has fewer: left out (–).")
            values = operating_fractions(emb, labels, batches, OPERATING_TAUS, similarity=similarity)
            cells = [_summary(values[:, j]) for j in range(len(taus))]
            table.rows.append([name, b, len(batches), *cells])
            for tau, cell in zip(taus, cells, strict=True):
                by_tau[tau].append(cell.mean)
    from rankopt.viz import plot_operating_region

    figure = plot_operating_region(sizes, fractions, s.out_dir / "operating_region.png", title_note=s.recipe)
    return Findings(
        "Score differences in the sigmoid's operating region vs batch size and τ (Smooth-AP supp. Fig. S7)",
        f"m-per-class batches (m = {cfg.train.m}) of the training split of {run} (test transform), the first "
        f"{count} of an epoch per B; every query of a batch; mean ± std over batches",
        table, [figure], notes=list(dict.fromkeys(notes)))


def _smooth_ap_ablation(s: Settings, key: str, **sweep: object) -> Findings:
    """One sweep of Smooth-AP Table 5: ``key`` varies, the other parameters at :data:`SMOOTH_AP_TABLE5`."""
    fixed = tuple(f"{k}={v}" for k, v in SMOOTH_AP_TABLE5.items() if k != key)
    return _sweep(s, key=key, loss="smooth_ap", fixed=fixed, **sweep)  # type: ignore[arg-type]


def smooth_ap_tau_study(s: Settings) -> Findings:
    """Smooth-AP's sigmoid temperature τ (Eq. 6) at |P| = 4, B = 128 (Smooth-AP Table 5, left)."""
    return _smooth_ap_ablation(s, "loss.kwargs.tau", param="tau", symbol="τ", defaults=SMOOTH_AP_TAUS,
                               title="Smooth-AP's sigmoid temperature τ (Smooth-AP Table 5, §6.4), |P| = 4, B = 128")


def smooth_ap_positives_study(s: Settings) -> Findings:
    """Smooth-AP with |P| = ``train.m`` images per class in a batch, τ = 0.01, B = 128 (Smooth-AP Table 5, middle)."""
    return _smooth_ap_ablation(s, "train.m", param="m", symbol="|P|", defaults=SMOOTH_AP_POSITIVES, integer=True,
                               title="Smooth-AP's positives per class |P| (Smooth-AP Table 5, §6.4), τ = 0.01, B = 128")


def smooth_ap_batch_study(s: Settings) -> Findings:
    """Smooth-AP at batch sizes B, τ = 0.01, |P| = 4 (Smooth-AP Table 5, right), each B seeing about as many
    images per epoch (:func:`_steps_for`)."""
    sizes = [int(v) for v in s.sweep_values(SMOOTH_AP_BATCH_SIZES)]
    steps = _steps_for(s, sizes)
    return _smooth_ap_ablation(
        s, "train.batch_size", param="bs", symbol="B", defaults=sizes, integer=True,
        per_value=lambda b: [f"train.max_steps_per_epoch={steps[int(b)]}"] if steps[int(b)] else [],
        title="Smooth-AP's batch size B (Smooth-AP Table 5, §6.4), τ = 0.01, |P| = 4")


STUDIES: dict[str, Callable[[Settings], Findings]] = {
    "batch_size": batch_size_study,
    "lambda": lambda_study,
    "rho": rho_study,
    "decomposability_gap": decomposability_gap_study,
    "approximation_error": approximation_error_study,
    "operating_region": operating_region_study,
    "smooth_ap_tau": smooth_ap_tau_study,
    "smooth_ap_positives": smooth_ap_positives_study,
    "smooth_ap_batch": smooth_ap_batch_study,
}
"""Study name -> function ``(Settings) -> Findings``."""


# ---------------------------------------------------------------- running a study

def default_out_dir(name: str, quick: bool = False) -> Path:
    return Path("studies") / (f"{name}-quick" if quick else name)


def study_command(s: Settings) -> str:
    """The ``rankopt study`` command line that reproduces ``s``."""
    args = ["rankopt", "study", s.name, "--recipe", s.recipe, "--out", str(s.out_dir), "--jobs", str(s.jobs)]
    args += ["--root", s.root] if s.root else []
    args += ["--seeds", *map(str, s.seeds)]
    args += ["--quick"] if s.quick else []
    args += ["--eval-split", s.eval_split] if s.eval_split != "validation" else []
    args += ["--values", *map(_fmt, s.values)] if s.values else []
    args += ["--from-run", str(s.from_run)] if s.from_run else []
    args += ["--set", *s.extra_overrides] if s.extra_overrides else []
    return shlex.join(args)


def _machine() -> str:
    from rankopt.engine.run_folder import machine_info

    info = machine_info(_device())
    device = info.get("gpu") or info["device"]
    return (f"{info['platform']}, {info['cpu_count']} CPUs, Python {info['python']}, torch {info['torch']}, "
            f"device {device}")


def _write_markdown(s: Settings, findings: Findings, seconds: float) -> Path:
    lines = [f"# Study `{s.name}`: {findings.title}", "", f"Measured on {findings.measured_on}.", "",
             findings.table.markdown(), ""]
    lines += [f"- {note}" for note in findings.notes] + ([""] if findings.notes else [])
    lines += [f"![{p.stem}]({p.name})" for p in findings.figures] + [""]
    lines += [f"- command: `{study_command(s)}`", f"- machine: {_machine()}",
              f"- date: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
              f"- wall time: {seconds:.0f} s (this invocation; finished runs are reused)",
              f"- runs: `{s.runs_dir}`" + (" (quick settings: not a result)" if s.quick else ""), ""]
    return write_text_atomic(s.out_dir / "study.md", "\n".join(lines))


def run_study(
    name: str,
    *,
    recipe: str = "omniglot",
    root: str | None = None,
    out_dir: str | Path | None = None,
    seeds: Sequence[int] = (0, 1, 2),
    jobs: int = 1,
    quick: bool = False,
    extra_overrides: Sequence[str] = (),
    eval_split: str = "validation",
    values: Sequence[float] | None = None,
    from_run: str | Path | None = None,
) -> StudyResult:
    """Run study ``name`` of :data:`STUDIES` and write ``OUT/study.md``, ``OUT/study.csv`` and ``OUT/*.png``.

    ``root``: ``data.root`` of every run; ``extra_overrides``: ``key=value`` for every run; ``quick``:
    :data:`QUICK_OVERRIDES` and the first seed only; ``eval_split``: ``validation`` (default) or
    ``test`` for the sweeps; ``values``: the swept values instead of the study's defaults;
    ``from_run``: ``operating_region`` measures this run folder's model instead of training one.
    """
    if name not in STUDIES:
        raise ValueError(f"unknown study {name!r}; known: {', '.join(STUDIES)}")
    if eval_split not in EVAL_SPLITS:
        raise ValueError(f"eval_split must be one of {EVAL_SPLITS}, got {eval_split!r}")
    if not seeds:
        raise ValueError("need at least one seed")
    if from_run is not None and name != "operating_region":
        raise ValueError("from_run applies to the operating_region study only")
    if from_run is not None and not (Path(from_run) / TRAINED_CHECKPOINT).is_file():
        raise FileNotFoundError(f"{Path(from_run) / TRAINED_CHECKPOINT} does not exist "
                                "(from_run must be a trained run folder)")
    settings = Settings(
        name=name, recipe=recipe, root=str(Path(root).resolve()) if root else None,
        out_dir=Path(out_dir) if out_dir is not None else default_out_dir(name, quick),
        seeds=tuple(int(x) for x in seeds)[: 1 if quick else None], jobs=jobs, quick=quick,
        extra_overrides=tuple(extra_overrides), eval_split=eval_split,
        values=tuple(float(v) for v in values) if values else None, from_run=Path(from_run) if from_run else None)
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    findings = STUDIES[name](settings)
    table_path = _write_markdown(settings, findings, time.perf_counter() - start)
    csv_path = findings.table.write_csv(settings.out_dir / "study.csv")
    print(f"\n{findings.title}\nmeasured on {findings.measured_on}\n\n{findings.table.markdown()}\n")
    for note in findings.notes:
        print(f"note: {note}")
    print(f"wrote {table_path}, {csv_path}, " + ", ".join(str(p) for p in findings.figures))
    return StudyResult(table_path, csv_path, tuple(findings.figures))
