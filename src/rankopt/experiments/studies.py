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

This module holds the registry and :func:`run_study`; the sweeps are in :mod:`rankopt.experiments.study_sweeps`,
the measurements of models and logs in :mod:`rankopt.experiments.study_analyses`, the settings and the training
of runs in :mod:`rankopt.experiments.study_settings`, the result tables in :mod:`rankopt.experiments.study_tables`.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rankopt.describe import machine_info
from rankopt.experiments.study_analyses import (
    approximation_error_study,
    decomposability_gap_study,
    measuring_device,
    operating_region_study,
)
from rankopt.experiments.study_settings import TRAINED_CHECKPOINT, StudySettings, value_text
from rankopt.experiments.study_sweeps import (
    batch_size_study,
    lambda_study,
    rho_study,
    smooth_ap_batch_study,
    smooth_ap_positives_study,
    smooth_ap_tau_study,
)
from rankopt.experiments.study_tables import Findings
from rankopt.files import write_text_atomic

EVAL_SPLITS = ("validation", "test")


@dataclass(frozen=True)
class StudyResult:
    """The files a study wrote."""

    table_md_path: Path
    csv_path: Path
    figure_paths: tuple[Path, ...]


STUDIES: dict[str, Callable[[StudySettings], Findings]] = {
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
"""Study name -> function ``(StudySettings) -> Findings``."""


# ---------------------------------------------------------------- running a study

def default_out_dir(name: str, quick: bool = False) -> Path:
    return Path("studies") / (f"{name}-quick" if quick else name)


def study_command(s: StudySettings) -> str:
    """The ``rankopt study`` command line that reproduces ``s``."""
    args = ["rankopt", "study", s.name, "--recipe", s.recipe, "--out", str(s.out_dir), "--jobs", str(s.jobs)]
    args += ["--root", s.root] if s.root else []
    args += ["--seeds", *map(str, s.seeds)]
    args += ["--quick"] if s.quick else []
    args += ["--eval-split", s.eval_split] if s.eval_split != "validation" else []
    args += ["--values", *map(value_text, s.values)] if s.values else []
    args += ["--from-run", str(s.from_run)] if s.from_run else []
    args += ["--set", *s.extra_overrides] if s.extra_overrides else []
    return shlex.join(args)


def _machine() -> str:
    info = machine_info(measuring_device())
    device = info.get("gpu") or info["device"]
    return (f"{info['platform']}, {info['cpu_count']} CPUs, Python {info['python']}, torch {info['torch']}, "
            f"device {device}")


def _write_markdown(s: StudySettings, findings: Findings, seconds: float) -> Path:
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
    :data:`~rankopt.experiments.study_settings.QUICK_OVERRIDES` and the first seed only; ``eval_split``:
    ``validation`` (default) or ``test`` for the sweeps; ``values``: the swept values instead of the study's defaults;
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
    settings = StudySettings(
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
