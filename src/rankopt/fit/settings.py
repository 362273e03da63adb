"""What ``rankopt fit`` takes besides the photos (:class:`FitSettings`), and its run folder's check."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from rankopt import layout
from rankopt.files import replaceable_folder

QUERIES = ("known", "new", "both")
"""The searches a fit prepares for (:attr:`FitSettings.queries`)."""


@dataclass(frozen=True)
class FitSettings:
    """What ``rankopt fit`` takes besides the photos and the run folder."""

    minutes: float = 10.0
    backbone: str = "auto"
    """``auto`` (:mod:`rankopt.fit.backbones`: the better search the budget holds), a release name, or
    ``timm:NAME``."""
    weights: str | None = None
    seed: int = 0
    device: str = "auto"
    validation_fraction: float = 0.2
    """Share of each class's photos kept back, and of the classes held out whole (:mod:`rankopt.fit.validation`)."""
    queries: str = "both"
    """The searches the index will answer (:data:`QUERIES`): ``known`` new photos of the
    folder's classes, ``new`` photos of other classes, ``both``."""
    losses: tuple[str, ...] = ("sup_ap",)
    lrs: tuple[float, ...] = (1e-5, 3e-5, 1e-4)
    """Adam learning rates tried first (the tuning extends the grid beyond a winning end)."""
    batch_size: int = 64
    m: int = 4
    dba: bool = True
    """Whether DBA is tried on validation (the index stays changeable: its vectors are recomputed on a change)."""
    refit: bool = True
    """Whether the chosen recipe (loss, learning rate, steps) is run again on every photo for the served model
    (:func:`rankopt.fit.tune.retrain`; the steps scaled by the photos added)."""
    overwrite: bool = False
    """Whether an existing run folder (a fit's, finished or not) is replaced."""
    strict: bool = False
    """Whether an unreadable photo refuses the fit (every one named) instead of being left out and listed in
    ``RUN/skipped.txt``."""
    runtime: str | None = None
    """What runs the frozen forwards (framing, trunk, the index's check): ``auto``, ``torch``, ``onnx``
    (:mod:`rankopt.export.runtimes`; ``None``: ``$RANKOPT_RUNTIME``, else ``auto``)."""


def check_run_folder(out: str | os.PathLike[str], overwrite: bool = False) -> Path:
    """``out`` as a new run folder (:func:`rankopt.files.replaceable_folder`). An existing non-empty folder is
    refused in one sentence, unless ``overwrite`` and it is a fit's run folder (then it is removed); a folder of
    anything else is never removed."""
    folder = Path(out).expanduser()
    is_run = replaceable_folder(
        folder, ours=lambda f: (f / layout.FIT_JSON).is_file() or (f / layout.UNFINISHED).is_file(),
        what="run folder", error=FileExistsError,
        refusal=f"run folder {str(folder)!r} already exists and is not empty (it is not a fit's run folder, so "
                "--overwrite does not touch it): choose a new --out")
    if not is_run:
        return folder
    if overwrite:
        shutil.rmtree(folder)
        return folder
    unfinished = layout.read_unfinished(folder)
    if unfinished is not None:
        raise FileExistsError(layout.unfinished_message(folder, unfinished))
    raise FileExistsError(f"run folder {str(folder)!r} holds a finished fit: add --overwrite to replace it, or "
                          "choose a new --out")
