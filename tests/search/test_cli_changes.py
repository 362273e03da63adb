"""``rankopt index --metadata``, ``search --filter``, ``index-add`` / ``index-remove`` / ``index-update``."""

from __future__ import annotations

import json

from rankopt.cli import main
from rankopt.search import Index

from helpers.images import draw


def test_index_metadata_filter_and_changes(tmp_path, checkpoint, tree, queries, capsys):
    metadata = tmp_path / "meta.csv"
    files = sorted(tree.rglob("*.png"))
    metadata.write_text("path,shelf\n" + "".join(f"{f.relative_to(tmp_path)},{'top' if i < 4 else 'low'}\n"
                                                 for i, f in enumerate(files)))
    folder = tmp_path / "idx"
    assert main(["index", str(checkpoint), "--images", str(tree), "--out", str(folder), "--metadata", str(metadata),
                 "--device", "cpu", "--no-progress"]) == 0
    assert "metadata shelf" in capsys.readouterr().out

    hits = tmp_path / "hits.json"
    assert main(["search", str(folder), str(queries), "--filter", "shelf=top", "--filter", "label in [alpha/one, beta/four]",
                 "--top-k", "10", "--json", str(hits), "--device", "cpu", "--no-progress"]) == 0
    assert "k=10 capped to 3: the filter keeps 3 of 12 items" in capsys.readouterr().out
    results = [r for record in json.loads(hits.read_text()) for r in record["results"]]
    assert {r["metadata"]["shelf"] for r in results} == {"top"} and {r["label"] for r in results} == {"alpha/one"}

    extra = tmp_path / "extra"
    draw(extra / "beta" / "five" / "x.png", (5, 5, 5), 1)
    assert main(["index-add", str(folder), "--images", str(extra), "--device", "cpu", "--no-progress"]) == 0
    assert "added 1 item(s): ids 12 ... 12" in capsys.readouterr().out
    assert main(["index-remove", str(folder), "--id", "0", "--path", str(files[5])]) == 0
    assert "removed 2 item(s): 0, 5" in capsys.readouterr().out
    draw(files[1], (1, 200, 1), 7)
    files[2].unlink()
    assert main(["index-update", str(folder), "--device", "cpu", "--no-progress"]) == 0
    assert "checked 11 file(s): re-embedded 1 (1), removed 1 vanished (2)" in capsys.readouterr().out
    index = Index.load(folder)
    assert index.ids == ["1", "3", "4", "6", "7", "8", "9", "10", "11", "12"] and index.info["version"] == 4
    assert index.label_names[0][-1] == "beta/five" and index.item("12")["metadata"] == {"shelf": None}

    assert main(["index-remove", str(folder), "--id", "0"]) == 1
    err = capsys.readouterr().err
    assert "unknown item(s) (not in the index): '0'" in err and len(err.strip().splitlines()) == 1
    assert Index.load(folder).info["version"] == 4  # a failed change saves nothing
