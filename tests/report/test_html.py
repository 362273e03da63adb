"""The HTML primitives and the page checker of rankopt.report.html."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from rankopt.report import html
from rankopt.report.html import check_page, escape, figure, key_values, page, section, table, write_page

from .conftest import tiny_png


def test_escape_and_raw():
    assert escape('<a href="x">&') == "&lt;a href=&quot;x&quot;&gt;&amp;"
    assert escape(html.Raw("<b>x</b>")) == "<b>x</b>"
    assert section("A <b>", html.Raw("<p>ok</p>")).count("<p>ok</p>") == 1
    assert "&lt;b&gt;" in section("A <b>", "")


def test_table_formats_numbers_and_marks_rows_and_columns():
    out = table(["metric", "a", "b"], [["map", 0.123456, None], ["n", 12345, float("nan")], ["lr", 1e-5, np.float32(2.5)]],
                highlight_rows=[1], highlight_columns=[2], caption="x<y", digits=3)
    assert "<caption>x&lt;y</caption>" in out
    assert '<td class="num">0.123</td>' in out
    assert "12,345" in out and "1e-05" in out and "2.500" in out
    assert out.count(html.DASH) == 2
    assert '<tr class="highlight">' in out and out.count("<tr") == 4
    assert '<th class="num highlight">b</th>' in out
    assert '<td>map</td>' in out  # text columns stay left-aligned


def test_format_value():
    assert html.format_value(True) == "yes"
    assert html.format_value(None) == html.DASH
    assert html.format_value(math.inf) == "∞"
    assert html.format_value(0.5, None) == "0.5"
    assert html.format_value(3e8) == "3e+08"
    assert html.format_value("text") == "text"


def test_page_is_self_contained(tmp_path):
    body = [section("First part", key_values([("k", 1.5), ("v", None)])),
            section("Second", figure("f.png", "a caption", width="50%"), intro="intro <text>")]
    doc = page("Title & co", body, subtitle="sub")
    assert doc.startswith("<!DOCTYPE html>") and "<style>" in doc
    assert "<script" not in doc and "http://" not in doc and "https://" not in doc
    assert 'href="#first-part"' in doc and 'id="second"' in doc
    assert "font-variant-numeric: tabular-nums" in doc and "@media print" in doc
    tiny_png(tmp_path / "sub" / "f.png")
    out = write_page(tmp_path / "sub" / "p.html", doc)
    assert out.read_text() == doc and check_page(out) == []
    assert sorted(p.name for p in out.parent.iterdir()) == ["f.png", "p.html"]  # no temporary file left


def _page_with(tmp_path: Path, snippet: str) -> Path:
    return write_page(tmp_path / "page.html", page("t", [section("s", html.Raw(snippet))]))


def test_check_page_catches_missing_and_corrupt_files(tmp_path):
    path = _page_with(tmp_path, '<img src="figures/missing.png" alt=""><a href="nothing.csv">x</a>')
    problems = check_page(path)
    assert any("missing.png" in p for p in problems) and any("nothing.csv" in p for p in problems)

    good = tiny_png(tmp_path / "good.png")
    (tmp_path / "corrupt.png").write_bytes(good.read_bytes()[:60])
    (tmp_path / "fake.png").write_bytes(b"GIF89a not a png")
    path = _page_with(tmp_path, '<img src="good.png" alt=""><img src="corrupt.png" alt=""><img src="fake.png" alt="">')
    problems = check_page(path)
    assert len(problems) == 2, problems
    assert any("corrupt.png" in p for p in problems) and any("fake.png" in p and "signature" in p for p in problems)


def test_png_problem_checks_the_header(tmp_path):
    good = tiny_png(tmp_path / "good.png")
    assert html.png_problem(good) is None
    data = bytearray(good.read_bytes())
    data[16:20] = b"\x00\x00\x00\x00"  # width 0
    (tmp_path / "zero.png").write_bytes(bytes(data))
    assert "empty size" in html.png_problem(tmp_path / "zero.png")


@pytest.mark.parametrize("snippet", [
    '<script src="https://cdn.example.com/x.js"></script>',
    "<script>alert(1)</script>",
    '<img src="https://example.com/a.png" alt="">',
    '<link rel="stylesheet" href="http://example.com/a.css">',
    '<div style="background: url(https://example.com/a.png)">x</div>',
    "<style>@import 'https://fonts.example.com/f.css';</style>",
])
def test_check_page_rejects_scripts_and_network_resources(tmp_path, snippet):
    assert check_page(_page_with(tmp_path, snippet)), snippet


def test_check_page_accepts_links_to_papers_and_own_anchors(tmp_path):
    path = _page_with(tmp_path, '<a href="https://arxiv.org/abs/2007.12163">paper</a> <a href="#s">up</a>')
    assert check_page(path) == []
    assert any("#nowhere" in p for p in check_page(_page_with(tmp_path, '<a href="#nowhere">x</a>')))


def test_check_page_reports_bad_nesting(tmp_path):
    assert any("not closed" in p for p in check_page(_page_with(tmp_path, "<div><span>x</div>")))
    assert any("stray" in p for p in check_page(_page_with(tmp_path, "x</figure>")))


def test_check_page_needs_the_page(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent.html"):
        check_page(tmp_path / "absent.html")
