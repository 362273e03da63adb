"""``rankopt index`` + ``rankopt search`` end to end, and the results page."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from rankopt.cli import main
from rankopt.report.html import check_page

from helpers.checkpoints import write_checkpoint


@pytest.fixture
def index_dir(tmp_path, checkpoint, tree, capsys):
    out = tmp_path / "idx"
    assert main(["index", str(checkpoint), "--images", str(tree), "--out", str(out), "--device", "cpu",
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "12 items (4 classes, levels class, level1), 16-d cosine, fingerprint " in printed and "exact" in printed
    assert f"saved {out}" in printed
    return out


def test_index_then_search_with_json_and_html(index_dir, queries, tmp_path, capsys, render_page):
    out_json, out_html = tmp_path / "res.json", tmp_path / "page" / "res.html"
    assert main(["search", str(index_dir), str(queries), "--top-k", "5", "--json", str(out_json),
                 "--html", str(out_html), "--device", "cpu", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"query .*alpha/one/q.png \(label alpha/one\)\n\s*rank\s+score\s+id\s+label\s+path\n\s*1 ", printed)
    records = json.loads(out_json.read_text())
    assert [r.get("query_label") for r in records] == ["alpha/one", "beta/four", None]
    assert all(len(r["results"]) == 5 and [x["rank"] for x in r["results"]] == [1, 2, 3, 4, 5] for r in records)
    assert all(r["results"][0]["score"] >= r["results"][-1]["score"] for r in records)
    # the page: valid, offline, thumbnails of its own (never the user's originals), frames by relevance
    assert check_page(out_html) == []
    text = out_html.read_text()
    sources = re.findall(r'<img src="([^"]+)"', text)
    assert len(sources) == 3 * 6 and all(s.startswith("res_files/") for s in sources)
    assert str(queries) not in " ".join(sources) and "<script" not in text
    assert "#2ca02c" in text and "#8c959f" in text  # green (same class) and grey (unknown query label)
    moved = tmp_path / "moved"
    shutil.copytree(out_html.parent, moved)
    assert check_page(moved / "res.html") == []
    render_page(moved / "res.html", tmp_path / "res.png", size=(1280, 1400))


def test_index_of_a_dataset_split(tmp_path, checkpoint, tree, capsys):
    out = tmp_path / "idx"
    assert main(["index", str(checkpoint), "--dataset", "image_folder", "--root", str(tree), "--split", "all",
                 "--out", str(out), "--faiss", "Flat", "--no-progress"]) == 0
    assert "12 items (4 classes" in capsys.readouterr().out
    assert json.loads((out / "index.json").read_text())["faiss"]["spec"] == "Flat"


def test_search_errors_are_one_line(index_dir, queries, tmp_path, capsys):
    other = write_checkpoint(tmp_path / "other.ckpt", seed=3)
    assert main(["search", str(index_dir), str(queries), "--checkpoint", str(other), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "the weights differ" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert main(["search", str(index_dir), str(tmp_path / "nope.png")]) == 1
    assert "nope.png" in capsys.readouterr().err
    assert main(["search", str(tmp_path / "no_index"), str(queries)]) == 1
    assert "no_index" in capsys.readouterr().err
    assert main(["index", str(other), "--images", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 1
    assert "missing" in capsys.readouterr().err and not (tmp_path / "x").exists()
