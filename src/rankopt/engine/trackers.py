"""Experiment trackers (``output.loggers``): MLflow and Weights & Biases, offline by default, and TensorBoard.

:class:`ExperimentLoggers` is what the trainer holds. Built at the start of a run, it imports each tracker's
optional package (a missing one: an error naming ``pip install 'rankopt[<extra>]'``, before any training).
Then it sends the resolved config as params (dotted keys), every ``steps.csv`` row under its column names
(``loss``, ``term/...``, ``lr/...``), every ``metrics.csv`` record as ``metrics/<column>`` at the step it was
evaluated, and at the end the report and metrics files (and ``checkpoints/best.ckpt`` with
``output.log_checkpoints``). TensorBoard itself is written by :class:`rankopt.engine.metrics_log.RunLogger`.

``RUN/loggers.json`` keeps each tracker's run id and the last step sent: a resumed run continues the same
tracker runs and sends each step once (steps replayed after a crash, from the last checkpoint, are skipped).
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from rankopt.config import OutputConfig
from rankopt.files import write_text_atomic
from rankopt.layout import (BEST_CKPT, CHECKPOINTS_DIR, CONFIG_YAML, FIGURES_DIR, LOGGERS_JSON, METRICS_CSV,
                            METRICS_JSON, REPORT_HTML, REPORT_JSON, STEPS_CSV)
from rankopt.nested import flatten

ARTIFACTS = (REPORT_HTML, FIGURES_DIR, REPORT_JSON, METRICS_CSV, METRICS_JSON, STEPS_CSV, CONFIG_YAML)


def require(module: str, extra: str) -> Any:
    """``module`` imported, or an ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(f"output.loggers={extra} needs an optional package ({err}); "
                          f"install it with: pip install 'rankopt[{extra}]'") from None


class ExperimentLogger(Protocol):
    """One tracker. ``start`` returns the tracker's run id; ``run_id`` (a resumed run): continue that run."""

    name: str

    def start(self, run_dir: Path, config: dict[str, Any], run_info: dict[str, Any],
              run_id: str | None = None) -> str: ...

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, step: int, values: dict[str, float]) -> None: ...

    def log_artifact(self, path: Path) -> None: ...

    def finish(self, status: str) -> None:
        """``status``: ``FINISHED`` or ``FAILED``."""


def mlflow_name(name: str) -> str:
    """``name`` with the characters MLflow refuses in metric and param names replaced (``map@r`` -> ``map_at_r``)."""
    return re.sub(r"[^/\w.\- ]", "_", name.replace("@", "_at_"))


class MLflowLogger:
    """MLflow: tracking URI ``output.mlflow_uri``, else ``$MLFLOW_TRACKING_URI``, else the file store
    ``RUN/mlruns`` (no server); experiment = the config's name (the recipe), run name = the run folder's."""

    name = "mlflow"

    def __init__(self, uri: str | None):
        self.uri = uri
        self.tracking = require("mlflow.tracking", "mlflow")
        self.entities = require("mlflow.entities", "mlflow")

    def start(self, run_dir: Path, config: dict[str, Any], run_info: dict[str, Any],
              run_id: str | None = None) -> str:
        uri = self.uri or os.environ.get("MLFLOW_TRACKING_URI") or (run_dir / "mlruns").resolve().as_uri()
        if uri.startswith("file:"):  # MLflow 3 refuses its file store (maintenance mode) without this opt-in
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client, self.run_dir = self.tracking.MlflowClient(tracking_uri=uri), run_dir
        if run_id is None:
            experiment = self.client.get_experiment_by_name(config["name"])
            experiment_id = (experiment.experiment_id if experiment is not None
                             else self.client.create_experiment(config["name"]))
            tags = {"rankopt.run_dir": str(run_dir), **{f"rankopt.{k}": str(v) for k, v in run_info.items()}}
            run_id = self.client.create_run(experiment_id, run_name=run_dir.name, tags=tags).info.run_id
        else:
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id
        return run_id

    def log_params(self, params: dict[str, Any]) -> None:
        """The params not logged yet (MLflow params cannot change: a resumed run keeps the first values)."""
        logged = self.client.get_run(self.run_id).data.params
        new = {mlflow_name(k): str(v) for k, v in params.items()}
        self.client.log_batch(self.run_id, params=[self.entities.Param(k, v) for k, v in new.items()
                                                   if k not in logged])

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[self.entities.Metric(mlflow_name(k), v, now, step)
                                                    for k, v in values.items()])

    def log_artifact(self, path: Path) -> None:
        """A file or folder of the run folder, at the same place among the run's artifacts."""
        where = path.relative_to(self.run_dir)
        if path.is_dir():
            self.client.log_artifacts(self.run_id, str(path), artifact_path=str(where))
        else:
            self.client.log_artifact(self.run_id, str(path),
                                     artifact_path=None if where.parent == Path() else str(where.parent))

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status)


class WandbLogger:
    """Weights & Biases: ``mode="offline"`` unless ``$WANDB_MODE`` says otherwise (``wandb sync RUN/wandb/...``
    uploads an offline run later), files under ``RUN/wandb``, project ``output.wandb_project``."""

    name = "wandb"

    def __init__(self, project: str):
        self.project = project
        self.wandb = require("wandb", "wandb")

    def start(self, run_dir: Path, config: dict[str, Any], run_info: dict[str, Any],
              run_id: str | None = None) -> str:
        self.run_dir = run_dir
        self.run = self.wandb.init(
            project=self.project, dir=str(run_dir), mode=os.environ.get("WANDB_MODE", "offline"),
            id=run_id, resume="allow", name=run_dir.name, job_type="train",
            notes=run_info.get("command"), settings=self.wandb.Settings(console="off"))
        return self.run.id

    def log_params(self, params: dict[str, Any]) -> None:
        self.run.config.update(params, allow_val_change=True)

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def log_artifact(self, path: Path) -> None:
        pattern = path / "*" if path.is_dir() else path
        self.run.save(str(pattern), base_path=str(self.run_dir), policy="end")

    def finish(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "FINISHED" else 1)
        self.wandb.teardown()  # waits for W&B's service to write the run's files (finish() does not)


class ExperimentLoggers:
    """The trackers of ``output.loggers`` (none where ``enabled`` is false: a non-main DDP process).

    ``tensorboard``: whether :class:`~rankopt.engine.metrics_log.RunLogger` writes TensorBoard
    (``output.tensorboard``, or ``tensorboard`` in ``output.loggers``, which then requires the package).
    """

    def __init__(self, output: OutputConfig, *, resumed: bool, enabled: bool = True):
        names = list(dict.fromkeys(output.loggers)) if enabled else []
        self.tensorboard = output.tensorboard or "tensorboard" in names
        if "tensorboard" in names:
            require("torch.utils.tensorboard", "tensorboard")
        build = {"mlflow": lambda: MLflowLogger(output.mlflow_uri), "wandb": lambda: WandbLogger(output.wandb_project)}
        self.loggers: list[ExperimentLogger] = [build[name]() for name in names if name in build]
        self.resumed, self.log_checkpoints = resumed, output.log_checkpoints
        self.state: dict[str, dict[str, Any]] = {"runs": {}, "last_step": {}}

    def start(self, run_dir: Path, config: dict[str, Any], run_info: dict[str, Any]) -> None:
        """Start (a resumed run: continue) each tracker's run and log the config as params."""
        if not self.loggers:
            return
        self.path = run_dir / LOGGERS_JSON
        if self.resumed and self.path.is_file():
            self.state = json.loads(self.path.read_text())
        for logger in self.loggers:
            self.state["runs"][logger.name] = logger.start(run_dir, config, run_info,
                                                           run_id=self.state["runs"].get(logger.name))
            logger.log_params(flatten(config))
        self._save()
        atexit.register(self.finish, "FAILED")  # the process ends without finish(): an error or an interrupt

    def log_step(self, row: Mapping[str, Any]) -> None:
        """A ``steps.csv`` row, under its column names."""
        self._log("steps", "", row)

    def log_evaluation(self, record: Mapping[str, Any]) -> None:
        """A ``metrics.csv`` record, as ``metrics/<column>``."""
        self._log("metrics", "metrics/", record)

    def _log(self, kind: str, prefix: str, row: Mapping[str, Any]) -> None:
        step = int(row["step"])
        if not self.loggers or step <= self.state["last_step"].get(kind, -1):
            return
        values = {prefix + k: float(v) for k, v in row.items() if k != "step" and isinstance(v, (int, float))}
        for logger in self.loggers:
            logger.log_metrics(step, values)
        self.state["last_step"][kind] = step
        self._save()

    def _save(self) -> None:
        write_text_atomic(self.path, json.dumps(self.state, indent=2))

    def finish(self, status: str = "FINISHED") -> None:
        """Send the run folder's report and metrics files (a finished run) and close each tracker's run."""
        atexit.unregister(self.finish)
        if not self.loggers:
            return
        names = ARTIFACTS + ((f"{CHECKPOINTS_DIR}/{BEST_CKPT}",) if self.log_checkpoints else ())
        paths = [self.path.parent / name for name in names] if status == "FINISHED" else []
        for logger in self.loggers:
            for path in paths:
                if path.exists():
                    logger.log_artifact(path)
            logger.finish(status)
        self.loggers = []
