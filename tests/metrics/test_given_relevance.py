"""evaluate(..., relevance=...) against a float64 brute force written here from the definitions.

Integer-valued embeddings with the dot product give exact ties; ranks are pessimistic,
``rank(j) = 1 + #{k != j in Omega : s_k >= s_j}``; positives of the binary metrics are the items
with grade ``g > 0``; H-AP (TPAMI Eq. 18-20) and NDCG (Eq. 23, gains ``2^g - 1``) take the grade as
the level, ``L = G``. Queries without a relevant item are left out of every average.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from rankopt.metrics import evaluate
from rankopt.rank import Relevance

METRICS = ["recall@1", "recall@3", "precision@2", "map@r", "map", "mrr", "ndcg", "h-ap"]


def brute(scores: np.ndarray, grades: np.ndarray, excluded: np.ndarray, grade_max: int) -> dict[str, float]:
    """Average of each metric over the queries where it is defined, by loops over queries and items."""
    per: dict[str, list[float]] = {m: [] for m in METRICS}
    for i in range(scores.shape[0]):
        omega = [j for j in range(scores.shape[1]) if not excluded[i, j]]
        s, g = scores[i], grades[i]
        rank = {j: 1 + sum(1 for k in omega if k != j and s[k] >= s[j]) for j in omega}
        pos = [j for j in omega if g[j] > 0]
        if not pos:
            continue
        r = len(pos)
        rank_plus = {j: sum(1 for k in pos if s[k] >= s[j]) for j in pos}
        per["recall@1"].append(float(any(rank[j] <= 1 for j in pos)))
        per["recall@3"].append(float(any(rank[j] <= 3 for j in pos)))
        per["precision@2"].append(sum(rank[j] <= 2 for j in pos) / 2)
        per["map@r"].append(sum(rank_plus[j] / rank[j] for j in pos if rank[j] <= r) / r)
        per["map"].append(sum(rank_plus[j] / rank[j] for j in pos) / r)
        per["mrr"].append(1.0 / min(rank[j] for j in pos))
        gain = {j: 2.0 ** g[j] - 1.0 for j in omega}
        dcg = sum(gain[j] / math.log2(1 + rank[j]) for j in omega)
        ideal = sorted(gain.values(), reverse=True)
        per["ndcg"].append(dcg / sum(v / math.log2(2 + n) for n, v in enumerate(ideal)))
        size = {lv: sum(1 for j in omega if g[j] == lv) for lv in range(1, grade_max + 1)}
        rel = {j: (g[j] / grade_max) / size[g[j]] for j in pos}
        h_rank = {k: rel[k] + sum(min(rel[k], rel[j]) for j in pos if j != k and s[j] >= s[k]) for k in pos}
        per["h-ap"].append(sum(h_rank[k] / rank[k] for k in pos) / sum(rel.values()))
    return {m: (sum(v) / len(v) if v else math.nan) for m, v in per.items()}


def assert_same(got: dict[str, float], want: dict[str, float], tol: float = 1e-12) -> None:
    for name, value in want.items():
        if math.isnan(value):
            assert math.isnan(got[name]), name
        else:
            assert got[name] == pytest.approx(value, abs=tol), name


def tied_embeddings(rng: np.random.Generator, n: int, dim: int = 3) -> torch.Tensor:
    return torch.from_numpy(rng.integers(-1, 2, size=(n, dim)).astype(np.float64))


@pytest.mark.parametrize("seed", range(4))
def test_graded_matrix_self_retrieval_with_ties(seed):
    rng = np.random.default_rng(seed)
    n = 24
    x = tied_embeddings(rng, n)
    grades = rng.choice(4, size=(n, n), p=[0.7, 0.1, 0.1, 0.1])
    grades[:3] = 0  # queries without a relevant item
    grades[3, :] = 0
    grades[3, 3] = 2  # only its own item: excluded, hence no relevant item either
    excluded = np.eye(n, dtype=bool)
    want = brute((x @ x.T).numpy(), grades, excluded, 3)
    result = evaluate(x, None, metrics=METRICS, similarity="dot", relevance=Relevance.matrix(torch.from_numpy(grades)))
    assert_same(result.metrics, want)
    assert result.num_queries_without_positive == 4
    sparse = evaluate(x, None, metrics=METRICS, similarity="dot", chunk_size=5,
                      relevance=Relevance.matrix(torch.from_numpy(grades).to_sparse()))
    assert_same(sparse.metrics, result.metrics)


@pytest.mark.parametrize("graded", [False, True])
def test_multilabel_query_gallery_with_copies(graded):
    rng = np.random.default_rng(7)
    q, r, c = 9, 20, 5
    gallery_labels = (rng.random((r, c)) < 0.3).astype(np.int64)
    copies = rng.choice(r, size=q, replace=False)
    copies[:2] = -1
    query_labels = np.where(copies[:, None] >= 0, gallery_labels[copies.clip(0)], (rng.random((q, c)) < 0.3))
    query_labels[-1] = 0  # no label: no relevant item
    gallery = tied_embeddings(rng, r)
    query = torch.where(torch.from_numpy(copies[:, None] >= 0), gallery[copies.clip(0)], tied_embeddings(rng, q))
    shared = query_labels @ gallery_labels.T
    grades = shared if graded else (shared > 0).astype(np.int64)
    excluded = np.zeros((q, r), dtype=bool)
    excluded[np.arange(q)[copies >= 0], copies[copies >= 0]] = True
    grade_max = int(min(query_labels.sum(1).max(), gallery_labels.sum(1).max())) if graded else 1
    relevance = Relevance.multilabel(torch.from_numpy(query_labels).bool(), torch.from_numpy(gallery_labels).float(),
                                     graded=graded)
    assert relevance.grades == grade_max
    result = evaluate(query, None, gallery, metrics=METRICS, similarity="dot", relevance=relevance,
                      query_ref_index=torch.from_numpy(copies))
    assert_same(result.metrics, brute((query @ gallery.T).numpy(), grades, excluded, grade_max))
    assert result.num_queries_without_positive == int(((grades * ~excluded).sum(1) == 0).sum())


def test_function_equals_matrix_and_groups_are_excluded():
    rng = np.random.default_rng(3)
    n = 18
    x = tied_embeddings(rng, n)
    grades = torch.from_numpy(rng.choice(3, size=(n, n), p=[0.6, 0.2, 0.2]))
    groups = torch.from_numpy(rng.integers(-1, 4, size=n))
    calls = []

    def fn(rows, cols):
        calls.append(rows.numel())
        return grades[rows][:, cols].double()  # integer-valued floats are accepted

    by_fn = evaluate(x, None, metrics=METRICS, similarity="dot", chunk_size=4, query_groups=groups,
                     relevance=Relevance.function(fn, n, n, grades=2))
    by_matrix = evaluate(x, None, metrics=METRICS, similarity="dot", chunk_size=4, query_groups=groups,
                         relevance=Relevance.matrix(grades))
    assert by_fn.metrics == by_matrix.metrics and calls == [4, 4, 4, 4, 2]
    g = groups.numpy()
    excluded = np.eye(n, dtype=bool) | ((g[:, None] == g[None, :]) & (g[:, None] >= 0))
    assert_same(by_matrix.metrics, brute((x @ x.T).numpy(), grades.numpy(), excluded, 2))


@pytest.mark.parametrize("levels", [1, 2])
def test_labels_and_their_relevance_agree(levels):
    """Single labels -> a 0/1 matrix: every metric identical (the label path's compiled and chunked paths);
    two-level labels -> the multi-label grades {fine, coarse} (graded): the graded metrics identical."""
    rng = np.random.default_rng(11)
    n = 60
    x = torch.from_numpy(rng.normal(size=(n, 6)))
    fine = torch.from_numpy(rng.integers(0, 8, size=n))
    if levels == 1:
        same = (fine[:, None] == fine[None, :]).long()
        given = evaluate(x, None, metrics=METRICS, relevance=Relevance.matrix(same))
        for method in ("compiled", "reference"):
            binary = [m for m in METRICS if m not in ("ndcg", "h-ap")]
            by_labels = evaluate(x, fine, metrics=binary if method == "compiled" else METRICS, method=method)
            assert_same(given.metrics, by_labels.metrics, tol=1e-15)
        return
    labels = torch.stack([fine, fine // 3], 1)
    hot = torch.zeros(n, 8 + 3)
    hot[torch.arange(n), fine] = 1
    hot[torch.arange(n), 8 + fine // 3] = 1
    graded = ["ndcg", "h-ap", "sum_wap", "asi", "ap@level0", "ap@level1"]
    by_labels = evaluate(x, labels, metrics=graded)
    for relevance in (Relevance.multilabel(hot, graded=True), Relevance.labels(labels)):
        assert_same(evaluate(x, None, metrics=graded, relevance=relevance).metrics, by_labels.metrics, tol=1e-15)
    # binary metrics under a relevance: grade > 0 (here: the same coarse class), as labels of the coarse column
    coarse = evaluate(x, labels[:, 1], metrics=METRICS[:6])
    assert_same(evaluate(x, None, metrics=METRICS[:6], relevance=Relevance.multilabel(hot)).metrics, coarse.metrics,
                tol=1e-15)


def test_categories_with_relevance():
    rng = np.random.default_rng(5)
    x = torch.from_numpy(rng.normal(size=(16, 4)))
    grades = torch.from_numpy(rng.choice(2, size=(16, 16)))
    names = ["a" if i % 2 else "b" for i in range(16)]
    result = evaluate(x, None, metrics=["map"], relevance=Relevance.matrix(grades), query_categories=names)
    assert set(result.by_category) == {"a", "b"}
    alone = evaluate(x[1::2], None, x, metrics=["map"], relevance=Relevance.matrix(grades[1::2]),
                     query_ref_index=torch.arange(1, 16, 2))
    assert result.by_category["a"].metrics == pytest.approx(alone.metrics, abs=1e-12)


def test_bad_relevance_inputs_name_the_problem():
    x = torch.randn(5, 3)
    good = Relevance.matrix(torch.eye(5, dtype=torch.long))
    with pytest.raises(ValueError, match="either labels or relevance"):
        evaluate(x, torch.arange(5), relevance=good)
    with pytest.raises(ValueError, match=r"relevance is 4 x 5 .* need 5 x 5"):
        evaluate(x, None, relevance=Relevance.matrix(torch.zeros(4, 5)))
    with pytest.raises(ValueError, match="chunked torch path only; remove method='compiled'"):
        evaluate(x, None, relevance=good, method="compiled")
    with pytest.raises(ValueError, match="non-negative integer grades"):
        Relevance.matrix(torch.full((5, 5), 0.5))
    with pytest.raises(ValueError, match=r"0/1 multi-hot \(N, C\) matrix; rows \[1\]"):
        Relevance.multilabel(torch.tensor([[1, 0], [2, 0]]))
    with pytest.raises(ValueError, match=r"relevance function returned shape \(5,\)"):
        evaluate(x, None, relevance=Relevance.function(lambda rows, cols: torch.zeros(rows.numel()), 5, 5))
    with pytest.raises(ValueError, match="grades above grades=1"):
        evaluate(x, None, relevance=Relevance.function(lambda rows, cols: torch.full((len(rows), len(cols)), 2), 5, 5))
    with pytest.raises(TypeError, match="rankopt.rank.Relevance"):
        evaluate(x, None, relevance=torch.eye(5))
    with pytest.raises(ValueError, match="ap@level2"):
        evaluate(x, None, metrics=["ap@level2"], relevance=Relevance.matrix(2 * torch.eye(5, dtype=torch.long)))


def test_cli_multilabels_and_relevance_files(tmp_path, capsys):
    from rankopt.cli import main

    rng = np.random.default_rng(8)
    n = 20
    x = rng.normal(size=(n, 4)).astype(np.float32)
    hot = (rng.random((n, 5)) < 0.3).astype(np.uint8)
    grades = (hot.astype(np.int64) @ hot.T.astype(np.int64))
    files = {k: str(tmp_path / f"{k}.npy") for k in ("e", "m", "r")}
    np.save(files["e"], x), np.save(files["m"], hot), np.save(files["r"], grades)
    rows, cols = np.nonzero(grades)
    np.savez(tmp_path / "r.npz", row=rows, col=cols, data=grades[rows, cols], shape=np.array(grades.shape))
    indptr = np.concatenate([[0], np.cumsum((grades > 0).sum(1))])
    np.savez(tmp_path / "csr.npz", indices=cols, indptr=indptr, data=grades[rows, cols], shape=np.array(grades.shape),
             format=np.array("csr"))
    want = evaluate(torch.from_numpy(x), None, metrics=METRICS,
                    relevance=Relevance.multilabel(torch.from_numpy(hot), graded=True)).metrics
    base = ["evaluate-embeddings", "--embeddings", files["e"], "--metrics", *METRICS, "--json"]
    for i, given in enumerate((["--multilabels", files["m"], "--graded"], ["--relevance", files["r"]],
                               ["--relevance", str(tmp_path / "r.npz")], ["--relevance", str(tmp_path / "csr.npz")])):
        out = tmp_path / f"out{i}.json"
        assert main([*base, str(out), *given]) == 0, capsys.readouterr().err
        assert json.loads(out.read_text())["metrics"] == pytest.approx(want, abs=1e-12)
    capsys.readouterr()
    assert main(["evaluate-embeddings", "--embeddings", files["e"], "--multilabels", files["m"], "--relevance",
                 files["r"]]) == 1
    assert "give one of --labels, --multilabels, --relevance" in capsys.readouterr().err
    np.save(files["r"], grades[:5])
    assert main(["evaluate-embeddings", "--embeddings", files["e"], "--relevance", files["r"]]) == 1
    assert "relevance is 5 x 20 (matrix) but the queries x the gallery" in capsys.readouterr().err


def test_csv_labels_column_gives_a_multi_hot_matrix(tmp_path):
    from PIL import Image

    from rankopt.data import build_dataset

    rows = ["0,a.png,test,cat|outdoor", "0,b.png,test,cat", "1,c.png,test,", "1,d.png,test,dog | outdoor"]
    for row in rows:
        Image.new("RGB", (8, 8), (len(row) * 9 % 256, 10, 10)).save(tmp_path / row.split(",")[1])
    (tmp_path / "df.csv").write_text("label,path,split,labels\n" + "\n".join(rows) + "\n")
    test = build_dataset("csv", tmp_path / "df.csv", "test")
    assert test.metadata["multilabel_names"] == ("cat", "dog", "outdoor")
    assert test.metadata["multilabels"].tolist() == [[1, 0, 1], [1, 0, 0], [0, 0, 0], [0, 1, 1]]
    (tmp_path / "semi.csv").write_text("label,path,split,labels\n0,a.png,test,cat;outdoor\n0,b.png,test,cat\n")
    semi = build_dataset("csv", tmp_path / "semi.csv", "all", labels_separator=";")
    assert semi.metadata["multilabels"].tolist() == [[1, 1], [1, 0]]
    grades = Relevance.multilabel(torch.from_numpy(test.metadata["multilabels"]), graded=True).block(slice(None))
    assert grades.tolist() == [[2, 1, 0, 1], [1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 0, 2]]
