"""``rankopt compare`` on hand-built finished run folders: 3 losses x 3 seeds with known metrics."""

from __future__ import annotations

import csv
import json
import math
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import stats as sps

from rankopt.cli import main
from rankopt.config import load_config, save_config
from rankopt.report import compare_runs, load_run, markdown_tables, write_comparison
from rankopt.report.html import check_page
from rankopt.viz.comparison import GroupNeighbours, mean_curve, plot_retrieval_rows

LOSSES = ("smooth_ap", "roadmap", "fastap")
SEEDS = (0, 1, 2)
BASE = {"smooth_ap": (0.60, 0.30), "roadmap": (0.63, 0.33), "fastap": (0.59, 0.29)}
"""(recall@1, map@r) of each loss before the per-seed offsets."""
SEED_SHIFT = {0: 0.000, 1: 0.010, 2: -0.006}
JITTER = np.array([[0.001, -0.002, 0.0015], [0.003, 0.0005, -0.001], [-0.002, 0.001, 0.0]])
"""Per (loss, seed): keeps the paired differences from being constant."""
NUM_IMAGES = 12
TOP_K = 5


def metric_values(loss: str, seed: int) -> dict[str, float]:
    jitter = JITTER[LOSSES.index(loss) if loss in LOSSES else 0, seed % 3]
    r1, mapr = BASE.get(loss, BASE["smooth_ap"])
    return {"recall@1": r1 + SEED_SHIFT.get(seed, 0.004) + jitter, "map@r": mapr + SEED_SHIFT.get(seed, 0.004) / 2 - jitter}


def write_images(root: Path) -> list[str]:
    """12 small PNGs of 4 fine classes (3 each) in 2 coarse classes: files, 2 zip members, 1 missing."""
    folder = root / "images"
    folder.mkdir()
    paths = []
    with zipfile.ZipFile(root / "images.zip", "w") as archive:
        for i in range(NUM_IMAGES):
            fine = i // 3
            colour = [(120, 80, 160), (40, 140, 150), (150, 110, 70), (90, 100, 120)][fine]  # no frame colour
            image = Image.new("RGB", (24, 24), colour)
            image.paste((255, 255, 255), (4 + i % 3 * 5, 8, 10 + i % 3 * 5, 16))
            if i in (4, 5):
                name = f"img{i:02d}.png"
                with archive.open(name, "w") as member:
                    image.save(member, format="PNG")
                paths.append(str(root / "images.zip" / name))
            elif i == 7:
                paths.append(str(folder / "gone.png"))  # never written: drawn as "missing"
            else:
                image.save(folder / f"img{i:02d}.png")
                paths.append(str(folder / f"img{i:02d}.png"))
    return paths


def write_run(root: Path, loss: str, seed: int, images: list[str] | None, *, overrides: tuple[str, ...] = (),
              name: str | None = None, finished: bool = True) -> Path:
    run = root / (name or f"{loss}-s{seed}")
    run.mkdir(parents=True)
    save_config(load_config("default", [f"loss.name={loss}", f"train.seed={seed}", *overrides]), run / "config.yaml")
    final = metric_values(loss, seed)
    history = [{"epoch": e, "step": 10 * e, "loss": math.nan if e == 0 else 1.0 - 0.1 * e + 0.01 * seed,
                **{m: v * (0.5 + e / 4) for m, v in final.items()}, "num_queries": NUM_IMAGES} for e in range(3)]
    (run / "metrics.json").write_text(json.dumps(history))
    if not finished:
        return run
    report = {"name": "default", "dataset": "synthetic", "epochs": 2, "steps": 20,
              "untrained": history[0], "trained": {**final, "num_queries": NUM_IMAGES, "num_queries_without_positive": 0},
              "best": {"metric": "map@r", "value": 0.99, "epoch": 1}, "data": {"level_names": ["shape", "family"]}}
    (run / "report.json").write_text(json.dumps(report))
    if images is not None:
        labels = np.stack([np.arange(NUM_IMAGES) // 3, np.arange(NUM_IMAGES) // 6], axis=1).astype(np.int64)
        shift = LOSSES.index(loss) + 1 if loss in LOSSES else 1
        neighbours = np.array([[(i + shift * (c + 1)) % NUM_IMAGES for c in range(TOP_K)] for i in range(NUM_IMAGES)])
        np.savez(run / "retrieval.npz", query_paths=np.array(images), query_labels=labels, ref_paths=np.array(images),
                 ref_labels=labels, neighbours=neighbours.astype(np.int64),
                 scores=np.sort(np.random.default_rng(seed).random((NUM_IMAGES, TOP_K)), axis=1)[:, ::-1].astype(np.float32),
                 self_retrieval=np.array(True))
    return run


@pytest.fixture
def runs(tmp_path) -> list[Path]:
    images = write_images(tmp_path)
    return [write_run(tmp_path / "runs", loss, seed, images) for loss in LOSSES for seed in SEEDS]


def read_csv(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    with open(path, newline="") as f:
        return {(row["group"], row["metric"]): row for row in csv.DictReader(f)}


def test_means_and_stds_in_csv(runs, tmp_path):
    comparison = compare_runs(runs, baseline="smooth_ap")
    assert list(comparison.groups) == ["smooth_ap", "fastap", "roadmap"]  # baseline first, then sorted
    assert comparison.metrics == ("recall@1", "map@r")  # report order; num_* counts and "best" are not metrics
    rows = read_csv(write_comparison(comparison, tmp_path / "out")["csv"])
    assert len(rows) == 6
    for loss in LOSSES:
        for metric in ("recall@1", "map@r"):
            values = np.array([metric_values(loss, s)[metric] for s in SEEDS])
            row = rows[(loss, metric)]
            assert int(row["n"]) == 3
            assert float(row["mean"]) == pytest.approx(values.mean(), abs=1e-12)
            assert float(row["std"]) == pytest.approx(values.std(ddof=1), abs=1e-12)
    assert rows[("smooth_ap", "recall@1")]["diff_to_baseline"] == ""  # the baseline row has no difference


def test_paired_differences_match_scipy(runs, tmp_path):
    comparison = compare_runs(runs, baseline="smooth_ap", confidence=0.9)
    rows = read_csv(write_comparison(comparison, tmp_path / "out")["csv"])
    for loss in ("roadmap", "fastap"):
        for metric in ("recall@1", "map@r"):
            a = np.array([metric_values(loss, s)[metric] for s in SEEDS])
            b = np.array([metric_values("smooth_ap", s)[metric] for s in SEEDS])
            d = a - b
            low, high = sps.t.interval(0.9, 2, loc=d.mean(), scale=sps.sem(d))
            row = rows[(loss, metric)]
            assert int(row["n_pairs"]) == 3
            assert float(row["diff_to_baseline"]) == pytest.approx(d.mean())
            assert (float(row["ci_low"]), float(row["ci_high"])) == (pytest.approx(low), pytest.approx(high))
            assert float(row["p_value"]) == pytest.approx(sps.ttest_rel(a, b).pvalue)
            assert float(row["wilcoxon_p"]) == pytest.approx(sps.wilcoxon(d).pvalue)


def test_unmatched_seeds_are_left_out_and_counted(runs, tmp_path):
    images = None
    extra = [write_run(tmp_path / "runs", "roadmap", 7, images), write_run(tmp_path / "runs", "smooth_ap", 9, images)]
    comparison = compare_runs(runs + extra, baseline="smooth_ap")
    assert comparison.summaries["roadmap"]["recall@1"].n == 4 and comparison.summaries["smooth_ap"]["recall@1"].n == 4
    pairing = comparison.pairings["roadmap"]
    assert pairing.n_pairs == 3
    assert sorted(r.name for r in pairing.unpaired) == ["roadmap-s7", "smooth_ap-s9"]
    assert [a.value("train.seed") for a, _ in pairing.pairs] == [0, 1, 2]
    d = [metric_values("roadmap", s)["map@r"] - metric_values("smooth_ap", s)["map@r"] for s in SEEDS]
    assert comparison.differences["roadmap"]["map@r"].mean == pytest.approx(np.mean(d))
    assert "roadmap: 2 run(s) left out of the pairing with smooth_ap" in markdown_tables(comparison)
    assert "fastap: 1 run(s) left out of the pairing with smooth_ap" in markdown_tables(comparison)
    paths = write_comparison(comparison, tmp_path / "out")
    assert int(read_csv(paths["csv"])[("roadmap", "map@r")]["n_pairs"]) == 3
    html = paths["html"].read_text()
    assert "2 run(s) left out of the pairing" in html and "roadmap-s7" in html


def test_no_common_seed_gives_no_difference(tmp_path):
    runs = [write_run(tmp_path, "smooth_ap", 0, None), write_run(tmp_path, "roadmap", 1, None)]
    comparison = compare_runs(runs, baseline="smooth_ap")
    assert comparison.pairings["roadmap"].n_pairs == 0
    assert comparison.differences["roadmap"]["recall@1"] is None
    paths = write_comparison(comparison, tmp_path / "out")
    assert read_csv(paths["csv"])[("roadmap", "recall@1")]["n_pairs"] == "0"
    assert check_page(paths["html"]) == []


def test_group_by_two_keys(tmp_path):
    runs = [write_run(tmp_path, "roadmap", s, None, overrides=(f"loss.kwargs.lam={lam}",), name=f"roadmap-{lam}-{s}")
            for lam in (0.5, 0.1) for s in (0, 1)]
    runs += [write_run(tmp_path, "smooth_ap", s, None) for s in (0, 1)]
    comparison = compare_runs(runs, by=["loss.name", "loss.kwargs.lam"], baseline="name=smooth_ap, lam=unset")
    assert list(comparison.groups) == ["name=smooth_ap, lam=unset", "name=roadmap, lam=0.1", "name=roadmap, lam=0.5"]
    assert all(len(rs) == 2 for rs in comparison.groups.values())
    assert comparison.pairings["name=roadmap, lam=0.1"].n_pairs == 2
    # a single key gives bare values; the one-key label of these runs mixes both lam values
    assert list(compare_runs(runs, by="loss.name").groups) == ["roadmap", "smooth_ap"]
    with pytest.raises(ValueError, match="'loss.kwargs.lambda' is in no run"):
        compare_runs(runs, by=["loss.name", "loss.kwargs.lambda"])


def test_unfinished_runs_skipped_with_warning(runs, tmp_path, capsys):
    unfinished = write_run(tmp_path / "runs", "roadmap", 5, None, finished=False)
    with pytest.warns(UserWarning, match=r"skipped 1 unfinished run\(s\).*roadmap-s5"):
        comparison = compare_runs([*runs, unfinished])
    assert comparison.skipped == (unfinished,)
    assert len(comparison.runs) == 9
    assert main(["compare", *map(str, runs), str(unfinished), "--out", str(tmp_path / "out")]) == 0
    assert "warning: skipped 1 unfinished run(s)" in capsys.readouterr().err
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="none of the 1 run folder"):
        compare_runs([unfinished])


def test_last_evaluation_not_best(runs):
    comparison = compare_runs(runs)
    # report.json "best" says 0.99: never used
    assert comparison.summaries["roadmap"]["map@r"].max < 0.5
    assert comparison.baseline is None and comparison.differences == {}


def test_load_run_errors_name_the_file(runs, tmp_path):
    run = runs[0]
    assert load_run(run).retrieval == run / "retrieval.npz"
    (run / "report.json").write_text("{not json")
    with pytest.raises(ValueError, match=re.escape(str(run / "report.json")) + " is not valid JSON"):
        load_run(run)
    (runs[1] / "metrics.json").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape(str(runs[1])) + " has no metrics.json"):
        load_run(runs[1])
    (runs[2] / "config.yaml").write_text("- a list\n- not a mapping\n")
    with pytest.raises(ValueError, match="config.yaml must hold a dict"):
        load_run(runs[2])
    (runs[3] / "report.json").write_text(json.dumps({"trained": {"num_queries": 3}}))
    with pytest.raises(ValueError, match="report.json is corrupt: no 'trained' metrics"):
        load_run(runs[3])
    with pytest.raises(ValueError, match="is not a rankopt run folder"):
        load_run(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run(tmp_path / "nowhere")


def test_metrics_argument(runs):
    assert compare_runs(runs, metrics=["map@r"]).metrics == ("map@r",)
    with pytest.raises(ValueError, match=r"no metric 'recall@4'.*has: recall@1, map@r"):
        compare_runs(runs, metrics=["recall@4"])


def test_markdown_tables(runs, tmp_path):
    comparison = compare_runs(runs, baseline="smooth_ap")
    text = write_comparison(comparison, tmp_path / "out")["md"].read_text()
    assert text == markdown_tables(comparison)
    lines = text.splitlines()
    assert lines[0] == "| loss.name | runs | recall@1 | map@r |"
    assert lines[1] == "| --- | --- | --- | --- |"
    r1 = np.array([metric_values("roadmap", s)["recall@1"] for s in SEEDS])
    # roadmap has the best means: bold
    assert f"| roadmap | 3 | **{r1.mean():.4f} ± {r1.std(ddof=1):.4f}** |" in text
    assert lines[2].startswith("| smooth_ap (baseline) | 3 | ")
    diff_row = next(line for line in lines if line.startswith("| roadmap | 3 | ") and "[" in line)
    d = comparison.differences["roadmap"]["recall@1"]
    cell = f"{d.mean:+.4f} [{d.ci_low:+.4f}, {d.ci_high:+.4f}] p={d.p_value:.3f}"
    assert (f"**{cell}**" if d.p_value < 0.05 else cell) in diff_row
    assert re.search(r"\| fastap \| 3 \| \*{0,2}-0\.\d{4} \[[-+]0\.\d{4}, [-+]0\.\d{4}\] p=0\.\d{3}", text)


def test_page_checks_and_figures(runs, tmp_path):
    paths = write_comparison(compare_runs(runs, baseline="smooth_ap"), tmp_path / "out", grid_queries=3, grid_top_k=4)
    assert set(paths) == {"csv", "md", "html", "learning_curves", "retrieval_rows"}
    assert check_page(paths["html"]) == []
    html = paths["html"].read_text()
    images = re.findall(r'<img src="([^"]+)"', html)
    assert sorted(images) == ["figures/learning_curves.png", "figures/retrieval_rows.png"]
    for src in images:
        with Image.open(paths["html"].parent / src) as image:
            assert image.format == "PNG"
            image.load()
    for text in ("Setup", "Results", "Differences to smooth_ap", "Learning curves", "Retrieval",
                 "config keys held fixed", "loss.name", "train.seed", "<strong>"):
        assert text in html
    # the grid has one row per group under each of the 3 queries (1.2-inch cells at 100 dpi)
    with Image.open(paths["retrieval_rows"]) as grid:
        assert grid.size[1] > 3 * 3 * 120


def test_grid_seed_and_lacking_queries(runs, tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    other_images = [str(other / f"x{i}.png") for i in range(NUM_IMAGES)]
    fastap_other = write_run(tmp_path / "runs2", "fastap", 4, other_images)
    comparison = compare_runs([*runs[:6], fastap_other], baseline="smooth_ap")
    paths = write_comparison(comparison, tmp_path / "out", grid_seed=1)
    html = paths["html"].read_text()
    assert "fastap: no run with train.seed=1 has a retrieval.npz" in html
    assert "retrieval_rows" in paths
    paths = write_comparison(comparison, tmp_path / "out2")
    assert "fastap: its retrieval.npz lacks the drawn queries" in paths["html"].read_text()
    assert check_page(paths["html"]) == []


def test_retrieval_rows_missing_image_is_grey(tmp_path):
    good = tmp_path / "a.png"
    Image.new("RGB", (20, 20), (0, 0, 255)).save(good)
    group = GroupNeighbours("g", [[str(tmp_path / "gone.png")]], np.array([[2]]), np.array([[0.9]]))
    out = plot_retrieval_rows(tmp_path / "rows.png", [str(good)], [group], num_levels=2)
    pixels = np.asarray(Image.open(out).convert("RGB")).reshape(-1, 3)
    assert (np.abs(pixels.astype(int) - 209).max(axis=1) < 3).sum() > 1000  # the grey "missing" cell
    assert ((pixels[:, 2] > 200) & (pixels[:, 0] < 50)).sum() > 1000  # the blue query image


def test_mean_curve():
    histories = [[{"epoch": 0, "loss": math.nan, "map@r": 0.1}, {"epoch": 1, "loss": 1.0, "map@r": 0.3}],
                 [{"epoch": 0, "loss": math.nan, "map@r": 0.2}, {"epoch": 1, "loss": 2.0, "map@r": 0.5}]]
    curve = mean_curve(histories, "map@r")
    assert curve.x.tolist() == [0.0, 1.0] and curve.mean == pytest.approx([0.15, 0.4])
    assert curve.std == pytest.approx([np.std([0.1, 0.2], ddof=1), np.std([0.3, 0.5], ddof=1)])
    loss = mean_curve(histories, "loss")
    assert loss.x.tolist() == [1.0] and loss.mean.tolist() == [1.5]
    assert mean_curve(histories, "recall@1") is None


def test_cli(runs, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["compare", *map(str, runs), "--baseline", "smooth_ap", "--out", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert "| loss.name | runs | recall@1 | map@r |" in stdout
    assert f"html: {out / 'compare.html'}" in stdout and f"csv: {out / 'compare.csv'}" in stdout
    assert (out / "compare.md").is_file()

    assert main(["compare", "--out", str(out)]) == 1
    assert "no run folder given" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "nowhere"), "--out", str(out)]) == 1
    assert f"run folder {tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err
    assert main(["compare", *map(str, runs), "--baseline", "triplet", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "baseline 'triplet' is not a group of loss.name; groups: fastap, roadmap, smooth_ap" in err


def test_render_screenshot(runs, tmp_path, render_page):
    page = write_comparison(compare_runs(runs, baseline="smooth_ap"), tmp_path / "out")["html"]
    shot = render_page(page, size=(1280, 3200))  # asserts the screenshot is not blank
    with Image.open(shot) as image:
        assert image.size == (1280, 3200)


def test_best_groups_include_ties(tmp_path):
    runs = [write_run(tmp_path, loss, 0, None) for loss in ("smooth_ap", "roadmap")]
    for run in runs:
        report = json.loads((run / "report.json").read_text())
        report["trained"]["recall@1"] = 0.5
        (run / "report.json").write_text(json.dumps(report))
    comparison = compare_runs(runs)
    assert comparison.best_groups("recall@1") == ("roadmap", "smooth_ap")
    assert markdown_tables(comparison).count("**0.5000**") == 2
