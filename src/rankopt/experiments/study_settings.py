"""How a study was asked for (:class:`StudySettings`) and how it trains its runs through the grid runner
(:mod:`rankopt.experiments.runner`): the overrides of each run, one run per seed, the check that an existing
run folder was trained with the same settings."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from rankopt.experiments.runner import RunOutcome, RunSpec, run_grid
from rankopt.layout import CHECKPOINTS_DIR, LAST_CKPT, RUN_JSON

QUICK_OVERRIDES = ("data.kwargs.alphabets=3", "train.epochs=1", "train.max_steps_per_epoch=8", "train.batch_size=32",
                   "output.map_points=300", "train.sampler=m_per_class")
"""``--quick``: tiny settings for tests and CI (one seed)."""
VALIDATION_OVERRIDES = ("data.validation_fraction=0.2",)
TRAINED_CHECKPOINT = Path(CHECKPOINTS_DIR) / LAST_CKPT
CALIBRATION_LOSSES = {"sup_ap": "SupAP (no calibration)", "roadmap": "ROADMAP (SupAP + calibration)"}
"""ROADMAP without and with its calibration term (``batch_size`` and ``decomposability_gap``)."""


class StudyError(RuntimeError):
    """Some training runs of a study failed (their ``train.log`` says why)."""


K = TypeVar("K")


@dataclass(frozen=True)
class StudySettings:
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
    record_path = runs_dir / spec.name / RUN_JSON
    if not record_path.is_file():
        return
    record = json.loads(record_path.read_text())
    command = spec.command(runs_dir)
    start = command.index("train") + 1
    expected = {"recipe": command[start], "overrides": command[start + 1 : command.index("--output")]}
    if {"recipe": record.get("recipe"), "overrides": record.get("overrides")} != expected:
        raise ValueError(f"{runs_dir / spec.name} was trained with other settings ({record.get('recipe')} "
                         f"{' '.join(record.get('overrides') or [])}); use another --out or delete it")


def seeded_runs(s: StudySettings, name: str, *overrides: str, defaults: Sequence[str] = (),
                tuned: bool = False) -> list[RunSpec]:
    """One run ``<name>-s<seed>`` per seed."""
    return [RunSpec(f"{name}-s{seed}", s.recipe, s.overrides(*overrides, f"train.seed={seed}", defaults=defaults,
                                                                  tuned=tuned)) for seed in s.seeds]


def value_text(value: float) -> str:
    return f"{value:g}"
