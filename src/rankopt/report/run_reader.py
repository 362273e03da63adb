"""Reading a run folder (``config.yaml``, ``run.json``, ``report.json``, ``metrics.json``, ``steps.csv``) into a
:class:`RunFolder`, for ``report.html``, ``rankopt compare`` and the studies; absent files give empty values,
corrupt ones a ValueError naming the file."""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from rankopt.layout import CONFIG_YAML, METRICS_JSON, REPORT_JSON, RUN_JSON, STEPS_CSV

__all__ = ["RunFolder", "is_finite", "metric_names", "read_run"]

_RUN_FILES = (CONFIG_YAML, RUN_JSON, REPORT_JSON, METRICS_JSON, STEPS_CSV)
_NOT_METRICS = ("epoch", "step", "loss")


@dataclass
class RunFolder:
    """What a run folder holds; absent files give empty values (``steps`` None)."""

    path: Path
    config: dict[str, Any]
    run: dict[str, Any]
    report: dict[str, Any]
    history: list[dict[str, Any]]
    steps: dict[str, np.ndarray] | None

    def setting(self, key: str, default: Any = None) -> Any:
        """The config value at dotted ``key`` (e.g. ``optim.lr``), ``default`` when absent."""
        node: Any = self.config
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def kind(self) -> str:
        return str(self.report.get("kind", "train"))

    @property
    def synthetic(self) -> bool:
        return "synthetic" in (self.report.get("dataset"), self.setting("data.name"), self.setting("data.eval_name"))

    @property
    def evaluations(self) -> list[dict[str, Any]]:
        """The evaluation records with at least one metric."""
        return [r for r in self.history if metric_names([r])]

    def best_epoch(self) -> int | None:
        """``report.json`` ``best.epoch``, else the trained epoch maximising ``train.best_metric``
        (None for ``rankopt evaluate`` runs)."""
        if self.kind == "evaluate":
            return None
        best = self.report.get("best") or {}
        if isinstance(best.get("epoch"), int):
            return int(best["epoch"])
        key = self.setting("train.best_metric")
        scored = [(r[key], int(r["epoch"])) for r in self.evaluations
                  if r.get("epoch", 0) > 0 and is_finite(r.get(key))]
        return max(scored)[1] if scored else None


def is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _read_structured(path: Path, kind: type) -> Any:
    """Parse a JSON/YAML file that must hold a ``kind``; ValueError naming the file otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (UnicodeDecodeError, ValueError, yaml.YAMLError) as err:
        raise ValueError(f"{path} is not valid {path.suffix[1:].upper()}: {err}") from None
    if not isinstance(data, kind):
        raise ValueError(f"{path} must hold a {kind.__name__}, got {type(data).__name__}")
    return data


def _read_steps(path: Path) -> dict[str, np.ndarray] | None:
    """``steps.csv`` as ``{column: float array}`` (empty cells NaN); None when it has no row."""
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
        header = reader.fieldnames or []
    if not rows:
        return None
    columns_: dict[str, np.ndarray] = {}
    for name in header:
        try:
            columns_[name] = np.array([float(r[name]) if r.get(name) not in ("", None) else math.nan for r in rows])
        except ValueError:
            raise ValueError(f"{path}: column {name!r} holds a non-number") from None
    return columns_


def read_run(run_dir: str | os.PathLike[str]) -> RunFolder:
    """Read a run folder. FileNotFoundError when it does not exist, ValueError when it holds
    none of the run files or when one of them is corrupt (the error names the file)."""
    path = Path(run_dir)
    if not path.exists():
        raise FileNotFoundError(f"run folder {path} does not exist")
    if not path.is_dir():
        raise ValueError(f"{path} is not a folder (expected a run folder)")
    if not any((path / name).is_file() for name in _RUN_FILES):
        raise ValueError(f"{path} is not a rankopt run folder: it has none of {', '.join(_RUN_FILES)}")

    def structured(name: str, kind: type) -> Any:
        file = path / name
        return _read_structured(file, kind) if file.is_file() else kind()

    history = structured(METRICS_JSON, list)
    bad = [i for i, r in enumerate(history) if not isinstance(r, dict)]
    if bad:
        raise ValueError(f"{path / 'metrics.json'}: record {bad[0]} is not an object")
    steps_file = path / STEPS_CSV
    return RunFolder(path, structured(CONFIG_YAML, dict) or {}, structured(RUN_JSON, dict),
                     structured(REPORT_JSON, dict), history,
                     _read_steps(steps_file) if steps_file.is_file() else None)


def metric_names(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Metric keys of evaluation records, in first-seen order (no bookkeeping, loss, lr or counts)."""
    return list(dict.fromkeys(k for r in records for k, v in r.items()
                              if k not in _NOT_METRICS and not k.startswith(("num_", "lr_")) and is_finite(v)))
