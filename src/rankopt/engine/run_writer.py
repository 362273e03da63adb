"""Writing a run folder, for training (:class:`rankopt.engine.trainer.Trainer`) and evaluation
(:func:`write_evaluation_folder`): how the run was asked for (``run.json``), the machine, the data, the model and
loss (``report.json``), and the final model's neighbours (``retrieval.npz``) for pictures and ``compare``.

The keys are described in ``docs/reference/formats.md`` (the run folder); ``rankopt.report`` reads them.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rankopt import __version__
from rankopt.config import ExperimentConfig, save_config
from rankopt.console import echo
from rankopt.describe import machine_info, model_info, source_commit
from rankopt.engine.embed_and_score import EmbeddedSplit
from rankopt.files import write_text_atomic
from rankopt.layout import CONFIG_YAML, FIGURES_DIR, METRICS_JSON, REPORT_JSON, RETRIEVAL_NPZ, RUN_JSON
from rankopt.metrics import EvaluationResult

RETRIEVAL_TOP_K = 10


def write_run_info(run_dir: Path, info: Mapping[str, Any], device: torch.device | str) -> Path:
    """``run.json``: ``info`` (recipe, overrides, command) with the start time, version and machine.
    A resumed run keeps the first record and appends the time of each resume."""
    path = run_dir / RUN_JSON
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    if path.is_file():
        record = json.loads(path.read_text())
        record.setdefault("resumed_utc", []).append(now)
    else:
        record = {"recipe": None, "overrides": [], "command": " ".join(sys.argv), **info, "started_utc": now,
                  "rankopt_version": __version__, "commit": source_commit(), "machine": machine_info(device)}
    return write_text_atomic(path, json.dumps(record, indent=2))


def write_class_split(run_dir: Path, dataset: Any) -> list[Path]:
    """``classes/train.txt`` and ``classes/test.txt`` (one class path per line, a ``#`` line saying how
    they were drawn) when ``dataset.metadata["class_split"]`` holds the split of a user's classes
    (``image_folder``); reusable as ``data.kwargs.train_classes=RUN/classes/train.txt ...``."""
    split = getattr(dataset, "metadata", {}).get("class_split")
    if not split:
        return []
    return [write_text_atomic(run_dir / "classes" / f"{side}.txt",
                              f"# {side} classes ({split['how']})\n" + "".join(f"{c}\n" for c in split[side]))
            for side in ("train", "test")]


def dataset_counts(datasets: Mapping[str, Any]) -> dict[str, Any]:
    """``{split: {"images", "classes": {level name: count}}}`` of datasets with ``labels`` (N, L)
    (and ``level_names``)."""
    out = {}
    for split, ds in datasets.items():
        labels = np.asarray(ds.labels).reshape(len(ds), -1)
        names = list(getattr(ds, "level_names", None) or [f"level{c}" for c in range(labels.shape[1])])
        out[split] = {"images": int(labels.shape[0]),
                      "classes": {name: int(np.unique(labels[:, c]).size) for c, name in enumerate(names)}}
    return out


def write_retrieval(run_dir: Path, splits: Sequence[EmbeddedSplit], similarity: str,
                    top_k: int = RETRIEVAL_TOP_K) -> Path:
    """``retrieval.npz``: every query's exact top-``k`` (``rankopt.viz.retrieval_neighbours``) with the
    paths and labels of queries and gallery; no pickled objects (``np.load(allow_pickle=False)``)."""
    from rankopt.viz import retrieval_neighbours  # matplotlib (slow import): only when a run folder is finished

    query = splits[0]
    ref = splits[1] if len(splits) == 2 else None
    found = retrieval_neighbours(query.embeddings, query.labels, None if ref is None else ref.embeddings,
                                 None if ref is None else ref.labels, top_k=top_k, similarity=similarity)
    ref = ref or query
    path = run_dir / RETRIEVAL_NPZ
    tmp = run_dir / f".{RETRIEVAL_NPZ}.tmp.npz"
    np.savez_compressed(tmp, query_paths=np.asarray(query.paths, dtype=str), query_labels=query.labels.numpy(),
                        ref_paths=np.asarray(ref.paths, dtype=str), ref_labels=ref.labels.numpy(),
                        neighbours=found.indices.numpy().astype(np.int64),
                        scores=found.scores.numpy().astype(np.float32), self_retrieval=np.asarray(len(splits) == 1))
    os.replace(tmp, path)
    return path


def write_split_figures(run_dir: Path, splits: Sequence[EmbeddedSplit], cfg: Any, *,
                        history: Sequence[Mapping[str, Any]] | None = None,
                        level_names: Sequence[str] | None = None) -> list[Path]:
    """``rankopt.viz.write_figures`` of the embedded evaluation split(s) into ``run_dir/figures``."""
    from rankopt.viz import write_figures  # matplotlib (slow import): only when figures are drawn

    query = splits[0]
    ref = splits[1] if len(splits) == 2 else None
    note = "SYNTHETIC data" if (cfg.data.eval_name or cfg.data.name) == "synthetic" else None
    return write_figures(
        run_dir / FIGURES_DIR, query_embeddings=query.embeddings, query_labels=query.labels,
        ref_embeddings=None if ref is None else ref.embeddings, ref_labels=None if ref is None else ref.labels,
        query_paths=query.paths, ref_paths=None if ref is None else ref.paths, history=history,
        level_names=level_names, similarity=cfg.eval.similarity, title_note=note, map_points=cfg.output.map_points)


def write_html_report(run_dir: Path) -> Path | None:
    """``report.html`` via ``rankopt.report.write_run_report``; a failure is reported, never fatal to the run."""
    try:
        from rankopt.report import write_run_report  # matplotlib (slow import): only when report.html is written

        return write_run_report(run_dir)
    except Exception as err:  # noqa: BLE001 - the run's results are already saved
        echo(f"report.html not written ({type(err).__name__}: {err}); rebuild it with: rankopt report {run_dir}")
        return None


def finish_run_folder(run_dir: Path, report: dict[str, Any], splits: Sequence[EmbeddedSplit], cfg: ExperimentConfig,
                      *, figures: bool, html: bool, history: Sequence[Mapping[str, Any]] | None = None,
                      level_names: Sequence[str] | None = None) -> Path | None:
    """``retrieval.npz``, the figures (their paths in ``report["figures"]``) when ``figures``, ``report.json``,
    and ``report.html`` when ``html``; returns the page's path (None when not written)."""
    write_retrieval(run_dir, splits, cfg.eval.similarity)
    if figures:
        paths = write_split_figures(run_dir, splits, cfg, history=history, level_names=level_names)
        report["figures"] = [str(p) for p in paths]
    write_text_atomic(run_dir / REPORT_JSON, json.dumps(report, indent=2))
    return write_html_report(run_dir) if html else None


def write_evaluation_folder(run_dir: Path, *, checkpoint: str, command: str, cfg: ExperimentConfig,
                            model: torch.nn.Module, datasets: Mapping[str, Any], splits: Sequence[EmbeddedSplit],
                            result: EvaluationResult, seconds: float,
                            postprocessing: dict[str, Any] | None = None) -> Path | None:
    """The run folder of an evaluation (kind ``evaluate``): config, run info, one metrics record,
    report.json (with the ``postprocessing`` steps applied), retrieval.npz, figures and report.html
    (retrieval.npz and the figures use the whitened embeddings, without DBA/αQE); returns report.html's path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / CONFIG_YAML)
    device = next(model.parameters()).device
    write_run_info(run_dir, {"recipe": f"(checkpoint {checkpoint})", "overrides": [], "command": command}, device)
    record = {"epoch": 0, "step": 0, **result.to_record()}
    write_text_atomic(run_dir / METRICS_JSON, json.dumps([record], indent=2))
    level_names = list(getattr(next(iter(datasets.values())), "level_names", []))
    dataset = cfg.data.eval_name or cfg.data.name
    report = {
        "kind": "evaluate", "name": cfg.name, "run_dir": str(run_dir), "dataset": dataset, "checkpoint": checkpoint,
        "wall_seconds": round(seconds, 1), "untrained": {}, "trained": record, "best": {},
        "data": {"name": dataset, "root": cfg.data.eval_root or cfg.data.root, "eval_name": dataset,
                 "level_names": level_names, "eval": dataset_counts(datasets)},
        "model": model_info(model, cfg.model.backbone),
        "loss": {"name": cfg.loss.name, "kwargs": dict(cfg.loss.kwargs), "repr": ""},
        "machine": machine_info(device),
        "figures": [],  # filled by finish_run_folder (keeps the key order of report.json)
        "postprocessing": postprocessing or {},
    }
    return finish_run_folder(run_dir, report, splits, cfg, figures=True, html=True, level_names=level_names)
