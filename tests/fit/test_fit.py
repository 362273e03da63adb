"""``rankopt fit``: the cut network, the tuning that keeps the pretrained state, the post-processing choice, and a
whole fit on generated photos (SYNTHETIC: coloured squares, labelled as such) whose run folder is an index that
search, change and serve accept."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers.images import FIT_CLASSES as CLASSES
from helpers.images import FIT_PER_CLASS as PER_CLASS
from helpers.images import photo_folder
from rankopt.config import config_to_dict, load_config
from rankopt.data import DatasetProblems
from rankopt.data.transforms import build_transform
from rankopt.engine.assembly import build_model, model_from_checkpoint
from rankopt.engine.checkpoint import load_checkpoint, save_model_checkpoint
from rankopt.fit import FitSettings, fit
from rankopt.fit.output import served_text
from rankopt.fit.photos import read_photos
from rankopt.fit.post import PostChoice, choose_for_protocols
from rankopt.fit.scales import embed_multiscale, try_multiscale
from rankopt.fit.trunk import final_resolution_cut
from rankopt.fit.validation import make_split
from rankopt.models import create_model
from rankopt.models.stages import cut
from rankopt.postprocess import Expansion
from rankopt.report.html import check_page
from rankopt.search import Index
from rankopt.search.storage import index_folder


@pytest.mark.parametrize("backbone, size", [("mobilenet_v2", (64, 64)), ("efficientnet_lite0", (64, 64)),
                                            ("mobilefacenet", (112, 96)), ("resnet18", (64, 64))])
def test_the_tail_of_the_trunk_is_the_network(backbone, size):
    torch.manual_seed(0)
    net = create_model(backbone).eval()
    x = torch.randn(2, 3, *size)
    at = final_resolution_cut(net, size)
    trunk, tail = cut(net, at)
    assert torch.equal(tail(trunk(x)), net(x))
    final = trunk(x).shape[-2:]
    assert tail.stages[0](trunk(x)).shape[-2:] != final or backbone == "mobilefacenet"  # the tail's first stage shrinks


def test_a_cut_outside_the_stages_and_a_backbone_without_stages_are_refused():
    net = create_model("mobilenet_v2")
    with pytest.raises(ValueError, match="cut at stage 0"):
        cut(net, 0)
    with pytest.raises(ValueError, match="cannot be cut"):
        cut(create_model("convnet_tiny"), 1)


def test_tail_training_keeps_batchnorm_statistics_frozen():
    torch.manual_seed(0)
    net = create_model("mobilenet_v2", freeze_bn=True)
    _, tail = cut(net, 14)
    before = {k: v.clone() for k, v in net.state_dict().items() if "running" in k}
    tail.train()
    tail(torch.randn(4, 96, 4, 4)).sum().backward()
    after = {k: v for k, v in net.state_dict().items() if "running" in k}
    assert all(torch.equal(before[k], after[k]) for k in before)


# ----------------------------------------------------------------------------------------- a whole fit
@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A MobileNetV2 checkpoint with random weights at 64 px (the weights matter not: the pipeline does)."""
    cfg = load_config(None, ["model.backbone=mobilenet_v2", "data.image_size=64", "data.test_transform=test",
                             "data.train_transform=train"])
    torch.manual_seed(0)
    return save_model_checkpoint(tmp_path_factory.mktemp("weights") / "mnv2-random.ckpt",
                                 build_model(cfg).state_dict(), config_to_dict(cfg))


@pytest.fixture(scope="module")
def fitted(tmp_path_factory, pretrained) -> tuple[Path, Path, dict, list[str]]:
    root = tmp_path_factory.mktemp("fit")
    photos = photo_folder(root / "photos")
    last = photos / f"class{CLASSES - 1}"  # a messy folder: a truncated photo and an empty file, left out and listed
    (last / "zz_truncated.jpg").write_bytes((last / "p0.jpg").read_bytes()[:-60])  # the end of its scan cut off
    (last / "zz_empty.jpg").write_bytes(b"")
    lines: list[str] = []
    record = fit(photos, root / "run", FitSettings(minutes=0.5, weights=str(pretrained), lrs=(1e-4, 1e-3)),
                 say=lines.append)
    return photos, root / "run", record, lines


def test_a_fit_writes_a_run_folder_with_an_index_of_every_photo(fitted):
    photos, run, record, lines = fitted
    stored = json.loads((run / "fit.json").read_text())
    for key in ("validation", "pipelines", "chosen", "served", "seconds", "queries"):
        assert key in stored
    assert stored["queries"] == "both" and stored["validation"]["protocols"] == ["known"]  # 6 classes: no open set
    assert "too few to hold whole classes out" in stored["validation"]["note"]
    assert (run / "classes" / "train.txt").read_text().count("\n") == CLASSES
    kept_back = (run / "classes" / "kept_back.txt").read_text().split()
    assert len(kept_back) == stored["validation"]["known_queries"] > 0
    index = Index.load(run)
    assert index_folder(run) == run / "index" and len(index) == CLASSES * PER_CLASS
    readable = sorted(p.name for p in photos.rglob("*.jpg") if not p.name.startswith("zz_"))
    assert sorted(Path(p).name for p in index.paths) == readable
    skipped = (run / "skipped.txt").read_text().splitlines()  # every unreadable photo listed, with why
    assert [Path(line.split(" ")[0]).name for line in skipped] == ["zz_empty.jpg", "zz_truncated.jpg"]
    assert "empty file" in skipped[0] and "truncated" in skipped[1].lower() and stored["skipped"] == skipped
    assert any("2 unreadable photo(s) left out" in line for line in lines if "] check:" in line)
    assert "2 unreadable photo(s) were left out" in (run / "report.html").read_text()
    served = next(p for p in stored["pipelines"] if p["name"] == stored["chosen"]["served_name"])
    features = next(p for p in stored["pipelines"] if p["name"] == "features")
    assert served["scores"]["known"]["metrics"]["map@r"] >= features["scores"]["known"]["metrics"]["map@r"]
    assert any(line.split("] ")[1].startswith("check:") for line in lines) and "finished" in lines[-1]
    assert all(stage in stored["seconds"] for stage in ("check", "trunk", "tune", "post", "index", "report"))
    assert any(line.startswith("multi-scale") for line in stored["chosen"]["why"])  # tried or skipped, and why
    # what fit.json and the page say is served is what the index applies (multi-scale re-chooses the steps)
    for step, applied in (("dba", index.record.dba), ("qe", index.record.qe)):
        assert (stored["chosen"]["post"][step] or {}).get("k") == (applied or {}).get("k")
    assert index.preprocessing.get("multiscale") == stored["chosen"]["multiscale"]
    framing = stored["chosen"]["framing"]  # chosen on validation; the saved model (and so queries) frame photos so
    assert load_checkpoint(run / "model.ckpt")["config"]["data"]["test_transform"] == framing["preset"]
    assert set(framing["validation_map@r"]) == {"test", "landmark_test"}
    assert stored["chosen"]["why"][0].startswith("framing: the whole photo resized")
    words = "whole photo" if framing["preset"] == "landmark_test" else "centre crop"
    model = served["model"]
    assert stored["chosen"]["pipeline"].startswith(f"{model} ({words})") and stored["chosen"]["pipeline"] in \
        (run / "report.html").read_text()
    # model.ckpt is the served model; a fine-tuned one not served is kept beside it, and it differs
    kept = stored["chosen"]["fine_tuned_checkpoint"]
    trained = stored["chosen"]["from"] != "pretrained" or any(p["model"] != "features" for p in stored["pipelines"])
    assert kept == ("fine_tuned.ckpt" if model == "features" and trained else None)
    assert (run / "fine_tuned.ckpt").is_file() == (kept is not None)
    if trained:  # a fine-tuned state won on validation: its recipe ran again on every photo
        assert stored["refit"]["classes"] == CLASSES and stored["refit"]["photos"] == CLASSES * PER_CLASS
        assert 0 <= stored["refit"]["steps"] <= stored["refit"]["planned_steps"] and "refit" in stored["seconds"]
        assert any("run again on all 48 photos of the 6 classes" in why for why in stored["chosen"]["why"])
    else:
        assert stored["refit"] is None and any(why.startswith(("no fine-tuned state beat", "no fine-tuning step"))
                                               for why in stored["chosen"]["why"])
    if kept is not None and stored["refit"]["steps"]:
        tuned, served_weights = (load_checkpoint(run / name)["model"] for name in (kept, "model.ckpt"))
        assert any(not torch.equal(tuned[k], served_weights[k]) for k in tuned)
    assert not (run / "fit.unfinished.json").exists()  # a finished fit leaves no unfinished mark


def test_the_run_folder_is_searched_changed_and_served_as_an_index(fitted, tmp_path):
    photos, run, record, _ = fitted
    query = sorted(photos.rglob("*.jpg"))[0]
    index = Index.load(run)
    own = index.embeddings[index.paths.index(str(query))]
    assert float(index.embedder_for().embed([str(query)]).embeddings[0] @ own) == pytest.approx(1.0, abs=1e-3)
    raw = index.search([str(query)], k=3, qe=Expansion(0))  # the photo itself (or a near-copy: random weights)
    assert raw.scores[0, 0] == pytest.approx(1.0, abs=1e-3)
    result = index.search([str(query)], k=3)  # with the fit's own αQE, if it chose one
    own = index.search([str(query)], k=3, qe=index.query_expansion or Expansion(0))
    assert torch.equal(result.rows, own.rows) and torch.equal(result.scores, own.scores)
    out = subprocess.run([sys.executable, "-m", "rankopt", "search", str(run), str(query), "--top-k", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert query.name in out.stdout
    with Index.editing(run) as editable:
        removed = editable.remove(ids=[editable.ids[0]])
    assert removed and len(Index.load(run)) == CLASSES * PER_CLASS - 1


def test_the_report_page_reads_and_shows_the_before_and_after(fitted, render_page):
    from helpers.pages import screenshot_stats

    _, run, _, _ = fitted
    colours, spread = screenshot_stats(render_page(run / "report.html"))
    assert colours > 50 and spread > 10  # text, tables and the example photos drawn, not a blank page
    html = (run / "report.html").read_text()
    assert check_page(run / "report.html") == []
    for text in ("Every pipeline, searched as the index is", "features", "fine-tuned", "What was chosen",
                 "Time per stage", "known mAP@R"):
        assert text in html
    stored = json.loads((run / "fit.json").read_text())  # each pipeline's scores per validation class are kept
    assert all(p["scores"]["known"]["by_class"] for p in stored["pipelines"])
    served = stored["chosen"]["pipeline"].split(" + ")[-1]  # the served row is highlighted, with its steps
    assert any(row.startswith(' class="highlight"') and (served in row or served == "none")
               for row in html.split("<tr"))
    assert (run / "figures" / "examples.png").is_file()


def test_strict_refuses_bad_photos_before_any_work_naming_each(tmp_path, pretrained):
    photos = photo_folder(tmp_path / "photos")
    (photos / "class0" / "broken.jpg").write_bytes(b"not a jpeg")
    (photos / "class1" / "cut.jpg").write_bytes((photos / "class1" / "p0.jpg").read_bytes()[:300])
    with pytest.raises(DatasetProblems, match="broken.jpg") as refused:
        fit(photos, tmp_path / "run", FitSettings(minutes=0.2, weights=str(pretrained), strict=True),
            say=lambda _: None)
    assert "cut.jpg" in str(refused.value) and "truncated" in str(refused.value).lower()  # every bad file, at once
    assert not (tmp_path / "run").exists()
    dataset = read_photos(photos, None)  # by default they are left out and listed, the others kept
    assert len(dataset) == CLASSES * PER_CLASS and len(dataset.metadata["bad_images"]) == 2


def test_photo_folders_follow_imagefolder_sub_folders_included_and_empty_classes_said(tmp_path):
    photos = photo_folder(tmp_path / "photos", classes=3, per_class=3)
    (photos / "class0" / "sub").mkdir()
    Image.new("RGB", (20, 20), (9, 9, 9)).save(photos / "class0" / "sub" / "nested.jpg")
    (photos / "empty").mkdir()
    (photos / "notes.txt").write_text("not a photo")
    dataset = read_photos(photos, None)
    assert len(dataset) == 3 * 3 + 1
    names = dataset.metadata["label_names"][0]
    assert list(names) == ["class0", "class1", "class2"]  # the empty folder is no class
    nested = dataset.paths.index(str(photos / "class0" / "sub" / "nested.jpg"))
    assert names[dataset.labels[nested, 0]] == "class0"  # a photo in a sub-folder belongs to its class
    notes = " ".join(dataset.metadata["notes"])
    assert "1 empty class folder(s) left out" in notes and "1 image(s) in sub-folders of a class folder" in notes
    assert "non-image file" in notes
    Image.new("RGB", (20, 20), (1, 1, 1)).save(photos / "loose.jpg")  # a photo in no class folder is refused
    with pytest.raises(DatasetProblems, match="directly in"):
        read_photos(photos, None)


def test_an_existing_run_folder_is_never_overwritten(tmp_path, pretrained):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "mine.txt").write_text("keep")
    for overwrite in (False, True):  # --overwrite replaces a fit's folder, never another
        with pytest.raises(FileExistsError, match="not empty"):
            fit(tmp_path / "photos", tmp_path / "run", FitSettings(weights=str(pretrained), overwrite=overwrite),
                say=lambda _: None)
    assert (tmp_path / "run" / "mine.txt").read_text() == "keep"
    out = subprocess.run([sys.executable, "-m", "rankopt", "fit", str(tmp_path / "photos"), "--out",
                          str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert "already exists and is not empty" in out.stderr


def test_a_stopped_fit_is_refused_by_serve_and_fit_and_started_again_with_overwrite(tmp_path, pretrained):
    photos = photo_folder(tmp_path / "photos")
    run = tmp_path / "run"

    def stop(line: str) -> None:  # the fit killed as the framing stage ends
        if "framing:" in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fit(photos, run, FitSettings(minutes=0.3, weights=str(pretrained)), say=stop)
    mark = json.loads((run / "fit.unfinished.json").read_text())
    assert mark["stage"] == "framing" and "--overwrite" in mark["command"]  # stopped as framing ended
    with pytest.raises(ValueError, match="did not finish"):
        Index.load(run)
    for command in (["search", str(run), str(next(photos.rglob("*.jpg")))], ["fit", str(photos), "--out", str(run)]):
        out = subprocess.run([sys.executable, "-m", "rankopt", *command], capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
        assert "did not finish" in out.stderr and "--overwrite" in out.stderr
    fit(photos, run, FitSettings(minutes=0.3, weights=str(pretrained), overwrite=True), say=lambda _: None)
    assert len(Index.load(run)) == CLASSES * PER_CLASS and not (run / "fit.unfinished.json").exists()


def test_a_moved_run_folder_is_served(fitted, tmp_path):
    _, run, _, _ = fitted
    moved = tmp_path / "elsewhere" / "run"
    shutil.copytree(run, moved)
    stored = json.loads((moved / "index" / "index.json").read_text())
    assert not Path(stored["checkpoint"]).is_absolute()  # every path inside a run is relative to it
    query = Index.load(run).paths[0]
    with_original = Index.load(run).search([query], k=3)
    shutil.rmtree(tmp_path / "hidden", ignore_errors=True)
    run.rename(tmp_path / "hidden")  # the original gone: the copy must stand alone
    try:
        index = Index.load(moved)
        assert Path(index.record.checkpoint).parent == moved.resolve()
        result = index.search([query], k=3)
        assert torch.equal(result.rows, with_original.rows)
        pytest.importorskip("fastapi")
        pytest.importorskip("httpx")
        from fastapi.testclient import TestClient

        from rankopt.serve import IndexHolder, Settings, create_app
        from rankopt.serve.settings import HostRule

        settings = Settings(reload_every_s=0, hosts=HostRule(allowed=("testserver",)))
        with TestClient(create_app(IndexHolder(moved, device="cpu"), settings)) as client:
            answer = client.post("/search", params={"k": 2},
                                 files={"image": ("q.jpg", Path(query).read_bytes(), "image/jpeg")})
        assert answer.status_code == 200, answer.text
        expected = [Index.load(moved).paths[int(r)] for r in with_original.rows[0, :2]]
        assert [hit["path"] for hit in answer.json()["results"]] == expected  # as the original folder answered
    finally:
        (tmp_path / "hidden").rename(run)


def test_one_class_is_refused(tmp_path, pretrained):
    photos = photo_folder(tmp_path / "photos")
    for c in range(1, CLASSES):
        shutil.rmtree(photos / f"class{c}")
    with pytest.raises(ValueError, match="at least 2 classes"):
        fit(photos, tmp_path / "run", FitSettings(minutes=0.2, weights=str(pretrained)), say=lambda _: None)


def test_an_oml_csv_gives_every_row_of_every_split(tmp_path):
    from rankopt.fit.photos import read_photos, split_photos

    photos = photo_folder(tmp_path / "photos")
    rows = ["label,path,split"] + [f"c{c},photos/class{c}/p{i}.jpg,{'train' if c < 4 else 'test'}"
                                   for c in range(CLASSES) for i in range(PER_CLASS)]
    (tmp_path / "photos.csv").write_text("\n".join(rows) + "\n")
    dataset = read_photos(tmp_path / "photos.csv", None)
    assert len(dataset) == CLASSES * PER_CLASS and np.unique(dataset.labels[:, 0]).size == CLASSES
    split = split_photos(dataset, 0).split
    assert split.known_queries.size == CLASSES * round(0.2 * PER_CLASS) and photos.is_dir()


def test_the_served_pipeline_is_named_with_its_scales():
    choice = PostChoice(None, Expansion(10, 1.0), None, {"map@r": 0.5}, [])
    assert served_text("fitted", choice, None) == "fitted + DBA k=10 alpha=1"
    assert served_text("features", choice, (1.0, 0.7071, 0.5)) == "features at scales 1, 0.707, 0.5 + DBA k=10 alpha=1"
    assert served_text("fitted", choice, (1.0, 0.5), "whole photo") == "fitted (whole photo) at scales 1, 0.5 + DBA k=10 alpha=1"


def test_multiscale_is_compared_with_the_model_validation_may_score_and_indexed_with_the_served_one(tmp_path, pretrained):
    net, cfg = model_from_checkpoint(pretrained, torch.device("cpu"))
    dataset = read_photos(photo_folder(tmp_path / "photos"), None)
    dataset.transform = build_transform(cfg.data.test_transform, cfg.data.image_size)
    labels = np.asarray(dataset.labels)[:, 0]
    split = make_split(labels, [f"class{c}" for c in range(CLASSES)], seed=0)
    kw = {"device": torch.device("cpu"), "batch_size": 16, "workers": 0}
    before = embed_multiscale(net, dataset, **kw)
    calls: list[int] = []

    def retrained() -> None:  # stands for loading the state retrained on every class
        calls.append(1)
        with torch.no_grad():
            for param in list(net.parameters())[-4:]:
                param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(len(calls))))

    beaten, unbeatable = {"known": -1.0}, {"known": 2.0}
    trial = try_multiscale(net, dataset, split, beaten, dba=True, steps_for="known", decide_on=["known"], retrained=retrained, **kw)
    assert calls == [1] and "embedded again with the retrained one" in trial.note
    on_before = choose_for_protocols(before[torch.as_tensor(split.rows)], split)["known"]
    assert trial.choice is not None and trial.choice.metrics == pytest.approx(on_before.metrics)  # chosen before it
    assert trial.embeddings is not None and not torch.allclose(trial.embeddings, before, atol=1e-3)
    assert torch.allclose(trial.embeddings, embed_multiscale(net, dataset, **kw), atol=1e-5)  # indexed with it
    late = try_multiscale(net, dataset, split, beaten, dba=True, steps_for="known", decide_on=["known"], retrained=retrained,
                          time_left=lambda: 1.0, pass_s=2.0, **kw)
    assert late.choice is None and late.embeddings is None and "not served: no time left" in late.note
    lost = try_multiscale(net, dataset, split, unbeatable, dba=True, steps_for="known", decide_on=["known"], retrained=retrained, **kw)
    assert lost.choice is None and "not kept" in lost.note and calls == [1]
    plain = try_multiscale(net, dataset, split, beaten, dba=True, steps_for="known", decide_on=["known"], **kw)  # no retrained model
    assert plain.embeddings is not None and torch.allclose(plain.embeddings, embed_multiscale(net, dataset, **kw))


def test_a_tuning_too_short_to_score_each_candidate_is_skipped_and_said(tmp_path, pretrained, monkeypatch):
    """Seconds of tuning on a folder whose validation takes longer would be minutes of scoring: the fit skips the
    tuning when scoring each candidate once would take over ``SCORING_SHARE_MAX`` of it, and says so."""
    import rankopt.fit.run as run_module

    monkeypatch.setattr(run_module, "SCORING_SHARE_MAX", 1e-9)  # every scoring "too long" for the time left
    taken: list[float] = []
    real_tune = run_module.tune
    monkeypatch.setattr(run_module, "tune", lambda *a, **k: (taken.append(k["seconds"]), real_tune(*a, **k))[1])
    lines: list[str] = []
    record = fit(photo_folder(tmp_path / "photos"), tmp_path / "run",
                 FitSettings(minutes=1.0, weights=str(pretrained), lrs=(1e-4, 1e-3)), say=lines.append)
    assert taken == [0.0]
    said = next(line for line in lines if "no time was left to fine-tune" in line)
    assert int(re.search(r"\((\d+) s were available\)", said).group(1)) >= 10  # time that would have run it
    assert "its 2 candidates need" in said and "scoring each once on validation" in said
    need_min, need_s = map(int, re.search(r"its 2 candidates need (\d+):(\d\d)", said).groups())
    minutes = int(re.search(r"--minutes (\d+) would give the fine-tuning about half of it", said).group(1))
    assert need_min > 1000 and minutes * 60 / 2 >= need_min * 60 + need_s - 1  # half of it holds the candidates
    served = next(p for p in record["pipelines"] if p["name"] == record["chosen"]["served_name"])
    assert served["model"] == "features" and len(Index.load(tmp_path / "run")) == CLASSES * PER_CLASS
