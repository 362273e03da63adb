"""Metrics history files and the console table (rankopt.engine.metrics_log; progress: rankopt.console)."""

from __future__ import annotations

import csv
import json
import io
import math
import subprocess
import sys
from pathlib import Path

from rankopt.console import bars_shown, format_table, progress
from rankopt.engine.metrics_log import METRICS_CSV, METRICS_JSON, RunLogger


def test_history_written_as_csv_and_json(tmp_path: Path):
    logger = RunLogger(tmp_path, tensorboard=True)  # tensorboard may be absent: CSV/JSON regardless
    logger.log({"epoch": 0, "step": 0, "loss": math.nan, "map@r": 0.1})
    logger.log({"epoch": 1, "step": 10, "loss": 0.5, "map@r": 0.3, "recall@1": 0.6})
    logger.close()
    rows = list(csv.DictReader(open(tmp_path / METRICS_CSV)))
    assert [r["epoch"] for r in rows] == ["0", "1"]
    assert rows[1]["recall@1"] == "0.6" and rows[0]["recall@1"] == ""
    history = json.loads((tmp_path / METRICS_JSON).read_text())
    assert history[1] == {"epoch": 1, "step": 10, "loss": 0.5, "map@r": 0.3, "recall@1": 0.6}


def test_format_table_side_by_side():
    text = format_table({"untrained": {"map@r": 0.1, "recall@1": 0.25}, "trained": {"map@r": 0.5}}, "title")
    lines = text.splitlines()
    assert lines[0] == "title"
    assert lines[1].split() == ["metric", "untrained", "trained"]
    assert lines[2].split() == ["map@r", "0.1000", "0.5000"]
    assert lines[3].split() == ["recall@1", "0.2500", "-"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bars_are_drawn_on_a_terminal_only(capsys, monkeypatch):
    assert list(progress(range(5), desc="walking")) == list(range(5))
    assert capsys.readouterr().err == ""  # pytest's stderr is not a terminal: no bar
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert bars_shown() and not bars_shown(False)
    assert list(progress(range(5), desc="walking")) == list(range(5))
    assert "walking" in terminal.getvalue()
    assert list(progress(range(5), desc="hidden", enabled=False)) == list(range(5))
    assert "hidden" not in terminal.getvalue()


def test_training_log_in_a_file_has_no_progress_bars(tmp_path):
    """A tiny training with stdout and stderr redirected to a file: the log holds the run's lines
    (run folder, metric tables, one line per evaluation), not one line per progress-bar update."""
    log = tmp_path / "train.log"
    args = ["train.epochs=2", "train.max_steps_per_epoch=3", "train.eval_every=1", "data.kwargs.images_per_class=4",
            "model.backbone=convnet_tiny", "model.embedding_dim=16", "eval.batch_size=16", "output.figures=false",
            "output.tensorboard=false", "--output", str(tmp_path / "run")]
    with log.open("wb") as out:
        done = subprocess.run([sys.executable, "-m", "rankopt", "train", *args], stdout=out, stderr=subprocess.STDOUT,
                              timeout=600, check=False)
    text = log.read_text()
    assert done.returncode == 0, text[-2000:]
    assert "\r" not in text and "it/s" not in text and "chunk/s" not in text
    lines = text.splitlines()
    assert sum(line.startswith("epoch ") for line in lines) == 2  # the per-evaluation lines are kept
    assert len(lines) < 60, f"{len(lines)} lines"
