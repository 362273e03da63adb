"""``rankopt fit`` on a flat folder (photos with no class folders): the pretrained features served, the index of
every readable photo, the report and fit.json saying why; on SYNTHETIC photos (coloured squares) and a tiny
untrained model (the pipeline matters here, not the weights)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.checkpoints import write_checkpoint
from helpers.images import draw
from rankopt import layout
from rankopt.data import DatasetProblems
from rankopt.fit import FitSettings, fit
from rankopt.fit.flat import FLAT_STEPS
from rankopt.search import Index

PHOTOS = 12


@pytest.fixture(scope="module")
def flat_run(tmp_path_factory) -> tuple[Path, Path, dict, list[str]]:
    root = tmp_path_factory.mktemp("flat")
    photos = root / "photos"
    photos.mkdir()
    for i in range(PHOTOS):
        draw(photos / f"p{i:02d}.png", (20 * i % 256, 120, 200 - 10 * i), seed=i)
    (photos / "zz_broken.jpg").write_bytes(b"\xff\xd8\xff not a photo")
    weights = write_checkpoint(root / "tiny.ckpt")
    lines: list[str] = []
    record = fit(photos, root / "run", FitSettings(minutes=0.5, weights=str(weights)), say=lines.append)
    return photos, root / "run", record, lines


def test_a_flat_folder_is_indexed_whole_with_the_pretrained_features(flat_run):
    photos, run, record, lines = flat_run
    assert any("no class folder: the pretrained features will be served" in line for line in lines), lines
    assert record["chosen"]["model"] == "features" and record["pipelines"] == []
    assert any(why.startswith("no class folders") for why in record["chosen"]["why"])
    assert [s.split(":")[0] for s in record["skipped"]] == [str(photos / "zz_broken.jpg")]
    assert (run / layout.SKIPPED_TXT).read_text().startswith(str(photos / "zz_broken.jpg"))
    stored = json.loads((run / layout.FIT_JSON).read_text())
    assert stored["chosen"]["post"]["qe"] == ({"k": FLAT_STEPS.qe.k, "alpha": FLAT_STEPS.qe.alpha}
                                              if FLAT_STEPS.qe else None)
    assert not (run / layout.UNFINISHED).exists()
    assert sorted(p.name for p in photos.iterdir()) == sorted([f"p{i:02d}.png" for i in range(PHOTOS)]
                                                              + ["zz_broken.jpg"])  # nothing written there


def test_the_flat_run_folder_is_searched_as_an_index(flat_run):
    photos, run, _, _ = flat_run
    index = Index.load(run)
    assert len(index) == PHOTOS and sorted(Path(p).name for p in index.paths) == \
        [f"p{i:02d}.png" for i in range(PHOTOS)]
    assert index.query_expansion == FLAT_STEPS.qe
    found = index.search([str(photos / "p03.png")], k=3)
    assert Path(found.paths[0][0]).name == "p03.png"  # a photo finds itself first
    assert (run / layout.REPORT_HTML).read_text().count("figures/examples.png") == 1
    assert (run / layout.FIGURES_DIR / "examples.png").stat().st_size > 1000


def test_photos_loose_beside_class_folders_are_refused(tmp_path):
    photos = tmp_path / "photos"
    for i in range(3):
        draw(photos / "cats" / f"{i}.png", (200, 40, 40), seed=i)
    draw(photos / "loose.png", (10, 10, 10), seed=9)
    with pytest.raises(DatasetProblems, match="directly in .*, in no class folder"):
        fit(photos, tmp_path / "run", FitSettings(minutes=0.2, weights=str(write_checkpoint(tmp_path / "w.ckpt"))),
            say=lambda _: None)


def test_the_flat_steps_never_change_a_query_s_first_result():
    """αQE over the top 2 with α = 1 (:data:`FLAT_STEPS`): ``q'·g₁ − q'·g₂ = (s₁ − s₂)(2 − g₁·g₂) ≥ 0``, so the
    first result stays first, whatever the folder (random unit vectors, clustered and not)."""
    import torch

    torch.manual_seed(0)
    for clustered in (False, True):
        centres = torch.nn.functional.normalize(torch.randn(5, 16), dim=1)
        g = torch.randn(300, 16) + (4 * centres[torch.randint(0, 5, (300,))] if clustered else 0)
        q = torch.randn(200, 16) + (4 * centres[torch.randint(0, 5, (200,))] if clustered else 0)
        g, q = (torch.nn.functional.normalize(v, dim=1) for v in (g, q))
        expanded = FLAT_STEPS.expand_queries(q, g)
        assert torch.equal((q @ g.T).argmax(dim=1), (expanded @ g.T).argmax(dim=1))
        assert not torch.allclose(expanded, q)  # and it does change the queries
