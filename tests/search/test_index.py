"""rankopt.search.Index: exact search vs a float64 brute force, faiss backends, fingerprints, clear errors."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from rankopt.models import create_model
from rankopt.search import Embedder, Index

from helpers.checkpoints import write_checkpoint
from helpers.images import CLASSES, IMAGES_PER_CLASS


def brute_force(queries: torch.Tensor, gallery: torch.Tensor, k: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Scores from the definition in float64, sorted by (-score, index)."""
    q, g = queries.double(), gallery.double()
    if kind == "cosine":
        scores = (q / q.norm(dim=1, keepdim=True)) @ (g / g.norm(dim=1, keepdim=True)).T
    elif kind == "dot":
        scores = q @ g.T
    else:
        scores = -((q[:, None, :] - g[None, :, :]) ** 2).sum(-1).sqrt()
    order = np.lexsort((np.broadcast_to(np.arange(g.shape[0]), scores.shape), -scores.numpy()), axis=1)[:, :k]
    return np.take_along_axis(scores.numpy(), order, 1), order


@pytest.mark.parametrize("kind", ["cosine", "dot", "neg_l2"])
def test_exact_search_equals_a_float64_brute_force(kind):
    gen = torch.Generator().manual_seed(1)
    gallery, queries = torch.randn(300, 12, generator=gen), torch.randn(25, 12, generator=gen)
    index = Index.from_embeddings(gallery, fingerprint="f", similarity=kind)
    result = index.search(queries, k=7)
    scores, ids = brute_force(queries, gallery, 7, kind)
    assert result.rows.tolist() == ids.tolist()
    np.testing.assert_allclose(result.scores.numpy(), scores, rtol=1e-5, atol=1e-5)
    assert result.scores.dtype == torch.float32 and result.note == ""


def test_the_gallery_is_normalised_once_and_again_after_each_change():
    """Cosine search normalises the gallery once (rankopt.search.backend.unit_vectors), with the bits of the search
    that normalises at every call (chunked_topk over the raw vectors), filtered or not; a new embeddings tensor (an
    addition) or one changed in place is normalised again."""
    from rankopt.metrics.topk import chunked_topk
    from rankopt.search.backend import unit_vectors

    gen = torch.Generator().manual_seed(3)
    gallery, queries = torch.randn(200, 16, generator=gen) * 5, torch.randn(9, 16, generator=gen)
    index = Index.from_embeddings(gallery.clone(), fingerprint="f", metadata={"even": [str(i % 2 == 0)
                                                                                      for i in range(200)]})
    result = index.search(queries, k=5)
    scores, rows = chunked_topk(queries, gallery, 5, similarity="cosine")
    assert torch.equal(result.scores, scores) and torch.equal(result.rows, rows)
    assert unit_vectors(index) is unit_vectors(index)  # made once
    even = index.search(queries, k=5, filter={"even": "True"})
    scores, rows = chunked_topk(queries, gallery[::2], 5, similarity="cosine")
    assert torch.equal(even.scores, scores) and torch.equal(even.rows, rows * 2)
    index.embeddings[:100].neg_()  # in place: the first half flipped
    flipped = torch.cat([-gallery[:100], gallery[100:]])
    assert torch.equal(index.search(queries, k=5).rows, chunked_topk(queries, flipped, 5, similarity="cosine")[1])
    index.add(torch.randn(20, 16, generator=gen) * 5, metadata={"even": ["False"] * 20})  # a new tensor
    assert unit_vectors(index).shape[0] == 220
    assert torch.equal(index.search(queries, k=5).rows,
                       chunked_topk(queries, index.embeddings, 5, similarity="cosine")[1])


def test_records_are_json_with_metadata_that_json_cannot_hold():
    """Infinite and NaN metadata values are kept as None (JSON has neither), so a record is strict JSON (the service
    answers it as it is); the records read each tensor once and give what indexing it would."""
    import json

    gen = torch.Generator().manual_seed(5)
    index = Index.from_embeddings(torch.randn(5, 4, generator=gen), fingerprint="f", labels=torch.arange(5) % 2,
                                  metadata={"m": [float("inf"), float("-inf"), float("nan"), 1.5, np.float32(2.0)]})
    assert [index.item(i)["metadata"]["m"] for i in index.ids] == [None, None, None, 1.5, 2.0]
    result = index.search(torch.randn(2, 4, generator=gen), k=5)
    records = json.loads(json.dumps(result.records(), allow_nan=False))
    for q, record in enumerate(records):
        assert [r["score"] for r in record["results"]] == [float(s) for s in result.scores[q]]
        assert [r["label"] for r in record["results"]] == [int(label) for label in result.labels[q, :, 0]]
        assert [r["id"] for r in record["results"]] == [index.ids[j] for j in result.rows[q].tolist()]


def test_k_larger_than_the_index_is_capped_and_said():
    index = Index.from_embeddings(torch.randn(6, 4), fingerprint="f")
    result = index.search(torch.randn(2, 4), k=50)
    assert result.k == 6 and "k=50 capped to 6" in result.note
    assert sorted(result.rows[0].tolist()) == list(range(6))


def test_records_hold_paths_labels_and_ranks():
    x = torch.eye(3, 4)
    index = Index.from_embeddings(x, ["a.png", "b.png", "c.png"], torch.tensor([5, 6, -1]), fingerprint="f")
    records = index.search(x[:2], k=2).records()
    assert records[0]["query"] == 0 and "query_label" not in records[0]
    first = records[0]["results"][0]
    assert first == {"rank": 1, "id": "0", "path": "a.png", "score": pytest.approx(1.0), "label": 5}
    assert records[1]["results"][0]["path"] == "b.png" and records[1]["results"][1]["rank"] == 2


@pytest.mark.parametrize(
    ("queries", "options", "message"),
    [
        (torch.randn(3, 5), {}, "queries have dimension 5 but the index holds 8-d"),
        (torch.full((2, 8), float("nan")), {}, r"queries has 2 row\(s\) with NaN or Inf values: rows 0, 1"),
        (torch.randn(2, 8), {"fingerprint": "other"}, "fingerprint other is not the index's f"),
        (torch.randn(2, 8), {"k": 0}, "k must be >= 1"),
    ],
)
def test_bad_queries_are_refused_clearly(queries, options, message):
    index = Index.from_embeddings(torch.randn(10, 8), fingerprint="f")
    with pytest.raises(ValueError, match=message):
        index.search(queries, **options)


def test_add_equals_building_from_everything():
    gen = torch.Generator().manual_seed(2)
    a, b, q = torch.randn(40, 6, generator=gen), torch.randn(25, 6, generator=gen), torch.randn(5, 6, generator=gen)
    grown = Index.from_embeddings(a, labels=torch.arange(40), fingerprint="f")
    grown.add(b, labels=torch.arange(40, 65), fingerprint="f")
    whole = Index.from_embeddings(torch.cat([a, b]), labels=torch.arange(65), fingerprint="f")
    assert len(grown) == 65 and grown.dim == 6
    assert grown.search(q, k=9).rows.tolist() == whole.search(q, k=9).rows.tolist()
    assert torch.equal(grown.labels, whole.labels)
    with pytest.raises(ValueError, match="fingerprint g is not the index's f"):
        grown.add(b, fingerprint="g")
    with pytest.raises(ValueError, match="dimension 3 but the index holds 6-d"):
        grown.add(torch.randn(2, 3))


@pytest.mark.parametrize("kind", ["cosine", "neg_l2"])
def test_faiss_flat_equals_exact_search(kind):
    gen = torch.Generator().manual_seed(3)
    gallery, queries = torch.randn(500, 16, generator=gen), torch.randn(20, 16, generator=gen)
    exact = Index.from_embeddings(gallery, fingerprint="f", similarity=kind).search(queries, k=10)
    flat = Index.from_embeddings(gallery, fingerprint="f", similarity=kind, faiss="Flat", progress=False)
    found = flat.search(queries, k=10)
    assert flat.backend == "faiss Flat" and flat.info["faiss"]["recall"] is None
    assert found.rows.tolist() == exact.rows.tolist()
    np.testing.assert_allclose(found.scores.numpy(), exact.scores.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("spec", "params", "least"), [("HNSW16", None, 0.9), ("IVF16,Flat", "nprobe=16", 0.999)])
def test_approximate_index_recall_is_measured_printed_and_stored(spec, params, least, capsys):
    gallery = torch.randn(2000, 8, generator=torch.Generator().manual_seed(4))
    index = Index.from_embeddings(gallery, fingerprint="f", faiss=spec, faiss_params=params, progress=False)
    recall = index.info["faiss"]["recall"]
    assert recall["k"] == 10 and recall["queries"] == 1000 and least <= recall["value"] <= 1.0
    assert f"faiss {spec}: recall@10 vs exact = {recall['value']:.3f} on 1000 queries" in capsys.readouterr().out
    result = index.search(gallery[:5], k=3)
    assert result.rows[:, 0].tolist() == list(range(5))  # each vector finds itself first


def test_ivf_with_too_few_vectors_says_how_many_and_what_to_do():
    with pytest.raises(ValueError, match=r"needs at least 1560 vectors .* the index has 300: use a smaller nlist \(IVF7"):
        Index.from_embeddings(torch.randn(300, 8), fingerprint="f", faiss="IVF40,Flat", progress=False)
    with pytest.raises(ValueError, match="faiss cannot build 'NoSuchIndex'"):
        Index.from_embeddings(torch.randn(300, 8), fingerprint="f", faiss="NoSuchIndex", progress=False)


def test_build_from_a_checkpoint_labels_by_class_folders_and_finds_query_labels(checkpoint, tree, queries):
    index = Index.build(checkpoint, tree, progress=False, device="cpu")
    assert len(index) == len(CLASSES) * IMAGES_PER_CLASS and index.dim == 16
    assert index.label_names == [sorted(CLASSES), ["alpha", "beta"]] and index.level_names == ("class", "level1")
    assert index.info["checkpoint"] == str(checkpoint.resolve()) and index.preprocessing["image_size"] == 32
    result = index.search(queries, k=4)
    assert [p.split("queries/")[1] for p in result.query_paths] == ["alpha/one/q.png", "beta/four/q.png", "elsewhere/q.png"]
    names = [r.get("query_label") for r in result.records()]
    assert names == ["alpha/one", "beta/four", None]
    # the same images given as embeddings give the same neighbours
    again = index.search(Embedder.from_checkpoint(checkpoint, device="cpu", progress=False).embed(queries).embeddings,
                         k=4, fingerprint=index.fingerprint)
    assert again.rows.tolist() == result.rows.tolist()


def test_queries_from_another_model_are_refused_with_the_cause(tmp_path, checkpoint, tree, queries):
    index = Index.build(checkpoint, tree, progress=False, device="cpu")
    other_weights = write_checkpoint(tmp_path / "other.ckpt", seed=5)
    with pytest.raises(ValueError, match=f"not the fingerprint {index.fingerprint} .*the weights differ \\(same preprocessing"):
        index.search(queries, checkpoint=other_weights)
    other_size = write_checkpoint(tmp_path / "size.ckpt", ["data.image_size=24"])
    with pytest.raises(ValueError, match="same weights, the preprocessing differs \\(image_size: 32 there, 24 here\\)"):
        index.search(queries, checkpoint=other_size)
    with pytest.raises(ValueError, match="weights differ"):
        index.add(queries, checkpoint=other_weights)


def test_a_module_needs_its_preprocessing(tree):
    model = create_model("convnet_tiny", embedding_dim=16)
    with pytest.raises(ValueError, match="needs preprocessing="):
        Index.build(model, tree, device="cpu", progress=False)
    index = Index.build(model, tree, preprocessing={"transform": "synthetic_test", "image_size": 32}, device="cpu",
                        progress=False)
    assert len(index) == 12 and index.info["checkpoint"] is None
    result = index.search(tree / "beta", k=1)  # embedded by the module the index was built with
    assert result.rows.shape == (6, 1) and result.query_labels[:, 1].tolist() == [1] * 6


def test_adding_images_merges_class_names(checkpoint, tree, tmp_path):
    from helpers.images import draw

    index = Index.build(checkpoint, tree / "beta", progress=False, device="cpu")
    assert index.label_names == [["four", "three"]]
    extra = tmp_path / "extra"
    draw(extra / "three" / "x.png", (1, 2, 3), 0)
    draw(extra / "five" / "y.png", (3, 2, 1), 1)
    index.add(extra)
    assert index.label_names == [["four", "three", "five"]]
    assert index.labels[-2:, 0].tolist() == [2, 1]  # five, three (sorted paths: five/y.png, three/x.png)


def test_importing_search_does_not_import_the_trainer():
    code = ("import sys, rankopt.search, rankopt.cli.search, rankopt.cli.index; "
            "print('rankopt.engine.trainer' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
