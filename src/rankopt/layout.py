"""The file names of every folder rankopt writes, in one place (their formats: ``docs/reference/formats.md``), and
the marker of a fit that has not finished.

A training or evaluation run folder (``rankopt train``, ``rankopt evaluate --output``): :data:`CONFIG_YAML`,
:data:`RUN_JSON`, :data:`METRICS_CSV`, :data:`METRICS_JSON`, :data:`STEPS_CSV`, :data:`REPORT_JSON`,
:data:`RETRIEVAL_NPZ`, :data:`REPORT_HTML`, :data:`FIGURES_DIR`, :data:`CHECKPOINTS_DIR` (:data:`LAST_CKPT`,
:data:`BEST_CKPT`), :data:`CLASSES_DIR`, :data:`LOGGERS_JSON`. A fit's run folder: :data:`FIT_JSON`,
:data:`MODEL_CKPT`, :data:`FINE_TUNED_CKPT`, :data:`INDEX_DIR`, :data:`REPORT_HTML`, :data:`FIGURES_DIR`,
:data:`CLASSES_DIR`, :data:`SKIPPED_TXT`, :data:`UNFINISHED`. An index folder: :data:`INDEX_JSON`, its versions'
files (:mod:`rankopt.search.storage`) and :data:`SKIPPED_TXT`.

A fit writes ``fit.unfinished.json`` (:func:`write_unfinished`) when it starts and at each stage, and removes it
when ``fit.json`` is written: a folder holding it (or one killed before its index was written) is not served
(:func:`refusal`, checked by :func:`rankopt.search.storage.index_folder`).
"""

from __future__ import annotations

import json
import os
import shlex
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rankopt.files import write_text_atomic

FIT_JSON = "fit.json"
MODEL_CKPT = "model.ckpt"
FINE_TUNED_CKPT = "fine_tuned.ckpt"
INDEX_DIR = "index"
REPORT_HTML = "report.html"
UNFINISHED = "fit.unfinished.json"
CLASSES_DIR = "classes"
SKIPPED_TXT = "skipped.txt"
"""The photos a fit or an index build left out (unreadable), one a line: path, where it was listed, why."""
RUN_JSON = "run.json"
"""A ``rankopt train`` run's record: such a folder is not a fit's."""
CONFIG_YAML = "config.yaml"
METRICS_CSV = "metrics.csv"
METRICS_JSON = "metrics.json"
STEPS_CSV = "steps.csv"
REPORT_JSON = "report.json"
RETRIEVAL_NPZ = "retrieval.npz"
FIGURES_DIR = "figures"
CHECKPOINTS_DIR = "checkpoints"
LAST_CKPT = "last.ckpt"
BEST_CKPT = "best.ckpt"
LOGGERS_JSON = "loggers.json"
INDEX_JSON = "index.json"


def restart_command(photos: str, out: str | os.PathLike[str]) -> str:
    """The command that starts the fit of ``photos`` into ``out`` again, replacing what is there."""
    return f"rankopt fit {shlex.quote(str(photos))} --out {shlex.quote(str(out))} --overwrite"


def write_unfinished(folder: str | os.PathLike[str], *, stage: str, photos: str, out: str) -> None:
    """Write (atomically) ``folder/fit.unfinished.json``: the ``stage`` under way, when the fit started (kept from
    an earlier marker) and this update (UTC), ``photos`` and the command that starts it again."""
    now = f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S UTC}"
    started = (read_unfinished(folder) or {}).get("started_utc") or now
    info = {"stage": stage, "started_utc": started, "updated_utc": now, "photos": str(photos), "out": str(out),
            "command": restart_command(photos, out)}
    write_text_atomic(Path(folder) / UNFINISHED, json.dumps(info, indent=2) + "\n")


def clear_unfinished(folder: str | os.PathLike[str]) -> None:
    """Remove ``folder``'s marker (the fit finished)."""
    (Path(folder) / UNFINISHED).unlink(missing_ok=True)


def read_unfinished(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``folder``'s marker (``{}`` when it cannot be read), or ``None`` when there is none."""
    path = Path(folder) / UNFINISHED
    if not path.is_file():
        return None
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def unfinished_message(folder: str | os.PathLike[str], info: dict[str, Any]) -> str:
    """One sentence for a person: ``folder`` holds a fit that did not finish (the stage ``info``, its marker, names;
    ``{}``: no marker), nothing in it can be served, and the command that starts it again."""
    stage = f" (it was in stage {info['stage']!r})" if info.get("stage") else ""
    command = restart_command(info.get("photos") or "PHOTOS", folder)
    return (f"{str(folder)!r} {'holds' if info else 'looks like'} a `rankopt fit` that did not finish or is still "
            f"running{stage}, so nothing in it can be served; to start it again: {command}")


def refusal(folder: str | os.PathLike[str], *, indexed: bool) -> str | None:
    """Why ``folder`` cannot be served as a fit run: it holds the marker, or (not ``indexed``: no index inside)
    it looks like a fit killed before its index was written (no ``fit.json``, but a model, an index folder or
    classes); else ``None``."""
    folder = Path(folder)
    info = read_unfinished(folder)
    if info is not None:
        return unfinished_message(folder, info)
    if indexed or (folder / FIT_JSON).exists() or (folder / RUN_JSON).exists():
        return None
    started = any((folder / name).exists() for name in (MODEL_CKPT, INDEX_DIR, CLASSES_DIR))
    return unfinished_message(folder, {}) if started else None
