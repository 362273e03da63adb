"""Metrics history files and the console table (rankopt.engine.logging)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from rankopt.engine.logging import METRICS_CSV, METRICS_JSON, RunLogger, format_table


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
