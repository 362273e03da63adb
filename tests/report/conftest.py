"""Fixtures of the report tests: hand-made run folders (no training) and a headless-browser
screenshot of a page (skipped where chromium is absent)."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers.pages import render_page, screenshot_stats  # noqa: F401 - the screenshot fixture, shared

from rankopt.config import load_config, save_config
from rankopt.viz._common import new_figure, save_figure

LEVELS = ["variant", "shape", "family"]
EVAL_EPOCHS = (0, 2, 4, 6)
BEST_EPOCH = 4
"""The hand-made history peaks at epoch 4 on map@r, before the last evaluation (epoch 6)."""
_MAP_R = {0: 0.01, 2: 0.06, 4: 0.11, 6: 0.10}


def tiny_png(path: Path, colour: str = "C0") -> Path:
    """A small real PNG drawn with matplotlib (a filled square)."""
    fig = new_figure(1.2, 0.9)
    ax = fig.add_subplot()
    ax.fill([0, 1, 1, 0], [0, 0, 1, 1], color=colour)
    return save_figure(fig, path)


def _history(levels: int, flat_ap: bool) -> list[dict[str, Any]]:
    records = []
    for epoch in EVAL_EPOCHS:
        m = _MAP_R[epoch]
        record: dict[str, Any] = {"epoch": epoch, "step": epoch * 10, "loss": math.nan if epoch == 0 else 0.6 - m,
                                  "lr_backbone": 1e-3, "lr_head": 1e-3, "recall@1": 3 * m, "map@r": m, "map": 1.5 * m}
        if not flat_ap:
            record.update({f"ap@level{c}": min(1.0, m * (c + 1) * 2) for c in range(levels)})
        record.update({"num_queries": 320, "num_queries_without_positive": 0})
        records.append(record)
    return records


def _steps(num_steps: int, terms: list[str], diffs: bool) -> list[dict[str, float]]:
    rng = np.random.default_rng(0)
    rows = []
    for step in range(1, num_steps + 1):
        row: dict[str, float] = {"epoch": 1 + (step - 1) // 10, "step": step, "seconds": 0.05 * step,
                                 "images": 64 * step, "loss": 0.6 - 0.002 * step + 0.02 * rng.standard_normal()}
        row.update({f"term/{t}": 0.5 + 0.1 * i + 0.02 * rng.standard_normal() for i, t in enumerate(terms)})
        row.update({"lr/backbone": 1e-3 * min(1.0, step / 10), "lr/head": 1e-3 * min(1.0, step / 10)})
        if diffs:
            spread = 0.3 - 0.001 * step
            quantiles = {"min": -2.0, "q01": -1.6, "q05": -1.1, "q25": -0.5, "q50": -0.2, "q75": 0.1, "q95": 0.6,
                         "q99": 0.9, "max": 1.2}
            row.update({f"diff/{k}": spread * v for k, v in quantiles.items()})
        rows.append(row)
    return rows


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def build_run(root: Path, *, loss: str = "roadmap", loss_kwargs: dict[str, Any] | None = None, kind: str = "train",
              steps: bool = True, diffs: bool = True, levels: int = 3, flat_ap: bool = False,
              figures: bool = True, terms: list[str] | None = None) -> Path:
    """A complete run folder in the format of ``rankopt train`` (3 evaluations after the
    untrained one; best epoch 4, not the last), written by hand: no training."""
    root.mkdir(parents=True, exist_ok=True)
    cfg = load_config("default", [f"loss.name={loss}"])
    save_config(cfg, root / "config.yaml")
    level_names = LEVELS[:levels]
    history = _history(levels, flat_ap or levels == 1)
    if kind == "evaluate":
        history = history[-1:]
    (root / "metrics.json").write_text(json.dumps(history, indent=2))
    _write_csv(root / "metrics.csv", history)
    run = {"recipe": "default", "overrides": [f"loss.name={loss}", "train.epochs=6"],
           "command": f"rankopt train default loss.name={loss} train.epochs=6 --output {root}",
           "started_utc": "2026-01-01 12:00:00 UTC", "rankopt_version": "0.1.0",
           "machine": {"platform": "Linux-test", "cpu_count": 2, "python": "3.11", "torch": "2.x",
                       "torch_threads": 2, "device": "cpu"}}
    (root / "run.json").write_text(json.dumps(run))
    if steps and kind == "train":
        _write_csv(root / "steps.csv", _steps(60, terms if terms is not None else ["sup_ap", "calibration"], diffs))
    counts = {"images": 320, "classes": dict(zip(level_names, [40, 8, 2]))}
    pick = lambda r: {k: v for k, v in r.items() if k not in ("epoch", "step", "loss") and not k.startswith("lr_")}  # noqa: E731
    report = {"kind": kind, "name": "default", "run_dir": str(root), "dataset": "synthetic", "epochs": 6, "steps": 60,
              "train_seconds": 3.0, "wall_seconds": 95.0, "images_per_second": 1280.0,
              "untrained": pick(history[0]), "trained": pick(history[-1]),
              "best": {"metric": "map@r", "value": _MAP_R[BEST_EPOCH], "epoch": BEST_EPOCH} if kind == "train" else {},
              "data": {"name": "synthetic", "root": None, "eval_name": "synthetic", "level_names": level_names,
                       "train": counts, "eval": {"test": counts}},
              "model": {"backbone": "convnet_small", "embedding_dim": 128, "parameters": 147648},
              "loss": {"name": loss, "kwargs": dict(loss_kwargs or {}), "repr": f"{loss}(<module>)"},
              "machine": run["machine"], "figures": []}
    if figures:
        for i, name in enumerate(("retrieval_grid.png", "pr_curves.png", "embedding_map.png", "training_curves.png")):
            report["figures"].append(str(tiny_png(root / "figures" / name, f"C{i}")))
    (root / "report.json").write_text(json.dumps(report, indent=2))
    if kind == "train":
        (root / "checkpoints").mkdir()
        (root / "checkpoints" / "best.ckpt").write_bytes(b"not a real checkpoint")
    return root


@pytest.fixture
def make_run(tmp_path: Path) -> Callable[..., Path]:
    """``make_run(name="run", **options)``: :func:`build_run` in a fresh folder of ``tmp_path``."""
    def make(name: str = "run", **options: Any) -> Path:
        return build_run(tmp_path / name, **options)

    return make
