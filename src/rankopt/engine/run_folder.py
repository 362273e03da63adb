"""What a run folder records besides metrics: how the run was asked for, the machine, the data,
the model and loss, and the final model's neighbours (``retrieval.npz``) for pictures and ``compare``.

The keys are described in ``docs/ARCHITECTURE.md`` (the run folder); ``rankopt.report`` reads them.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rankopt.engine.evaluation import EmbeddedSplit
from rankopt.files import write_text_atomic

RUN_JSON = "run.json"
RETRIEVAL_NPZ = "retrieval.npz"
RETRIEVAL_TOP_K = 10


def machine_info(device: torch.device | str) -> dict[str, Any]:
    """Platform, CPU count, Python, torch version and threads, and the compute device (with the GPU's name)."""
    device = torch.device(device)
    info = {"platform": platform.platform(), "cpu_count": os.cpu_count(), "python": sys.version.split()[0],
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(), "device": str(device)}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def write_run_info(run_dir: Path, info: Mapping[str, Any], device: torch.device | str) -> Path:
    """``run.json``: ``info`` (recipe, overrides, command) with the start time, version and machine.
    A resumed run keeps the first record and appends the time of each resume."""
    from rankopt import __version__

    path = run_dir / RUN_JSON
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    if path.is_file():
        record = json.loads(path.read_text())
        record.setdefault("resumed_utc", []).append(now)
    else:
        record = {"recipe": None, "overrides": [], "command": " ".join(sys.argv), **info, "started_utc": now,
                  "rankopt_version": __version__, "machine": machine_info(device)}
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
    """``{split: {"images", "classes": {level name: count}}}`` of datasets with ``labels`` (N, L) (and ``level_names``)."""
    out = {}
    for split, ds in datasets.items():
        labels = np.asarray(ds.labels).reshape(len(ds), -1)
        names = list(getattr(ds, "level_names", None) or [f"level{c}" for c in range(labels.shape[1])])
        out[split] = {"images": int(labels.shape[0]),
                      "classes": {name: int(np.unique(labels[:, c]).size) for c, name in enumerate(names)}}
    return out


def model_info(model: torch.nn.Module, backbone: str) -> dict[str, Any]:
    return {"backbone": backbone, "embedding_dim": int(getattr(model, "embedding_dim", 0)),
            "parameters": int(sum(p.numel() for p in model.parameters()))}


def write_retrieval(run_dir: Path, splits: Sequence[EmbeddedSplit], similarity: str,
                    top_k: int = RETRIEVAL_TOP_K) -> Path:
    """``retrieval.npz``: every query's exact top-``k`` (``rankopt.viz.retrieval_neighbours``) with the
    paths and labels of queries and gallery; no pickled objects (``np.load(allow_pickle=False)``)."""
    from rankopt.viz import retrieval_neighbours

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
    from rankopt.viz import write_figures

    query = splits[0]
    ref = splits[1] if len(splits) == 2 else None
    note = "SYNTHETIC data" if (cfg.data.eval_name or cfg.data.name) == "synthetic" else None
    return write_figures(
        run_dir / "figures", query_embeddings=query.embeddings, query_labels=query.labels,
        ref_embeddings=None if ref is None else ref.embeddings, ref_labels=None if ref is None else ref.labels,
        query_paths=query.paths, ref_paths=None if ref is None else ref.paths, history=history,
        level_names=level_names, similarity=cfg.eval.similarity, title_note=note, map_points=cfg.output.map_points)


def write_html_report(run_dir: Path) -> Path | None:
    """``report.html`` via ``rankopt.report.write_run_report``; a failure is reported, never fatal to the run."""
    from rankopt.engine.logging import echo

    try:
        from rankopt.report import write_run_report

        return write_run_report(run_dir)
    except Exception as err:  # noqa: BLE001 - the run's results are already saved
        echo(f"report.html not written ({type(err).__name__}: {err}); rebuild it with: rankopt report {run_dir}")
        return None
