"""Open-set thresholds: calibrate() against a brute force over every genuine/impostor pair, "match" in
search results, and ``rankopt calibrate`` end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from rankopt.cli import main
from rankopt.data.image_folder import folder_dataset
from rankopt.search import Embedder, Index
from rankopt.search.threshold import calibrate


def brute_threshold(x: np.ndarray, labels: np.ndarray, fmr: float, kind: str) -> tuple[float, float, float]:
    """``(t, FMR(t), FNMR(t))`` for the smallest candidate threshold (a pair score, or just above them all) whose
    FMR <= fmr, from the definition: every pair i < j of labelled items, scores in float64."""
    keep = labels >= 0
    x, labels = x[keep].astype(np.float64), labels[keep]
    if kind == "cosine":
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
    scores, genuine = [], []
    for i in range(len(x)):
        for j in range(i + 1, len(x)):
            scores.append(float(x[i] @ x[j]))
            genuine.append(labels[i] == labels[j])
    scores, genuine = np.array(scores), np.array(genuine)
    above_all = float(np.nextafter(np.float32(scores.max()), np.float32(np.inf)))
    for t in [*np.unique(scores), above_all]:  # increasing: the first that qualifies is the smallest
        far = float(((scores >= t) & ~genuine).sum() / (~genuine).sum())
        if far <= fmr:
            return float(t), far, float(((scores < t) & genuine).sum() / genuine.sum())
    raise AssertionError("unreachable: the threshold above every score accepts nothing")


@pytest.mark.parametrize("fmr", [0.003, 0.01, 0.05, 0.2])
def test_integer_scores_with_ties_match_the_brute_force(fmr):
    rng = np.random.default_rng(0)
    x = rng.integers(-2, 3, size=(60, 3)).astype(np.float32)  # dot products are small integers: many ties
    labels = rng.integers(0, 6, size=60)
    labels[:4] = -1  # unknown labels are left out
    result = calibrate(torch.from_numpy(x), labels, fmr, similarity="dot")
    expected, far, fnmr = brute_threshold(x, labels, fmr, "dot")
    chosen = result.threshold
    assert (chosen["value"], chosen["achieved_fmr"]) == (expected, far) and chosen["achieved_fmr"] <= fmr
    assert chosen["fnmr"] == pytest.approx(fnmr, abs=1e-12)
    assert chosen["genuine_pairs"] + chosen["impostor_pairs"] == 56 * 55 // 2
    target = next(row for row in result.table if row["fmr"] == fmr)
    assert target["threshold"] == expected and target["fnmr"] == chosen["fnmr"]


def test_cosine_scores_match_the_brute_force():
    gen = torch.Generator().manual_seed(3)
    labels = torch.arange(80) % 8
    x = torch.randn(80, 16, generator=gen) + 1.5 * torch.randn(8, 16, generator=gen)[labels]
    result = calibrate(x, labels, 1e-2)
    expected, far, fnmr = brute_threshold(x.numpy(), labels.numpy(), 1e-2, "cosine")
    assert result.threshold["value"] == pytest.approx(expected, abs=1e-6)
    assert result.threshold["achieved_fmr"] == far and result.threshold["fnmr"] == pytest.approx(fnmr)
    assert [row["fnmr"] is None for row in result.table] == [True, True, True, False, False, False]  # 2800 impostor pairs
    fmr, fnmr_curve = result.curve
    assert (np.diff(fmr) >= 0).all() and (np.diff(fnmr_curve) <= 0).all()


def test_when_the_top_scores_hold_too_many_impostors_nothing_matches():
    x = torch.ones(30, 4)  # every pair ties
    result = calibrate(x, torch.arange(30) % 3, 0.1)
    assert result.threshold["value"] == float(np.nextafter(np.float32(1.0), np.float32(2.0)))
    assert result.threshold["achieved_fmr"] == 0.0 and result.threshold["fnmr"] == 1.0
    index = Index.from_embeddings(x, fingerprint="f")
    index.set_threshold(result.threshold)
    assert [r["match"] for r in index.search(x[:1], k=3).records()[0]["results"]] == [False] * 3


def test_too_few_impostor_pairs_is_an_error():
    with pytest.raises(ValueError, match="give 4 genuine and 6 impostor pairs: an FMR of 0.001 needs at least 1000"):
        calibrate(torch.randn(5, 4), [0, 0, 0, 1, 1], 1e-3)


def test_results_are_marked_as_matches_by_the_threshold(tmp_path):
    x = torch.eye(4, 4)[[0, 0, 1, 2]] + 0.1 * torch.arange(4)[:, None]
    index = Index.from_embeddings(x, fingerprint="f")
    assert "match" not in index.search(x[:1], k=4).records()[0]["results"][0]
    index.set_threshold({"value": 0.5, "fmr": 1e-3})
    loaded = Index.load(index.save(tmp_path / "idx"))
    result = loaded.search(x[:2], k=4)
    for q, record in enumerate(result.records()):
        assert [r["match"] for r in record["results"]] == [s >= 0.5 for s in result.scores[q].tolist()]
    assert any(r["match"] for r in record["results"]) and not all(r["match"] for r in record["results"])
    with pytest.raises(ValueError, match="finite 'value'"):
        index.set_threshold({"value": math.inf})


def test_cli_calibrate_stores_the_threshold_and_search_shows_matches(tmp_path, checkpoint, tree, queries, capsys):
    folder = tmp_path / "idx"
    assert main(["index", str(checkpoint), "--images", str(tree), "--out", str(folder), "--device", "cpu",
                 "--no-progress"]) == 0
    probe = tmp_path / "probe"  # identities of their own: 4 classes of 4 images
    for c in range(4):
        for i in range(4):
            (probe / f"p{c}").mkdir(parents=True, exist_ok=True)
            colour = np.array([40 + 50 * c, 200 - 40 * c, 90 + 10 * i], dtype=np.uint8)
            Image.fromarray(np.tile(colour, (40, 40, 1))).save(probe / f"p{c}" / f"{i}.png")
    assert main(["calibrate", str(folder), "--images", str(probe), "--fmr", "0.05", "--out", str(tmp_path / "cal"),
                 "--device", "cpu", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "<- target" in printed and "24 genuine, 96 impostor pairs" in printed and "stored in" in printed
    stored = Index.load(folder).threshold
    embedded = Embedder.from_checkpoint(checkpoint, device="cpu", progress=False).embed(folder_dataset(probe))
    expected, _, _ = brute_threshold(embedded.embeddings.numpy(), embedded.labels[:, 0].numpy(), 0.05, "cosine")
    assert stored["value"] == pytest.approx(expected, abs=1e-6) and stored["fmr"] == 0.05
    assert stored["fingerprint"] == Index.load(folder).fingerprint and stored["items"] == 16
    saved = json.loads((tmp_path / "cal" / "calibration.json").read_text())
    assert saved["threshold"]["value"] == stored["value"] and (tmp_path / "cal" / "fnmr_fmr.png").is_file()

    out = tmp_path / "hits.json"
    assert main(["search", str(folder), str(queries), "--top-k", "12", "--json", str(out), "--device", "cpu",
                 "--no-progress"]) == 0
    results = [r for record in json.loads(out.read_text()) for r in record["results"]]
    assert all(r["match"] == (r["score"] >= stored["value"]) for r in results)
    assert ("no match" in capsys.readouterr().out) == (not all(r["match"] for r in results))
