"""Experiment trackers (rankopt.engine.trackers): MLflow's file store and W&B offline, read back after tiny runs.

The tests that train need the optional package (``rankopt[mlflow]``, ``rankopt[wandb]``) and skip without it.
"""

from __future__ import annotations

import csv
import json
import math
import struct
import sys
from pathlib import Path

import pytest
from test_trainer import Interrupt, tiny_config, tiny_data  # noqa: F401 - tiny_data is a fixture

from rankopt.config import load_config
from rankopt.engine.trackers import LOGGERS_JSON, ExperimentLoggers, mlflow_name
from rankopt.engine.trainer import Trainer

WANDB_BLOCK = 32768  # the .wandb file: LevelDB log records in 32 KiB blocks after a 7-byte header


@pytest.fixture(autouse=True)
def _offline_env(monkeypatch):
    """No tracking server nor W&B mode from the caller's environment; MLflow's file-store opt-in undone."""
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "WANDB_MODE"):
        monkeypatch.setenv(name, "")  # records the value to restore, then unset
        monkeypatch.delenv(name)
    monkeypatch.setenv("WANDB_SILENT", "true")


def _columns(path: Path) -> dict[str, list[str]]:
    rows = list(csv.DictReader(open(path)))
    return {key: [row[key] for row in rows] for key in rows[0]}


def _by_step(steps: list[str], values: list[str]) -> dict[int, float]:
    return {int(s): float(v) for s, v in zip(steps, values) if v != ""}


def _same(a: dict[int, float], b: dict[int, float]) -> bool:
    return a.keys() == b.keys() and all(a[k] == pytest.approx(b[k]) or math.isnan(a[k]) and math.isnan(b[k])
                                        for k in a)


def _run(out: Path, *extra: str) -> Trainer:
    trainer = Trainer(tiny_config(out, *extra))
    trainer.fit()
    return trainer


def _crash_after_logging_step(monkeypatch, step: int) -> None:
    """Make the trackers raise right after sending step ``step`` (a crash between two checkpoints)."""
    original = ExperimentLoggers.log_step

    def log_step(self, row):
        original(self, row)
        if row["step"] == step:
            raise Interrupt

    monkeypatch.setattr(ExperimentLoggers, "log_step", log_step)


def _crash_and_resume(out: Path, monkeypatch, *extra: str) -> None:
    """Train to step 6, crash before its checkpoint, then resume from step 4's (an epoch's end) to step 8:
    steps 5 and 6 are trained again, not logged again."""
    extra = (*extra, "train.checkpoint_every_steps=3")
    crashed = Trainer(tiny_config(out, *extra))
    with monkeypatch.context() as patch:
        _crash_after_logging_step(patch, 6)
        with pytest.raises(Interrupt):
            crashed.fit()
    crashed.trackers.finish("FAILED")  # what the process's exit does (atexit)
    resumed = Trainer(tiny_config(out, *extra, "train.resume=auto"))
    assert resumed.global_step == 4
    resumed.fit()


# ---------------------------------------------------------------- MLflow

def _mlflow_client(out: Path):
    mlflow_tracking = pytest.importorskip("mlflow.tracking")
    return mlflow_tracking.MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())


def _mlflow_run(out: Path):
    client = _mlflow_client(out)
    runs = client.search_runs([client.get_experiment_by_name("default").experiment_id])
    assert len(runs) == 1
    return client, runs[0]


def _mlflow_history(client, run_id: str, name: str) -> dict[int, float]:
    history = client.get_metric_history(run_id, mlflow_name(name))
    assert len({m.step for m in history}) == len(history), f"{name}: a step logged twice"
    return {m.step: m.value for m in history}


def _assert_mlflow_matches_files(out: Path) -> str:
    client, run = _mlflow_run(out)
    steps, metrics = _columns(out / "steps.csv"), _columns(out / "metrics.csv")
    for name in [k for k in steps if k.startswith(("term/", "lr/"))] + ["loss"]:
        assert _same(_mlflow_history(client, run.info.run_id, name), _by_step(steps["step"], steps[name])), name
    for name in ("map@r", "recall@1", "loss"):
        assert _same(_mlflow_history(client, run.info.run_id, f"metrics/{name}"),
                     _by_step(metrics["step"], metrics[name])), name
    assert run.info.status == "FINISHED"
    return run.info.run_id


def test_mlflow_file_store_holds_params_steps_metrics_and_files(tmp_path, tiny_data):
    pytest.importorskip("mlflow")
    out = tmp_path / "run"
    _run(out, "output.loggers=[mlflow]", "output.log_checkpoints=true")
    _assert_mlflow_matches_files(out)
    client, run = _mlflow_run(out)
    assert run.data.params["loss.name"] == "sup_ap" and run.data.params["train.epochs"] == "2"
    assert run.info.run_name == "run" and run.data.tags["rankopt.run_dir"] == str(out)
    files = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert {"metrics.csv", "metrics.json", "steps.csv", "report.json", "config.yaml", "checkpoints"} <= files
    assert [f.path for f in client.list_artifacts(run.info.run_id, "checkpoints")] == ["checkpoints/best.ckpt"]
    assert json.loads((out / LOGGERS_JSON).read_text())["runs"]["mlflow"] == run.info.run_id


def test_mlflow_resume_continues_the_run_without_logging_a_step_twice(tmp_path, tiny_data, monkeypatch):
    pytest.importorskip("mlflow")
    out = tmp_path / "run"
    _crash_and_resume(out, monkeypatch, "output.loggers=[mlflow]")
    run_id = _assert_mlflow_matches_files(out)  # one run; each step once, equal to steps.csv
    client = _mlflow_client(out)
    assert sorted(_mlflow_history(client, run_id, "loss")) == list(range(1, 9))


# ---------------------------------------------------------------- W&B

def _wandb_records(path: Path):
    """The protobuf records of an offline run's ``.wandb`` file."""
    pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")
    data, pos, chunk = path.read_bytes(), 7, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if WANDB_BLOCK - pos % WANDB_BLOCK < 7:  # a block's tail too short for a header is padding
            pos += WANDB_BLOCK - pos % WANDB_BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(chunk)
            yield record
            chunk = b""


def _wandb_runs(out: Path) -> list[Path]:
    return sorted((out / "wandb").glob("offline-run-*"))


def _wandb_file(folder: Path) -> Path:
    [path] = folder.glob("run-*.wandb")
    return path


def _wandb_history(folder: Path) -> dict[int, dict[str, float]]:
    """Step -> logged values, read from the offline run's ``.wandb`` file (every step at most once)."""
    rows: dict[int, dict[str, float]] = {}
    for record in _wandb_records(_wandb_file(folder)):
        if record.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            assert row["_step"] not in rows
            rows[row["_step"]] = row
    return rows


def _assert_wandb_matches_files(out: Path, history: dict[int, dict[str, float]]) -> None:
    steps, metrics = _columns(out / "steps.csv"), _columns(out / "metrics.csv")
    for name in [k for k in steps if k.startswith(("term/", "lr/"))] + ["loss"]:
        logged = {s: row[name] for s, row in history.items() if name in row}
        assert _same(logged, _by_step(steps["step"], steps[name])), name
    for name in ("map@r", "recall@1"):
        logged = {s: row[f"metrics/{name}"] for s, row in history.items() if f"metrics/{name}" in row}
        assert _same(logged, _by_step(metrics["step"], metrics[name])), name


def test_wandb_offline_run_holds_config_steps_metrics_and_files(tmp_path, tiny_data):
    pytest.importorskip("wandb")
    out = tmp_path / "run"
    _run(out, "output.loggers=[wandb]")
    [folder] = _wandb_runs(out)
    run_id = json.loads((out / LOGGERS_JSON).read_text())["runs"]["wandb"]
    assert (folder / f"run-{run_id}.wandb").is_file()
    _assert_wandb_matches_files(out, _wandb_history(folder))
    records = list(_wandb_records(_wandb_file(folder)))
    config = {item.key: json.loads(item.value_json) for r in records if r.WhichOneof("record_type") == "config"
              for item in r.config.update}
    assert config["loss.name"] == "sup_ap" and config["train.epochs"] == 2
    saved = {f.path for r in records if r.WhichOneof("record_type") == "files" for f in r.files.files}
    assert {"metrics.csv", "steps.csv", "report.json", "config.yaml"} <= saved
    assert [r.exit.exit_code for r in records if r.WhichOneof("record_type") == "exit"] == [0]


def test_wandb_resume_continues_the_run_id_without_logging_a_step_twice(tmp_path, tiny_data, monkeypatch):
    pytest.importorskip("wandb")
    out = tmp_path / "run"
    _crash_and_resume(out, monkeypatch, "output.loggers=[wandb]")
    first, second = _wandb_runs(out)  # one offline folder per process, the same run id (`wandb sync` merges)
    run_id = json.loads((out / LOGGERS_JSON).read_text())["runs"]["wandb"]
    assert (first / f"run-{run_id}.wandb").is_file() and (second / f"run-{run_id}.wandb").is_file()
    before, after = _wandb_history(first), _wandb_history(second)
    assert sorted(before) == [0, 1, 2, 3, 4, 5, 6] and sorted(after) == [7, 8]
    _assert_wandb_matches_files(out, {**before, **after})


# ---------------------------------------------------------------- without the packages

@pytest.mark.parametrize("extra, modules", [("mlflow", ["mlflow.tracking", "mlflow.entities"]),
                                            ("wandb", ["wandb"]), ("tensorboard", ["torch.utils.tensorboard"])])
def test_a_missing_extra_fails_before_training(tmp_path, tiny_data, monkeypatch, extra, modules):
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    out = tmp_path / "run"
    with pytest.raises(ImportError, match=rf"pip install 'rankopt\[{extra}\]'"):
        Trainer(tiny_config(out, f"output.loggers=[{extra}]"))
    assert not (out / "steps.csv").exists() and not (out / "checkpoints").exists()


def test_unknown_logger_is_refused_by_the_config():
    with pytest.raises(ValueError, match="output.loggers.*neptune.*tensorboard, mlflow, wandb"):
        load_config(None, ["output.loggers=[neptune]"])


def test_metric_names_as_mlflow_takes_them():
    assert mlflow_name("metrics/map@r") == "metrics/map_at_r" and mlflow_name("term/a+b") == "term/a_b"
