"""``rankopt datasets`` and ``rankopt dataset-info`` (through this module's own ``register``)."""

from __future__ import annotations

import argparse
import json

import pytest

from rankopt.cli.datasets import register
from rankopt.data import DATASETS


def run(argv: list[str], capsys) -> tuple[int, str]:
    parser = argparse.ArgumentParser(prog="rankopt")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code = args.func(args)
    return code, capsys.readouterr().out


def test_datasets_lists_every_dataset(capsys):
    code, out = run(["datasets", "--json"], capsys)
    rows = {r["name"]: r for r in json.loads(out)}
    assert code == 0
    listed = set(rows) | {a for r in rows.values() for a in r["aliases"]}
    assert listed == set(DATASETS.names())
    assert rows["sop"]["levels"] == ["product", "category"] and "Ebay_train.txt" in rows["sop"]["native_files"]
    assert rows["inshop"]["evaluation_splits"] == ["query", "gallery"]
    assert "SYNTHETIC" in rows["synthetic"]["description"]
    code, text = run(["datasets"], capsys)
    assert "cub200 (alias: cub)" in text and "levels (finest first)" in text


def test_readme_dataset_table_is_the_markdown_listing(capsys):
    """The README's dataset table is ``rankopt datasets --markdown`` (every dataset, its native files)."""
    from pathlib import Path

    code, table = run(["datasets", "--markdown"], capsys)
    assert code == 0
    lines = table.splitlines()
    _, listing = run(["datasets", "--json"], capsys)
    assert len(lines) == 2 + len(json.loads(listing))  # header, rule, one row per dataset
    assert any(line.startswith("| `vggface2` |") and "loose_bb_{train,test}.csv" in line for line in lines)
    assert any(line.startswith("| `ijbc` |") and "ijbc_face_tid_mid.txt" in line for line in lines)
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert table in readme, "README's dataset table is stale: paste `rankopt datasets --markdown` into it"


def test_dataset_info_reports_counts_and_missing(sop_root, capsys):
    tmp_path, _ = sop_root
    (tmp_path / "toaster_final/9_1.JPG").unlink()
    code, out = run(["dataset-info", "sop", "--root", str(tmp_path), "--json"], capsys)
    report = json.loads(out)
    assert code == 1 and not report["ok"]
    train = report["splits"]["train"]
    assert train["found"] == {"images": 4, "product": 3, "category": 2}
    assert train["mismatches"]["images"] == {"found": 4, "published": 59551}
    assert train["num_bad_images"] == 1 and "9_1.JPG" in train["bad_images"][0] and "Ebay_train.txt:6" in train["bad_images"][0]
    assert "Ebay_test.txt" in report["splits"]["test"]["error"]
    code, text = run(["dataset-info", "sop", "--root", str(tmp_path)], capsys)
    assert "[train] PROBLEM" in text and "MISMATCH" in text and "missing" in text


def test_dataset_info_synthetic_is_ok(synthetic_root, capsys):
    code, out = run(["dataset-info", "synthetic", "--root", str(synthetic_root)], capsys)
    assert code == 0 and "SYNTHETIC" in out and "[test] OK" in out


def test_bad_option(capsys):
    with pytest.raises(ValueError, match="KEY=VALUE"):
        run(["dataset-info", "vehicleid", "--root", ".", "--option", "test_size"], capsys)
