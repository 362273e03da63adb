"""A run folder is a portable thing: ``index.json`` names the run's checkpoint relative to the index folder, so a
copied or moved run is loaded, searched and served; a fit that did not finish is refused in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rankopt import layout
from rankopt.cli import main
from rankopt.search import Index, storage

from helpers.checkpoints import write_checkpoint
from helpers.images import CLASSES, class_tree, draw


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fit-like run folder: ``model.ckpt``, ``index/`` (the gallery outside the run), ``fit.json``,
    ``report.html``."""
    root = tmp_path_factory.mktemp("portable")
    run = root / "run"
    checkpoint = write_checkpoint(run / layout.MODEL_CKPT)
    Index.build(checkpoint, class_tree(root / "gallery"), device="cpu", progress=False).save(run / layout.INDEX_DIR)
    (run / layout.FIT_JSON).write_text("{}\n")
    (run / layout.REPORT_HTML).write_text("<html></html>\n")
    draw(root / "queries" / "alpha" / "one" / "q.png", CLASSES["alpha/one"], 99)
    return run


@pytest.fixture
def run(run_folder: Path, tmp_path: Path) -> Path:
    """A copy of the run folder a test may move or change."""
    return Path(shutil.copytree(run_folder, tmp_path / "first" / "run"))


def index_json(run: Path) -> dict:
    return json.loads((run / layout.INDEX_DIR / storage.INDEX_JSON).read_text())


def test_a_moved_run_loads_searches_and_adds(run: Path, run_folder: Path, tmp_path: Path, capsys):
    assert index_json(run)["checkpoint"] == "../model.ckpt"
    query = run_folder.parent / "queries"
    before = Index.load(run).search(query, k=3)
    moved = Path(shutil.move(run, tmp_path / "elsewhere" / "moved"))
    assert not run.exists()
    index = Index.load(moved)
    assert index.record.checkpoint == str((moved / layout.MODEL_CKPT).resolve())
    vector = index.embedder_for().embed(query, desc="query").embeddings
    after = index.search(query, k=3)
    assert torch.allclose(before.scores, after.scores) and before.ids == after.ids
    assert index.search(vector, k=3).ids == after.ids
    # the command line on the moved run: search, then index-add (saved again: still relative)
    assert main(["search", str(moved), str(query), "--top-k", "2", "--device", "cpu", "--no-progress"]) == 0
    assert "alpha/one" in capsys.readouterr().out
    assert main(["index-add", str(moved), "--images", str(query), "--device", "cpu", "--no-progress"]) == 0
    assert len(Index.load(moved)) == len(index) + 1 and index_json(moved)["checkpoint"] == "../model.ckpt"


def test_a_moved_run_is_served(run: Path, run_folder: Path, tmp_path: Path):
    pytest.importorskip("fastapi", reason="the serve extra is not installed")
    pytest.importorskip("httpx", reason="the service tests need httpx")
    from fastapi.testclient import TestClient

    from rankopt.serve import IndexHolder, Settings, create_app
    from rankopt.serve.settings import HostRule

    moved = Path(shutil.move(run, tmp_path / "served"))
    settings = Settings(reload_every_s=0, hosts=HostRule(allowed=("testserver",)))
    app = create_app(IndexHolder(moved, device="cpu"), settings)
    image = (run_folder.parent / "queries" / "alpha" / "one" / "q.png").read_bytes()
    with TestClient(app) as client:
        answer = client.post("/search", params={"k": 3}, files={"image": ("q.png", image, "image/png")})
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["results"]) == 3


def test_checkpoint_paths_in_index_json(run: Path, run_folder: Path, tmp_path: Path):
    # a copy of the index folder alone still finds the checkpoint by its absolute path as written
    alone = Path(shutil.copytree(run_folder / layout.INDEX_DIR, tmp_path / "alone" / "idx"))
    assert Index.load(alone).record.checkpoint == str((run_folder / layout.MODEL_CKPT).resolve())
    # a checkpoint elsewhere stays absolute; one inside the index folder is relative to it
    assert storage.stored_checkpoint(str(run / layout.MODEL_CKPT), tmp_path / "x" / "idx") == {
        "checkpoint": str((run / layout.MODEL_CKPT).resolve())}
    inside = storage.stored_checkpoint(str(run / "index" / "m.ckpt"), run / "index")
    assert inside["checkpoint"] == "m.ckpt"
    assert storage.stored_checkpoint(None, run) == {"checkpoint": None}


def test_an_old_index_with_a_vanished_absolute_path_finds_the_run_s_checkpoint(run: Path):
    path = run / layout.INDEX_DIR / storage.INDEX_JSON
    info = index_json(run)
    del info["checkpoint_absolute"]
    info["checkpoint"] = "/gone/before/the/move/model.ckpt"
    path.write_text(json.dumps(info))
    index = Index.load(run)
    assert index.record.checkpoint == str((run / layout.MODEL_CKPT).resolve())
    index.embedder_for()  # the fingerprint matches
    (run / layout.MODEL_CKPT).unlink()
    with pytest.raises(FileNotFoundError, match="/gone/before/the/move/model.ckpt"):
        Index.load(run).embedder_for()


def test_an_unfinished_fit_is_refused(run: Path, capsys):
    layout.write_unfinished(run, stage="trunk", photos="/my photos", out=str(run))
    started = layout.read_unfinished(run)["started_utc"]
    layout.write_unfinished(run, stage="tune", photos="/my photos", out=str(run))
    info = layout.read_unfinished(run)
    assert info["stage"] == "tune" and info["started_utc"] == started
    assert info["command"] == f"rankopt fit '/my photos' --out {run} --overwrite"
    for path in (run, run / layout.INDEX_DIR):  # the run folder, or the index folder inside it
        with pytest.raises(ValueError, match="did not finish or is still running") as error:
            Index.load(path)
        assert "stage 'tune'" in str(error.value) and info["command"] in str(error.value)
    assert main(["search", str(run), str(run), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "stage 'tune'" in err
    done = subprocess.run([sys.executable, "-m", "rankopt", "serve", str(run), "--device", "cpu"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    pytest.importorskip("fastapi", reason="without the serve extra, serve says how to install it")
    assert "did not finish or is still running" in done.stderr and "--overwrite" in done.stderr
    layout.clear_unfinished(run)
    assert layout.read_unfinished(run) is None and len(Index.load(run)) == 12


def test_a_fit_killed_before_its_index_is_named(run: Path, tmp_path: Path):
    shutil.rmtree(run / layout.INDEX_DIR)
    (run / layout.FIT_JSON).unlink()
    with pytest.raises(ValueError, match="looks like a `rankopt fit` that did not finish"):
        Index.load(run)
    train_run = tmp_path / "train"  # a training run has classes/ too, but is no fit
    (train_run / "classes").mkdir(parents=True)
    (train_run / "run.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="index.json is missing"):
        Index.load(train_run)
