"""Retrieval neighbours vs a float64 brute force from the definition; grid PNGs."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
import torch
from PIL import Image

from rankopt.viz import plot_retrieval_grid, retrieval_neighbours
from rankopt.viz.retrieval_grid import CELL_INCHES, HEADER_INCHES

from .viz_helpers import clusters, expected_pixels, png_size, synthetic_hier


def brute_top_k(q, ql, r, rl, k, same_set, kind="cosine"):
    """Loop over queries in float64: sort references by (-score, index), query itself dropped by index."""
    q, r = q.double().numpy(), r.double().numpy()
    if kind == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        r = r / np.linalg.norm(r, axis=1, keepdims=True)
    qlm = ql.reshape(len(q), -1).numpy()
    rlm = rl.reshape(len(r), -1).numpy()
    idx, scores, levels = [], [], []
    for i in range(len(q)):
        cands = [(-float(q[i] @ r[j]), j) for j in range(len(r)) if not (same_set and j == i)]
        top = [j for _, j in sorted(cands)[:k]]
        idx.append(top)
        scores.append([float(q[i] @ r[j]) for j in top])
        levels.append([int((qlm[i] == rlm[j]).sum()) for j in top])
    return np.array(idx), np.array(scores), np.array(levels)


@pytest.mark.parametrize("same_set", [True, False])
def test_neighbours_match_brute_force(same_set):
    x, labels = synthetic_hier()
    if same_set:
        nb = retrieval_neighbours(x, labels, top_k=5)
        ref = brute_top_k(x, labels, x, labels, 5, True)
    else:
        q, ql, r, rl = x[:20], labels[:20], x[20:], labels[20:]
        nb = retrieval_neighbours(q, ql, r, rl, top_k=5)
        ref = brute_top_k(q, ql, r, rl, 5, False)
    np.testing.assert_array_equal(nb.indices.numpy(), ref[0])
    np.testing.assert_allclose(nb.scores.numpy(), ref[1], atol=1e-5)
    np.testing.assert_array_equal(nb.levels.numpy(), ref[2])


def test_self_excluded_by_index_not_by_rank():
    """Exact duplicates: the query's twin (same score as the query itself) must be retrieved first,
    and the query itself never; equal scores are ordered by reference index."""
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    labels = torch.tensor([0, 0, 1, 1])
    nb = retrieval_neighbours(x, labels, top_k=3, similarity="dot")
    assert nb.indices.tolist() == [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]]
    assert not bool((nb.indices == torch.arange(4)[:, None]).any())


def test_neighbours_subset_and_top_k_clipped():
    x, labels = clusters(3, 2, seed=3)
    nb = retrieval_neighbours(x, labels, query_indices=[4, 1], top_k=50)
    ref = brute_top_k(x, labels, x, labels, 50, True)
    assert nb.indices.shape == (2, 5)
    np.testing.assert_array_equal(nb.indices.numpy(), ref[0][[4, 1]])


@pytest.mark.parametrize(
    "kwargs, err",
    [
        (dict(query_embeddings=torch.zeros(0, 4), query_labels=torch.zeros(0, dtype=torch.long)), "query_embeddings has 0 rows"),
        (dict(query_embeddings=torch.ones(1, 4), query_labels=torch.zeros(1, dtype=torch.long)), "at least 2 needed"),
        (dict(query_embeddings=torch.ones(3, 4), query_labels=torch.zeros(2, dtype=torch.long)), "query_labels has 2 rows"),
        (dict(query_embeddings=torch.ones(3, 4), query_labels=torch.zeros(3, dtype=torch.long), ref_embeddings=torch.ones(2, 4)), "without ref_labels"),
        (dict(query_embeddings=torch.tensor([[0.0, float("nan")], [1.0, 1.0]]), query_labels=torch.zeros(2, dtype=torch.long)), "NaN"),
    ],
)
def test_bad_input_names_the_problem(kwargs, err):
    with pytest.raises(ValueError, match=err):
        retrieval_neighbours(**kwargs)
    with pytest.raises(ValueError, match=err):
        plot_retrieval_grid("unused.png", *kwargs.values())


def test_grid_uses_true_top_k_and_has_expected_size(tmp_path):
    x, labels = synthetic_hier()
    grid = plot_retrieval_grid(tmp_path / "g.png", x, labels, num_queries=4, top_k=6, seed=3, level_names=("class", "super"), title_note="synthetic")
    assert png_size(grid.path) == expected_pixels(CELL_INCHES * 7, CELL_INCHES * 4 + HEADER_INCHES)
    ref = brute_top_k(x, labels, x, labels, 6, True)
    rows = grid.neighbours.query_indices.numpy()
    assert len(set(rows.tolist())) == 4
    np.testing.assert_array_equal(grid.neighbours.indices.numpy(), ref[0][rows])
    again = plot_retrieval_grid(tmp_path / "g2.png", x, labels, num_queries=4, top_k=1, seed=3)  # queries depend on the seed only
    assert torch.equal(again.neighbours.query_indices, grid.neighbours.query_indices)


def test_grid_prefers_queries_with_a_positive(tmp_path):
    x, _ = clusters(10, 2, seed=2)
    labels = torch.tensor([0, 0, 1, 1] + list(range(2, 18)))  # only rows 0-3 have a same-class item
    grid = plot_retrieval_grid(tmp_path / "g.png", x, labels, num_queries=3, top_k=2)
    assert set(grid.neighbours.query_indices.tolist()) <= {0, 1, 2, 3}


def test_grid_tiny_single_class_and_separate_gallery(tmp_path):
    x, labels = clusters(1, 3, seed=0)
    grid = plot_retrieval_grid(tmp_path / "tiny.png", x, labels, num_queries=8, top_k=8)
    assert grid.neighbours.indices.shape == (3, 2)
    assert png_size(grid.path) == expected_pixels(CELL_INCHES * 3, CELL_INCHES * 3 + HEADER_INCHES)
    grid = plot_retrieval_grid(tmp_path / "sep.png", x[:1], labels[:1], x[1:], labels[1:], num_queries=8, top_k=8)
    assert grid.neighbours.indices.tolist() == [[0, 1]] or grid.neighbours.indices.tolist() == [[1, 0]]


def test_grid_with_image_thumbnails(tmp_path):
    x, labels = clusters(3, 3, seed=4)
    paths = []
    for i in range(len(x)):
        path = tmp_path / f"img{i}.png"
        Image.new("L", (105, 105), color=int(25 * i)).save(path)
        paths.append(str(path))
    grid = plot_retrieval_grid(tmp_path / "thumbs.png", x, labels, query_paths=paths, num_queries=2, top_k=3)
    assert png_size(grid.path) == expected_pixels(CELL_INCHES * 4, CELL_INCHES * 2 + HEADER_INCHES)
    with pytest.raises(ValueError, match="query_paths has 2 entries"):
        plot_retrieval_grid(tmp_path / "bad.png", x, labels, query_paths=paths[:2])
    with pytest.raises(FileNotFoundError, match="missing.png"):
        plot_retrieval_grid(tmp_path / "bad.png", x, labels, query_paths=[str(tmp_path / "missing.png")] * len(x))


def test_grid_reads_zip_members_like_rankopt_datasets(tmp_path):
    """rankopt datasets list images inside archives as ``archive.zip/member.png``."""
    x, labels = clusters(2, 2, seed=6)
    archive = tmp_path / "imgs.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for i in range(len(x)):
            buf = io.BytesIO()
            Image.new("1", (105, 105), color=i % 2).save(buf, format="PNG")
            zf.writestr(f"imgs/{i}.png", buf.getvalue())
    paths = [f"{archive}/imgs/{i}.png" for i in range(len(x))]
    grid = plot_retrieval_grid(tmp_path / "zip.png", x, labels, query_paths=paths, num_queries=2, top_k=3)
    assert png_size(grid.path) == expected_pixels(CELL_INCHES * 4, CELL_INCHES * 2 + HEADER_INCHES)


def test_grid_on_real_omniglot(omniglot, tmp_path):
    """Real data: 60 Omniglot drawings (3 characters x 20 drawers), raw-pixel embeddings."""
    from rankopt.data import build_dataset

    ds = build_dataset("omniglot", omniglot, "train", train_set="background_small1")
    rows = np.flatnonzero(ds.labels[:, 0] < 3)
    pixels = torch.stack([1.0 - torch.from_numpy(np.asarray(ds.load(i).convert("L").resize((28, 28)), dtype=np.float32) / 255).flatten() for i in rows])
    labels = torch.from_numpy(ds.labels[rows])
    grid = plot_retrieval_grid(tmp_path / "omniglot.png", pixels, labels, query_paths=[ds.paths[i] for i in rows], level_names=ds.level_names, num_queries=4, top_k=6, title_note="Omniglot, raw pixels")
    ref = brute_top_k(pixels, labels, pixels, labels, 6, True)
    np.testing.assert_array_equal(grid.neighbours.indices.numpy(), ref[0][grid.neighbours.query_indices.numpy()])
    assert png_size(grid.path) == expected_pixels(CELL_INCHES * 7, CELL_INCHES * 4 + HEADER_INCHES)
