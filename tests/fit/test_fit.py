"""``rankopt fit``: the cut network, the tuning that keeps the pretrained state, the post-processing choice, and a
whole fit on generated photos (SYNTHETIC: coloured squares, labelled as such) whose run folder is an index that
search, change and serve accept."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from rankopt.config import config_to_dict, load_config
from rankopt.data import DatasetProblems
from rankopt.data.transforms import build_transform
from rankopt.engine.assembly import build_model, model_from_checkpoint
from rankopt.engine.checkpoint import load_checkpoint, save_model_checkpoint
from rankopt.fit import FitSettings, fit
from rankopt.fit.clock import Clock
from rankopt.fit.page import validation_table
from rankopt.fit.post import PostChoice, choose_postprocessing, score_self_retrieval, served_pipeline
from rankopt.fit.photos import read_photos
from rankopt.fit.run import served_text
from rankopt.fit.scales import embed_multiscale, try_multiscale
from rankopt.fit.trunk import TrunkCache, embed_cached, final_resolution_cut
from rankopt.fit import tune as tune_module
from rankopt.fit.tune import Candidate, retrain, tune
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


def _clustered(n_classes: int, per_class: int, dim: int, spread: float, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(n_classes, dim, generator=g)
    labels = np.repeat(np.arange(n_classes), per_class)
    x = centres[torch.as_tensor(labels)] + spread * torch.randn(len(labels), dim, generator=g)
    return torch.nn.functional.normalize(x, dim=1), labels


def test_tuning_never_returns_a_state_worse_than_the_pretrained_one():
    torch.manual_seed(0)
    tail = torch.nn.Sequential(torch.nn.Flatten(1), torch.nn.Linear(8, 8))
    x, labels = _clustered(8, 6, 8, 0.3, 0)
    cache = TrunkCache(x.clone(), (8,))
    train_rows, val_rows = np.arange(0, 24), np.arange(24, 48)

    def validate():
        return score_self_retrieval(embed_cached(tail, cache, val_rows), labels[val_rows])

    result = tune(tail, cache, train_rows, labels[train_rows], validate, [Candidate("sup_ap", 50.0)], seconds=0.5,
                  clock=Clock(10, say=lambda _: None), batch_size=16, m=4)
    assert result.best_metrics["map@r"] >= result.pretrained["map@r"]
    steps = result.trials[0].history
    assert steps and all(s > 0 for s, _ in steps)
    if result.best_state is None:  # every state scored was worse or level: the pretrained one is kept
        assert max(m["map@r"] for _, m in steps) <= result.pretrained["map@r"]


def _linear_tail_setup(seed: int = 0):
    torch.manual_seed(seed)
    tail = torch.nn.Sequential(torch.nn.Flatten(1), torch.nn.Linear(8, 8))
    x, labels = _clustered(8, 6, 8, 0.3, seed)
    start = [p.detach().clone() for p in tail.parameters()]

    def moved() -> float:  # how far the tail went from its start: grows faster with a larger learning rate
        return float(sum((p.detach() - s).abs().sum() for p, s in zip(tail.parameters(), start)))

    return tail, TrunkCache(x.clone(), (8,)), labels, moved


def test_a_candidate_stops_after_patience_scores_without_a_new_best(monkeypatch):
    monkeypatch.setattr(tune_module, "CHECK_EVERY_S", 0.0)  # a score after every step
    tail, cache, labels, _ = _linear_tail_setup()
    train_rows = np.arange(24)
    began = time.monotonic()
    result = tune(tail, cache, train_rows, labels[train_rows], lambda: {"map@r": 0.5, "recall@1": 0.5},
                  [Candidate("sup_ap", 1e-3)], seconds=60.0, clock=Clock(100, say=lambda _: None),
                  batch_size=16, m=4)
    trial = result.trials[0]
    # the first score (0.5) is the trial's best, then PATIENCE level scores end it, long before its 60 s
    assert [s for s, _ in trial.history] == list(range(1, tune_module.PATIENCE + 2))
    assert trial.steps == tune_module.PATIENCE + 1 and time.monotonic() - began < 30
    assert result.best_state is None and result.best_from == "pretrained"  # level with the pretrained state


def test_the_learning_rate_grid_is_extended_beyond_a_winning_end(monkeypatch):
    monkeypatch.setattr(tune_module, "FIRST_ROUND_SHARE", 0.3)  # time for both extensions
    tail, cache, labels, moved = _linear_tail_setup()
    train_rows = np.arange(24)
    result = tune(tail, cache, train_rows, labels[train_rows], lambda: {"map@r": moved(), "recall@1": 0.0},
                  [Candidate("sup_ap", 1e-4), Candidate("sup_ap", 1e-3)], seconds=4.0,
                  clock=Clock(100, say=lambda _: None), batch_size=16, m=4)
    lrs = [t.candidate.lr for t in result.trials]
    assert lrs == [pytest.approx(v) for v in (1e-4, 1e-3, 1e-2, 1e-1)]  # the winning top end, twice one step up
    assert result.best_from.startswith("sup_ap lr 0.1,")
    # a pretrained state that no candidate beats: the grid is not extended
    tail, cache, labels, moved = _linear_tail_setup()
    kept = tune(tail, cache, train_rows, labels[train_rows], lambda: {"map@r": -moved(), "recall@1": 0.0},
                [Candidate("sup_ap", 1e-4), Candidate("sup_ap", 1e-3)], seconds=2.0,
                clock=Clock(100, say=lambda _: None), batch_size=16, m=4)
    assert [t.candidate.lr for t in kept.trials] == [1e-4, 1e-3] and kept.best_state is None


def test_the_leaders_continuation_leaves_the_time_to_retrain_its_best_state_as_it_moves(monkeypatch):
    step_s = 0.01
    monkeypatch.setattr(tune_module, "_train_step", lambda *args: (time.sleep(step_s), 0.0)[1])
    monkeypatch.setattr(tune_module, "GRID_EXTENSIONS", 0)
    tail, cache, labels, _ = _linear_tail_setup()
    train_rows, scores = np.arange(24), iter(range(10**6))  # every score a new best: the best step keeps moving
    seconds, per_step = 3.0, 1.0
    tune_module._optimizer(tail, Candidate("sup_ap", 1e-3)), tune_module.losses.build("sup_ap")  # imports done
    began = time.monotonic()
    result = tune(tail, cache, train_rows, labels[train_rows], lambda: {"map@r": float(next(scores)), "recall@1": 0.0},
                  [Candidate("sup_ap", 1e-4), Candidate("sup_ap", 1e-3)], seconds=seconds,
                  clock=Clock(100, say=lambda _: None), batch_size=16, m=4, reserve_per_step=per_step)
    left = seconds - (time.monotonic() - began)
    needed = per_step * result.best_step * result.step_seconds  # retraining the state returned
    assert result.best_candidate == result.trials[-1].candidate and result.best_step == result.trials[-1].steps
    assert needed > 0.5 and left >= 0.9 * needed, (left, needed)  # reserved at the end, not at the start
    assert left <= needed + 0.5  # and the rest of the time was used


def test_retraining_repeats_the_chosen_recipe_from_the_pretrained_state():
    tail, cache, labels, moved = _linear_tail_setup()
    start = {n: p.detach().clone() for n, p in tail.named_parameters()}
    rows = np.arange(48)

    def again(steps: int, seconds: float = 60.0) -> tuple[int, dict[str, torch.Tensor]]:
        with torch.no_grad():  # an earlier state must not matter: retraining starts from start_state
            for p in tail.parameters():
                p.add_(1.0)
        taken = retrain(tail, cache, rows, labels, Candidate("sup_ap", 1e-2), steps, start_state=start,
                        seconds=seconds, clock=Clock(100, say=lambda _: None), batch_size=16, m=4, seed=3)
        return taken, {n: p.detach().clone() for n, p in tail.named_parameters()}

    taken, first = again(7)
    assert taken == 7 and moved() > 0
    assert all(torch.equal(first[n], v) for n, v in again(7)[1].items())  # same recipe, same seed: same state
    taken, none = again(7, seconds=0.0)  # no time: no step, the start state
    assert taken == 0 and all(torch.equal(none[n], start[n]) for n in start)


def test_only_photos_with_a_mirrored_copy_are_mirrored():
    centre = torch.arange(4 * 6, dtype=torch.float32).view(4, 6)
    cache = TrunkCache(centre, (1, 2, 3), mirrored=-centre[[1, 3]], rows=np.array([1, 3]))
    out = cache.features(np.array([0, 1, 2, 3]), np.array([True, True, True, False])).view(4, -1)
    assert torch.equal(out, torch.stack([centre[0], -centre[1], centre[2], centre[3]]))


def test_post_processing_is_kept_only_when_it_helps_on_validation():
    x, labels = _clustered(10, 8, 16, 0.6, 1)
    train, val = np.arange(40), np.arange(40, 80)
    choice = choose_postprocessing(x[train], labels[train], x[val], labels[val])
    none = score_self_retrieval(x[val], labels[val])["map@r"]
    assert choice.metrics["map@r"] >= none
    assert any(what.startswith("DBA") for what, _ in choice.tried)
    if choice.whitening is None and choice.dba is None and choice.qe is None:
        assert choice.metrics["map@r"] == pytest.approx(none)
    kept = [value for what, value in choice.tried if what == choice.describe().split(", ")[-1]]
    assert choice.describe() == "none" or kept == [pytest.approx(choice.metrics["map@r"])]
    without = choose_postprocessing(x[train], labels[train], x[val], labels[val], dba=False)
    assert without.dba is None and not any(what.startswith("DBA") for what, _ in without.tried)
    only = choose_postprocessing(x[train], labels[train], x[val], labels[val], ks=(2, 4))
    expansions = [what for what, _ in only.tried if what.startswith(("DBA", "αQE"))]
    assert len(expansions) == 2 * 2 * 3 and all(" k=2 " in w or " k=4 " in w for w in expansions)


def test_the_fitted_pipeline_is_served_only_when_it_beats_the_luck_of_the_validation_classes():
    features = {f"c{i}": {"map@r": 0.5} for i in range(8)}
    steady = {c: {"map@r": 0.52 + 0.001 * i} for i, c in enumerate(features)}  # +0.0235, tiny spread
    noisy = {c: {"map@r": 0.5 + (0.2 if i % 2 else -0.19)} for i, c in enumerate(features)}  # +0.005, se 0.07
    worse = {c: {"map@r": 0.49} for c in features}
    assert served_pipeline(features, steady)[0] == "fitted"
    served, why = served_pipeline(features, noisy)
    assert served == "features" and "+0.0050" in why and "untrained pipeline is served" in why
    assert served_pipeline(features, worse)[0] == "features"
    assert served_pipeline({"a": {"map@r": 0.5}}, {"a": {"map@r": 0.9}})[0] == "features"  # one class: no spread


# ----------------------------------------------------------------------------------------- a whole fit
CLASSES = 6
PER_CLASS = 8


def photo_folder(root: Path) -> Path:
    """SYNTHETIC photos: one colour per class with a random darker square, 48 px JPEGs."""
    rng = np.random.default_rng(0)
    for c in range(CLASSES):
        colour = rng.integers(40, 230, 3)
        for i in range(PER_CLASS):
            pixels = np.tile(colour, (48, 48, 1)).astype(np.uint8)
            x, y = rng.integers(0, 24, 2)
            pixels[y:y + 24, x:x + 24] //= 2
            (root / f"class{c}").mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(root / f"class{c}" / f"p{i}.jpg")
    return root


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
    lines: list[str] = []
    record = fit(photos, root / "run", FitSettings(minutes=0.4, weights=str(pretrained), lrs=(1e-4, 1e-3)),
                 say=lines.append)
    return photos, root / "run", record, lines


def test_a_fit_writes_a_run_folder_with_an_index_of_every_photo(fitted):
    photos, run, record, lines = fitted
    stored = json.loads((run / "fit.json").read_text())
    for key in ("features", "fitted", "chosen", "seconds"):
        assert key in stored
    assert set(stored["features"]) >= {"map@r", "recall@1"} and set(stored["fitted"]) >= {"map@r", "recall@1"}
    assert (run / "classes" / "train.txt").read_text().count("\n") + \
        (run / "classes" / "validation.txt").read_text().count("\n") == CLASSES
    index = Index.load(run)
    assert index_folder(run) == run / "index" and len(index) == CLASSES * PER_CLASS
    assert sorted(Path(p).name for p in index.paths) == sorted(p.name for p in photos.rglob("*.jpg"))
    served = stored["chosen"]["model"]
    assert stored[f"{served}_post"]["map@r"] >= stored["features"]["map@r"]  # never worse than the features
    assert any(line.split("] ")[1].startswith(s) for line in lines for s in ("check:",)) and "finished" in lines[-1]
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
    assert stored["chosen"]["pipeline"].startswith(f"{served} ({words})") and stored["chosen"]["pipeline"] in \
        (run / "report.html").read_text()
    # model.ckpt is the served model; a fine-tuned one not served is kept beside it, and it differs
    kept = stored["chosen"]["fine_tuned_checkpoint"]
    assert kept == ("fine_tuned.ckpt" if served == "features" and stored["chosen"]["from"] != "pretrained" else None)
    assert (run / "fine_tuned.ckpt").is_file() == (kept is not None)
    if stored["chosen"]["from"] != "pretrained":  # a fine-tuned state won: its recipe ran again on every class
        assert stored["refit"]["classes"] == CLASSES and stored["refit"]["photos"] == CLASSES * PER_CLASS
        assert 1 <= stored["refit"]["steps"] <= stored["refit"]["planned_steps"] and "refit" in stored["seconds"]
        assert any("run again on all 6 classes" in why for why in stored["chosen"]["why"])
    else:
        assert "refit" not in stored
    if kept is not None:
        tuned, served_weights = (load_checkpoint(run / name)["model"] for name in (kept, "model.ckpt"))
        assert any(not torch.equal(tuned[k], served_weights[k]) for k in tuned)


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
    from report.conftest import screenshot_stats

    _, run, _, _ = fitted
    colours, spread = screenshot_stats(render_page(run / "report.html"))
    assert colours > 50 and spread > 10  # text, tables and the example photos drawn, not a blank page
    html = (run / "report.html").read_text()
    assert check_page(run / "report.html") == []
    for text in ("Before and after", "pretrained features", "fitted model", "What was chosen", "Time per stage"):
        assert text in html
    stored = json.loads((run / "fit.json").read_text())  # each pipeline's scores per validation class are kept
    assert set(stored["per_class"]) >= {"features", "features_post"} and "± " in \
        next(r for r in html.split("<tr") if "features + post-processing" in r)
    assert (run / "figures" / "examples.png").is_file()


def test_the_report_table_gives_each_pipelines_spread_and_the_gain_the_served_one_was_chosen_by():
    rng = np.random.default_rng(0)
    classes = [f"class{c}" for c in range(5)]

    def scores(level: float) -> dict[str, dict[str, float]]:
        return {c: {"map@r": float(level + rng.uniform(-0.05, 0.05)), "recall@1": 1.0} for c in classes}

    per_class = {"features": scores(0.6), "fitted": scores(0.7), "features_post": scores(0.8), "fitted_post": scores(0.85)}
    served, why = served_pipeline(per_class["features_post"], per_class["fitted_post"])
    record = {key: {"map@r": float(np.mean([c["map@r"] for c in by_class.values()])), "recall@1": 1.0}
              for key, by_class in per_class.items()}
    record.update(per_class=per_class, validation={"classes": 5, "photos": 50},
                  chosen={"model": served, "multiscale": None, "pipeline": f"{served} + DBA"})
    html = validation_table(record, {"features": "DBA k=10 alpha=3", "fitted": "DBA k=10 alpha=1"})
    rows = {r.split("</td>")[0].split(">")[-1]: r for r in html.split("<tr")[2:]}
    assert list(rows) == ["pretrained features", "fitted model", "features + post-processing (DBA k=10 alpha=3)",
                          "fitted + post-processing (DBA k=10 alpha=1)"]
    gain, se = why.split("adds ")[1].split(" mAP@R")[0], why.split("standard error ")[1].split(",")[0]
    assert f"{gain} ± {se}" in rows["fitted + post-processing (DBA k=10 alpha=1)"]  # the decision's own numbers
    fitted = np.array([per_class["fitted"][c]["map@r"] - per_class["features"][c]["map@r"] for c in classes])
    assert f"{fitted.mean():+.4f} ± {fitted.std(ddof=1) / np.sqrt(5):.4f}" in rows["fitted model"]
    post = np.array([per_class["features_post"][c]["map@r"] for c in classes])
    assert f"{post.mean():.4f} ± {post.std(ddof=1):.4f}" in rows["features + post-processing (DBA k=10 alpha=3)"]
    assert "<td>–</td>" in rows["pretrained features"] and "<td>–</td>" in rows["features + post-processing (DBA k=10 alpha=3)"]
    assert 'class="highlight"' in rows[f"{served} + post-processing (DBA k=10 alpha={'1' if served == 'fitted' else '3'})"]


def test_bad_photos_are_refused_before_any_work_naming_each(tmp_path, pretrained):
    photos = photo_folder(tmp_path / "photos")
    (photos / "class0" / "broken.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DatasetProblems, match="broken.jpg"):
        fit(photos, tmp_path / "run", FitSettings(minutes=0.2, weights=str(pretrained)), say=lambda _: None)
    assert not (tmp_path / "run").exists()


def test_an_existing_run_folder_is_never_overwritten(tmp_path, pretrained):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "mine.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not empty"):
        fit(tmp_path / "photos", tmp_path / "run", FitSettings(weights=str(pretrained)), say=lambda _: None)
    assert (tmp_path / "run" / "mine.txt").read_text() == "keep"


def test_too_few_classes_are_refused(tmp_path, pretrained):
    photos = photo_folder(tmp_path / "photos")
    for c in range(3, CLASSES):
        for f in (photos / f"class{c}").iterdir():
            f.unlink()
        (photos / f"class{c}").rmdir()
    with pytest.raises(ValueError, match="at least 4 classes"):
        fit(photos, tmp_path / "run", FitSettings(minutes=0.2, weights=str(pretrained)), say=lambda _: None)


def test_an_oml_csv_gives_every_row_of_every_split(tmp_path):
    from rankopt.fit.photos import read_photos, split_photos

    photos = photo_folder(tmp_path / "photos")
    rows = ["label,path,split"] + [f"c{c},photos/class{c}/p{i}.jpg,{'train' if c < 4 else 'test'}"
                                   for c in range(CLASSES) for i in range(PER_CLASS)]
    (tmp_path / "photos.csv").write_text("\n".join(rows) + "\n")
    dataset = read_photos(tmp_path / "photos.csv", None)
    assert len(dataset) == CLASSES * PER_CLASS and np.unique(dataset.labels[:, 0]).size == CLASSES
    assert split_photos(dataset, 0.2, 0).validation.sum() == 2 * PER_CLASS
    assert photos.is_dir()


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
    train, val = np.flatnonzero(labels < 4), np.flatnonzero(labels >= 4)
    kw = {"device": torch.device("cpu"), "batch_size": 16, "workers": 0}
    before = embed_multiscale(net, dataset, **kw)
    calls: list[int] = []

    def retrained() -> None:  # stands for loading the state retrained on every class
        calls.append(1)
        with torch.no_grad():
            for param in list(net.parameters())[-4:]:
                param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(len(calls))))

    beaten, unbeatable = (PostChoice(None, None, None, {"map@r": v}, []) for v in (-1.0, 2.0))
    trial = try_multiscale(net, dataset, labels, train, val, beaten, dba=True, retrained=retrained, **kw)
    assert calls == [1] and "embedded again with the retrained one" in trial.note
    on_before = choose_postprocessing(before[train], labels[train], before[val], labels[val])
    assert trial.choice is not None and trial.choice.metrics == pytest.approx(on_before.metrics)  # chosen before it
    assert trial.embeddings is not None and not torch.allclose(trial.embeddings, before, atol=1e-3)
    assert torch.allclose(trial.embeddings, embed_multiscale(net, dataset, **kw), atol=1e-5)  # indexed with it
    late = try_multiscale(net, dataset, labels, train, val, beaten, dba=True, retrained=retrained,
                          time_left=lambda: 1.0, pass_s=2.0, **kw)
    assert late.choice is None and late.embeddings is None and "not served: no time left" in late.note
    lost = try_multiscale(net, dataset, labels, train, val, unbeatable, dba=True, retrained=retrained, **kw)
    assert lost.choice is None and "not kept" in lost.note and calls == [1]
    plain = try_multiscale(net, dataset, labels, train, val, beaten, dba=True, **kw)  # no retrained model served
    assert plain.embeddings is not None and torch.allclose(plain.embeddings, embed_multiscale(net, dataset, **kw))
