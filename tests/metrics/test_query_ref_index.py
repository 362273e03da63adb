"""``evaluate(..., query_ref_index=...)``: a gallery that contains the queries (DyML), each
query's copy excluded by index; the engine wiring and the CLI flag.

Oracle: the brute-force loops of ``reference.py`` run one query at a time on the gallery
with that query's excluded item removed. Integer-valued embeddings with the dot product
give many exact ties (the copy of a query ties with any other identical item). All data
are synthetic.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

import rankopt.metrics.evaluation as ev
from rankopt.cli import main
from rankopt.config import EvalConfig
from rankopt.engine.embed_and_score import EmbeddedSplit, score
from rankopt.metrics import ALL_METRICS, evaluate

from . import reference

TOPK = ["recall@1", "recall@3", "recall@100", "precision@1", "precision@4", "true_recall@2", "true_recall@5",
        "map@r", "map@3", "map@100"]  # fmt: skip


def _case(seed: int, num_queries: int = 14, num_others: int = 18, levels: int = 1, num_classes: int = 6, copies: str = "mixed"):
    """Queries, and a gallery holding copies of some of them (same embedding and labels) at random
    places among other items. ``query_ref_index``: each query's copy, -1 for queries without one;
    with ``copies="any"`` some entries point at an unrelated gallery item (the rule is by index)."""
    rng = np.random.default_rng(seed)
    dim = 3

    def items(n):
        x = rng.integers(-1, 2, size=(n, dim)).astype(np.float64)
        fine = rng.integers(0, num_classes, size=n)
        cols = [fine] + [fine // (2 * (c + 1)) for c in range(levels - 1)]  # consistent hierarchy
        return x, np.stack(cols, axis=1)

    x, y = items(num_queries)
    has = {"mixed": rng.random(num_queries) < 0.6, "all": np.ones(num_queries, bool), "none": np.zeros(num_queries, bool)}
    with_copy = np.flatnonzero(has["mixed" if copies == "any" else copies])
    xo, yo = items(num_others)
    xr, yr = np.concatenate([x[with_copy], xo]), np.concatenate([y[with_copy], yo])
    perm = rng.permutation(len(xr))  # gallery item perm[j] is stored at position j
    xr, yr = xr[perm], yr[perm]
    where = np.argsort(perm)
    index = np.full(num_queries, -1, dtype=np.int64)
    index[with_copy] = where[np.arange(len(with_copy))]
    if copies == "any":  # a few queries exclude some other gallery item instead
        swap = rng.choice(num_queries, size=3, replace=False)
        index[swap] = rng.integers(-1, len(xr), size=3)
    return x, y, xr, yr, index


def _brute_force(x, y, xr, yr, index, names):
    """Per query, the reference on the gallery without its excluded item; averages where defined."""
    per: dict[str, list[float]] = {name: [] for name in names}
    without = 0
    for i in range(len(x)):
        keep = np.arange(len(xr)) != index[i]
        values, no_pos = reference.evaluate(x[i : i + 1], y[i : i + 1], xr[keep], yr[keep], names, "dot")
        without += no_pos
        for name, value in values.items():
            if not math.isnan(value):
                per[name].append(value)
    return {name: (sum(v) / len(v) if v else math.nan) for name, v in per.items()}, without


def _assert_close(got: dict[str, float], want: dict[str, float]) -> None:
    assert set(got) == set(want)
    for name, value in want.items():
        if math.isnan(value):
            assert math.isnan(got[name]), name
        else:
            assert got[name] == pytest.approx(value, abs=1e-9), name


def _check(case, names, **kwargs):
    x, y, xr, yr, index = case
    t = torch.as_tensor
    got = evaluate(t(x), t(y), t(xr), t(yr), metrics=names, similarity="dot", query_ref_index=t(index), **kwargs)
    want, without = _brute_force(x, y, xr, yr, index, names)
    _assert_close(got.metrics, want)
    assert got.num_queries == len(x) and got.num_queries_without_positive == without
    return got


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("levels", [1, 3])
def test_every_metric(seed, levels):
    """Hierarchical metrics sort each chunk; chunks mix queries with and without a copy."""
    names = list(ALL_METRICS) + (["ap@level1", "ap@level2"] if levels == 3 else [])
    case = _case(seed, levels=levels, copies="any" if seed % 3 == 0 else "mixed")
    _check(case, names, chunk_size=1 + seed % 5)


@pytest.mark.parametrize("seed", range(10))
def test_topk_lists(seed):
    """Top-k metrics alone: top-K lists per chunk, complete (cut-off 100) or not (small cut-offs)."""
    copies = ("mixed", "all", "any", "none")[seed % 4]
    _check(_case(seed, copies=copies), TOPK, chunk_size=1 + seed % 6)
    _check(_case(seed + 50, num_others=3, copies=copies), ["recall@1", "precision@4", "map@r"], chunk_size=4)


@pytest.mark.parametrize("seed", range(8))
def test_counting_and_sorting_full_binary(seed, monkeypatch):
    """map/mrr count per positive without sorting; with many positives they sort: both exact."""
    case = _case(seed, num_classes=3, copies="any" if seed % 2 else "mixed")
    names = ["map", "mrr", "recall@1", "map@r"]
    counted = _check(case, names, chunk_size=1 + seed % 4)
    monkeypatch.setattr(ev, "MAX_COUNTED_POSITIVES", 0)
    assert _check(case, names, chunk_size=3).metrics == pytest.approx(counted.metrics)


@pytest.mark.parametrize("seed", range(5))
def test_faiss_backend(seed):
    _check(_case(seed, copies=("mixed", "all", "any")[seed % 3]), TOPK, backend="faiss")
    _check(_case(seed + 20, num_others=2), ["recall@1", "recall@100", "map@r"], backend="faiss")  # lists hold every item


def test_no_copy_anywhere_is_a_plain_separate_gallery():
    x, y, xr, yr, index = (torch.as_tensor(a) for a in _case(4, levels=3, copies="none"))
    names = list(ALL_METRICS) + ["ap@level1"]
    got = evaluate(x, y, xr, yr, metrics=names, similarity="dot", query_ref_index=index)
    assert bool((index == -1).all())
    assert got.metrics == pytest.approx(evaluate(x, y, xr, yr, metrics=names, similarity="dot").metrics, nan_ok=True)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("levels", [1, 3])
def test_self_retrieval_is_the_special_case(seed, levels):
    """``evaluate(X)`` equals ``evaluate(X, ref=X, query_ref_index=arange(N))`` on every search path."""
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.integers(-1, 2, size=(30, 3)).astype(np.float64))
    fine = torch.as_tensor(rng.integers(0, 7, size=30))
    y = torch.stack([fine, fine // 2, fine // 4], 1) if levels == 3 else fine
    own = torch.arange(30)
    for names, kwargs in [
        (list(ALL_METRICS) + (["ap@level1"] if levels == 3 else []), {"chunk_size": 7}),
        (TOPK, {"chunk_size": 4}),  # self: symmetric tiles; separate: chunked top-k
        (["map", "mrr"], {}),
        (TOPK, {"backend": "faiss"}),
    ]:
        self_result = evaluate(x, y, metrics=names, similarity="dot", **kwargs)
        explicit = evaluate(x, y, x.clone(), y.clone(), metrics=names, similarity="dot", query_ref_index=own, **kwargs)
        assert explicit.metrics == pytest.approx(self_result.metrics, abs=1e-12, nan_ok=True)
        assert explicit.num_queries_without_positive == self_result.num_queries_without_positive
        assert explicit.num_excluded == self_result.num_excluded


def test_bad_query_ref_index():
    x, y = torch.randn(5, 3), torch.arange(5) % 2
    xr, yr = torch.randn(7, 3), torch.arange(7) % 2
    ok = torch.tensor([0, -1, 6, 2, 2])
    assert evaluate(x, y, xr, yr, query_ref_index=ok).num_queries == 5  # two queries may share an excluded item
    with pytest.raises(ValueError, match=r"shape \(5,\)"):
        evaluate(x, y, xr, yr, query_ref_index=ok[:4])
    with pytest.raises(ValueError, match=r"shape \(5,\)"):
        evaluate(x, y, xr, yr, query_ref_index=ok.reshape(5, 1))
    with pytest.raises(TypeError, match="integer tensor"):
        evaluate(x, y, xr, yr, query_ref_index=ok.float())
    with pytest.raises(TypeError, match="integer tensor"):
        evaluate(x, y, xr, yr, query_ref_index=ok >= 0)
    with pytest.raises(TypeError, match="torch.Tensor"):
        evaluate(x, y, xr, yr, query_ref_index=[0, -1, 6, 2, 2])
    with pytest.raises(ValueError, match=r"\[-1, 6\].*queries 2"):
        evaluate(x, y, xr, yr, query_ref_index=torch.tensor([0, -1, 7, 2, 2]))
    with pytest.raises(ValueError, match=r"\[-1, 6\].*queries 0, 4"):
        evaluate(x, y, xr, yr, query_ref_index=torch.tensor([-2, -1, 6, 2, -5]))
    with pytest.raises(ValueError, match="needs ref_embeddings"):
        evaluate(x, y, query_ref_index=torch.arange(5))
    with pytest.raises(ValueError, match="no item to retrieve"):
        evaluate(x, y, xr[:1], yr[:1], query_ref_index=torch.tensor([0, -1, -1, -1, -1]))


# ----------------------------------------------------------------------------- engine and CLI
def _dyml_like_splits(root: str = "/data/dyml_vehicle/bmk_fine"):
    """Query and gallery splits as the DyML loader gives them: queries under ``query/``, their
    copies under ``gallery/`` with the same file names; query q3.jpg has no copy."""
    rng = np.random.default_rng(0)
    q = torch.as_tensor(rng.integers(-1, 2, size=(4, 3)).astype(np.float32))
    ql = torch.tensor([[0], [1], [1], [2]])
    others = torch.as_tensor(rng.integers(-1, 2, size=(5, 3)).astype(np.float32))
    g = torch.cat([others[:2], q[2:3], q[0:1], others[2:], q[1:2]])
    gl = torch.tensor([[1], [2], [1], [0], [0], [1], [2], [1]])
    names = ["g0.jpg", "g1.jpg", "q2.jpg", "q0.jpg", "g2.jpg", "g3.jpg", "g4.jpg", "q1.jpg"]
    note = {"granularity": "fine", "gallery_contains_queries": True}
    query = EmbeddedSplit(q, ql, [f"{root}/query/q{i}.jpg" for i in range(4)], dict(note))
    gallery = EmbeddedSplit(g, gl, [f"{root}/gallery/{n}" for n in names], dict(note))
    return query, gallery, torch.tensor([3, 7, 2, -1])


def test_engine_excludes_the_copies_of_dyml_queries():
    from rankopt.engine.embed_and_score import query_ref_index

    query, gallery, expected = _dyml_like_splits()
    assert query_ref_index(query.paths, gallery.paths).tolist() == expected.tolist()
    cfg = EvalConfig(metrics=["recall@1", "map@r", "map", "mrr"], similarity="dot")
    got = score([query, gallery], cfg)
    want = evaluate(query.embeddings, query.labels, gallery.embeddings, gallery.labels, metrics=cfg.metrics,
                    similarity="dot", query_ref_index=expected)
    assert got.metrics == pytest.approx(want.metrics)
    plain = evaluate(query.embeddings, query.labels, gallery.embeddings, gallery.labels, metrics=cfg.metrics, similarity="dot")
    assert got.metrics["mrr"] != pytest.approx(plain.metrics["mrr"])  # the copies would be found first
    query.metadata.pop("gallery_contains_queries")
    assert score([query, gallery], cfg).metrics == pytest.approx(plain.metrics)


def test_engine_matches_paths_as_the_dyml_loader_gives_them(tmp_path):
    from rankopt.data.dyml import load_dyml
    from rankopt.engine.embed_and_score import query_ref_index

    bench = tmp_path / "bmk_fine"
    bench.mkdir()
    (bench / "query.csv").write_text("fname, labels" + "a.jpg, 1\nb.jpg, 2\nz.jpg, 3\n")  # header glued to row 1
    (bench / "gallery.csv").write_text("fname, labels" + "c.jpg, 1\nb.jpg, 2\na.jpg, 1\n")
    items = load_dyml(tmp_path, "query", subset="vehicle")
    paths = {split: [p for p, s in zip(items.paths, items.splits) if s == split] for split in ("query", "gallery")}
    assert query_ref_index(paths["query"], paths["gallery"]).tolist() == [2, 1, -1]


def test_engine_refuses_ambiguous_copies():
    from rankopt.engine.embed_and_score import query_ref_index

    assert query_ref_index(["/q/a.jpg"], ["/g/a.jpg", "/g/b.jpg"]).tolist() == [0]
    assert query_ref_index(["/g/x/a.jpg"], ["/g/x/a.jpg", "/g/y/a.jpg"]).tolist() == [0]  # the exact path wins
    with pytest.raises(ValueError, match="a.jpg"):
        query_ref_index(["/q/a.jpg"], ["/g/x/a.jpg", "/g/y/a.jpg"])


def test_cli_query_ref_index(tmp_path, capsys):
    query, gallery, index = _dyml_like_splits()
    files = {}
    for name, array in {"e": gallery.embeddings, "l": gallery.labels, "q": query.embeddings, "ql": query.labels, "i": index}.items():
        files[name] = str(tmp_path / f"{name}.npy")
        np.save(files[name], array.numpy())
    out = tmp_path / "out.json"
    base = ["evaluate-embeddings", "--embeddings", files["e"], "--labels", files["l"], "--similarity", "dot",
            "--metrics", "recall@1", "map", "--json", str(out), "--no-progress"]  # fmt: skip
    assert main([*base, "--query-embeddings", files["q"], "--query-labels", files["ql"], "--query-ref-index", files["i"]]) == 0
    want = evaluate(query.embeddings, query.labels, gallery.embeddings, gallery.labels, metrics=["recall@1", "map"],
                    similarity="dot", query_ref_index=index)
    assert json.loads(out.read_text())["metrics"] == pytest.approx(want.metrics)
    capsys.readouterr()
    assert main([*base, "--query-ref-index", files["i"]]) == 1  # needs separate queries
    assert "--query-ref-index" in capsys.readouterr().err
    np.save(files["i"], np.array([0.5, 1, 2, 3]))
    assert main([*base, "--query-embeddings", files["q"], "--query-labels", files["ql"], "--query-ref-index", files["i"]]) == 1
    assert "integer" in capsys.readouterr().err


def test_chunked_topk_matches_the_full_sort_in_any_chunking():
    from rankopt.metrics.topk import chunked_topk
    from rankopt.similarity import pairwise

    gen = torch.Generator().manual_seed(3)
    query, ref = torch.randn(37, 8, generator=gen, dtype=torch.float64), torch.randn(53, 8, generator=gen, dtype=torch.float64)
    full = pairwise(query, ref, "cosine")
    expected_values, expected_indices = full.sort(dim=1, descending=True)
    for chunk in (1, 5, 37, None):
        values, indices = chunked_topk(query, ref, 7, chunk_size=chunk)
        assert torch.equal(indices, expected_indices[:, :7])
        assert torch.allclose(values, expected_values[:, :7])
    # self-retrieval: each query's own row is excluded by index, so k is capped at N - 1
    values, indices = chunked_topk(query, None, 100, chunk_size=4)
    assert indices.shape == (37, 36)
    assert not (indices == torch.arange(37).unsqueeze(1)).any()
    own = pairwise(query, query, "cosine").fill_diagonal_(float("-inf")).sort(dim=1, descending=True)
    assert torch.equal(indices, own.indices[:, :36])
    # one chunk (a served query's path: topk straight from the scores) as many chunks, in float32 too
    one, many = chunked_topk(query.float(), ref.float(), 7), chunked_topk(query.float(), ref.float(), 7, chunk_size=5)
    assert one[0].dtype == torch.float32 and torch.equal(one[1], many[1]) and torch.allclose(one[0], many[0])
    assert torch.equal(chunked_topk(query, None, 9)[1], indices[:, :9])  # self-retrieval in one chunk
    with pytest.raises(ValueError, match="k >= 1"):
        chunked_topk(query, ref, 0)


def test_evaluate_embeddings_names_a_file_that_is_not_an_npy_array(tmp_path, capsys):
    text = tmp_path / "E.npy"
    text.write_text("0.1 0.2\n0.3 0.4\n")
    labels = tmp_path / "L.npy"
    np.save(labels, np.array([0, 1]))
    objects = tmp_path / "O.npy"
    np.save(objects, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    expected = {
        str(text): r"E\.npy' is not a NumPy array file \(\.npy\): it starts with b'0\.1",
        str(objects): r"O\.npy' holds Python objects .* never unpickles",
        str(tmp_path / "missing.npy"): r"missing\.npy' does not exist",
    }
    for embeddings, message in expected.items():
        assert main(["evaluate-embeddings", "--embeddings", embeddings, "--labels", str(labels)]) == 1
        err = capsys.readouterr().err
        assert re.search(message, err), err
        assert "pickled data" not in err
