"""``write_run_report`` and ``rankopt report`` on hand-made run folders (no training)."""

from __future__ import annotations

import inspect
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from rankopt.cli import main
from rankopt.report import check_page, png_problem, read_run, surrogates_for, write_run_report

from .conftest import BEST_EPOCH, build_run

SECTIONS = ("what-was-run", "metrics", "training-curves", "retrieval", "ap-per-level", "surrogate")
NEW_FIGURES = ("loss_terms.png", "learning_rates.png", "metrics_per_eval.png", "ap_per_level.png", "surrogates.png")


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.sources.append(dict(attrs)["src"])


def images_of(page: Path) -> list[str]:
    parser = _Images()
    parser.feed(page.read_text())
    return parser.sources


def section_text(page: Path, anchor: str) -> str:
    match = re.search(rf'<section id="{anchor}">(.*?)</section>', page.read_text(), re.S)
    assert match, f"no section {anchor}"
    return match.group(1)


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Path:
    run = build_run(tmp_path_factory.mktemp("full") / "run")
    write_run_report(run)
    return run


def test_page_has_every_section_in_order_and_passes_the_check(full_run):
    page = full_run / "report.html"
    text = page.read_text()
    positions = [text.index(f'<section id="{a}">') for a in SECTIONS]
    assert positions == sorted(positions)
    assert check_page(page) == []
    assert "SYNTHETIC data" in text and "<script" not in text
    for name in NEW_FIGURES:
        assert f'src="figures/{name}"' in text, name
    sources = images_of(page)
    assert len(sources) == 8
    for src in sources:
        assert (full_run / src).is_file() and png_problem(full_run / src) is None


def test_what_was_run_lists_data_model_loss_and_timing(full_run):
    text = section_text(full_run / "report.html", "what-was-run")
    for expected in ("rankopt train default loss.name=roadmap", "convnet_small", "147,648", "roadmap",
                     "adam", "1,280 images/s", "1 min 35 s", "classes: family", "Linux-test"):
        assert expected in text, expected


def test_metrics_table_marks_the_best_epoch(full_run):
    text = section_text(full_run / "report.html", "metrics")
    header = re.search(r"<thead>(.*?)</thead>", text, re.S).group(1)
    cells = re.findall(r"<th[^>]*>(.*?)</th>", header)
    assert cells == ["metric", "untrained (epoch 0)", "epoch 2", f"epoch {BEST_EPOCH} ★ best", "epoch 6",
                     "change (last − untrained)"]
    assert f'<th class="num highlight">epoch {BEST_EPOCH} ★ best</th>' in header
    assert "queries without a positive" in text and "0.1100" in text


def test_report_json_keeps_its_keys_and_lists_the_new_figures(full_run):
    report = json.loads((full_run / "report.json").read_text())
    assert {"kind", "untrained", "trained", "best", "data", "model", "loss", "machine"} <= set(report)
    names = [Path(f).name for f in report["figures"]]
    assert names[:4] == ["retrieval_grid.png", "pr_curves.png", "embedding_map.png", "training_curves.png"]
    assert set(NEW_FIGURES) <= set(names) and len(names) == len(set(names))
    write_run_report(full_run)  # rebuilding does not list a figure twice
    assert len(json.loads((full_run / "report.json").read_text())["figures"]) == len(names)


@pytest.mark.parametrize("loss, expected", [
    ("smooth_ap", "σ(d/τ)"), ("roadmap", "SupRank"), ("fastap", "11 triangular"), ("triplet", "no rank surrogate"),
])
def test_surrogate_figure_for_each_kind_of_loss(make_run, loss, expected):
    run = make_run(loss=loss, steps=True)
    write_run_report(run)
    text = section_text(run / "report.html", "surrogate")
    assert expected in text
    assert png_problem(run / "figures" / "surrogates.png") is None
    assert "5–95% in [" in text


def test_surrogates_read_defaults_from_the_loss_signatures():
    from rankopt.losses import SmoothAPLoss, SupRankLoss
    from rankopt.rank.surrogates import default_delta

    tau = inspect.signature(SmoothAPLoss).parameters["tau"].default
    spec = surrogates_for("smooth_ap", {})
    assert f"τ = {tau:g}" in spec.description and spec.zoom == pytest.approx(3 * default_delta(tau))
    assert spec.surrogates[0].function(np.array([0.0]))[0] == pytest.approx(0.5)
    assert "τ = 0.05" in surrogates_for("smooth_ap", {"tau": 0.05}).description

    rho = inspect.signature(SupRankLoss).parameters["rho"].default
    sup = surrogates_for("happier", {"tau": 0.02})
    assert f"ρ = {rho:g}" in sup.description and "τ = 0.02" in sup.description
    d = np.linspace(-0.5, 0.5, 201)
    assert np.all(sup.surrogates[0].function(d) >= (d >= 0) - 1e-12)  # H⁻ bounds the step from above

    soft = surrogates_for("softbin_ap", {"num_bins": 5}).surrogates[0].function(np.linspace(-1, 1, 101))
    assert soft[0] == pytest.approx(0.0) and soft[-1] == pytest.approx(1.0) and np.all(np.diff(soft) >= -1e-12)
    assert "margin" in surrogates_for("blackbox_ap", {}).description
    assert not surrogates_for("contrastive", {}).surrogates


def test_missing_steps_csv_is_said_not_fatal(make_run):
    run = make_run(steps=False)
    page = write_run_report(run)
    text = section_text(page, "training-curves")
    assert "No per-step log" in text and "training_curves.png" in text
    assert not (run / "figures" / "loss_terms.png").exists()
    assert "[−1, 1]" in section_text(page, "surrogate")
    assert check_page(page) == []


def test_steps_without_difference_columns_fall_back_to_unit_range(make_run):
    page = write_run_report(make_run(diffs=False))
    assert "diff/q01" in section_text(page, "surrogate") and check_page(page) == []


def test_evaluate_run_has_one_column_and_no_training(make_run):
    run = make_run(kind="evaluate")
    page = write_run_report(run)
    metrics = section_text(page, "metrics")
    assert "evaluation (epoch 6)" in metrics and "★" not in metrics
    assert 'id="training-curves"' not in page.read_text()  # nothing was trained
    assert "How the checkpoint was trained" in section_text(page, "what-was-run")
    assert check_page(page) == []


class _Rows(HTMLParser):
    """The cell texts of each row of the table captioned ``caption``."""

    def __init__(self, caption: str) -> None:
        super().__init__()
        self.caption, self.rows, self.inside, self.in_caption, self.text = caption, [], False, False, ""

    def handle_starttag(self, tag, attrs):
        if tag == "caption":
            self.in_caption, self.text = True, ""
        elif tag == "tr" and self.inside:
            self.rows.append([])
        elif tag in ("td", "th"):
            self.text = ""

    def handle_endtag(self, tag):
        if tag == "caption":
            self.in_caption, self.inside = False, self.text == self.caption
        elif tag == "table":
            self.inside = False
        elif tag in ("td", "th") and self.inside:
            self.rows[-1].append(self.text)

    def handle_data(self, data):
        self.text += data


def test_per_category_table_under_the_metrics(make_run):
    """``by_category`` of the last metrics.json record: one row per category, then the overall row."""
    run = make_run(kind="evaluate")
    records = json.loads((run / "metrics.json").read_text())
    by_category = {"bags & co": {"recall@1": 0.25, "map@r": 0.125, "map": 0.5, "num_queries": 4, "num_queries_without_positive": 1},
                   "shoes": {"recall@1": 0.75, "map@r": None, "map": 0.0625, "num_queries": 12, "num_queries_without_positive": 0}}
    records[-1]["by_category"] = by_category
    (run / "metrics.json").write_text(json.dumps(records))
    page = write_run_report(run)
    parser = _Rows("Per query category (last evaluation)")
    parser.feed(section_text(page, "metrics"))
    last = records[-1]
    names = parser.rows[0][3:]  # the metrics of the main table (ap@level{c}: none per category here)
    assert parser.rows[0][:3] == ["category", "queries", "without a positive"] and names[:3] == ["recall@1", "map@r", "map"]
    missing = ["–"] * (len(names) - 3)
    assert parser.rows[1:] == [
        ["bags & co", "4", "1", "0.2500", "0.1250", "0.5000", *missing],
        ["shoes", "12", "0", "0.7500", "–", "0.0625", *missing],
        ["overall", str(last["num_queries"]), str(last["num_queries_without_positive"]), *[f"{last[m]:.4f}" for m in names]],
    ]
    assert "bags &amp; co" in page.read_text() and check_page(page) == []
    del records[-1]["by_category"]
    (run / "metrics.json").write_text(json.dumps(records))
    assert "Per query category" not in write_run_report(run).read_text()


def test_run_stopped_before_its_first_evaluation(make_run):
    run = make_run(figures=False)
    for name in ("metrics.json", "metrics.csv", "report.json"):
        (run / name).unlink()
    page = write_run_report(run)
    assert "stopped before its first evaluation" in section_text(page, "metrics")
    assert "No retrieval grid" in section_text(page, "retrieval")
    assert (run / "figures" / "loss_terms.png").is_file()
    assert check_page(page) == []
    assert not (run / "report.json").exists()


def test_flat_labels_and_missing_level_metrics(make_run):
    page = write_run_report(make_run("flat", levels=1))
    assert "Flat labels" in section_text(page, "ap-per-level")
    page = write_run_report(make_run("no_levels", flat_ap=True))
    assert "add ap@level0" in section_text(page, "ap-per-level")


def test_older_run_without_new_files(make_run):
    run = make_run(steps=False)
    (run / "run.json").unlink()
    report = json.loads((run / "report.json").read_text())
    for key in ("data", "model", "loss", "machine", "kind", "images_per_second", "wall_seconds"):
        report.pop(key)
    (run / "report.json").write_text(json.dumps(report))
    page = write_run_report(run)
    assert "no per-split image and class counts" in section_text(page, "what-was-run")
    assert "SupRank" in section_text(page, "surrogate")  # loss name from config.yaml
    assert check_page(page) == []


def test_bad_input_names_the_problem(tmp_path, make_run):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        write_run_report(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a rankopt run folder"):
        write_run_report(tmp_path / "empty")
    run = make_run()
    (run / "metrics.json").write_text('[{"epoch": 0,')
    with pytest.raises(ValueError, match="metrics.json"):
        read_run(run)
    (run / "metrics.json").write_text('{"epoch": 0}')
    with pytest.raises(ValueError, match="metrics.json must hold a list"):
        read_run(run)
    (run / "metrics.json").unlink()
    (run / "steps.csv").write_text("step,loss\n1,abc\n")
    with pytest.raises(ValueError, match="steps.csv"):
        read_run(run)


def test_cli_report_and_check(make_run, capsys):
    run = make_run()
    assert main(["report", str(run), "--check"]) == 0
    assert capsys.readouterr().out.strip() == str(run / "report.html")
    (run / "figures" / "pr_curves.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    assert main(["report", str(run), "--check"]) == 1
    assert "pr_curves.png" in capsys.readouterr().err
    assert main(["report", str(run.parent / "absent")]) == 1


def test_retrieval_colours_say_same_coarser_unrelated():
    from matplotlib.colors import to_hex

    from rankopt.viz.pictures import level_colour, level_name

    assert to_hex(level_colour(3, 3)) == "#2ca02c" and to_hex(level_colour(0, 3)) == "#d62728"
    oranges = [to_hex(level_colour(lv, 3)) for lv in (1, 2)]
    assert len(set(oranges)) == 2 and all(int(c[1:3], 16) > 0xd0 and int(c[5:7], 16) < 0x70 for c in oranges)
    names = ["variant", "shape", "family"]
    assert [level_name(lv, 3, names) for lv in (3, 2, 1, 0)] == [
        "same variant", "same shape, other variant", "same family, other shape", "unrelated"]


def test_screenshot_is_not_blank(full_run, render_page):
    shot = render_page(full_run / "report.html")
    assert png_problem(shot) is None


def test_the_surrogate_figure_reads_a_combinations_rank_term():
    from rankopt.report.loss_surrogates import surrogates_for

    for kwargs in ({"sup_ap": {"tau": 0.05}}, {"tau": 0.05}):  # per-term map, or flat (routed to the rank term)
        assert "τ=0.05" in surrogates_for("roadmap", kwargs).surrogates[0].label
    assert "τ=0.01" in surrogates_for("roadmap", {}).surrogates[0].label  # SupAP's default
