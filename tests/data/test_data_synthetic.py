"""The embedded SYNTHETIC default dataset: counts, hierarchy, open-set split, determinism, cache repair."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from rankopt.data import build_dataset, dataset_spec, evaluation_splits
from rankopt.data.synthetic import FAMILIES, SHAPES, SHAPE_NAMES, class_table, ensure_generated, render


def _variant_ids(ds) -> np.ndarray:
    """Raw variant id of each item, read from its folder name ``NNN_colour_texture_shape``."""
    return np.array([int(Path(p).parent.name.split("_")[0]) for p in ds.paths])


def test_counts_and_levels(synthetic_train, synthetic_test):
    for ds in (synthetic_train, synthetic_test):
        assert len(ds) == 3200
        assert ds.labels.dtype == np.int64 and ds.labels.shape == (3200, 3)
        assert ds.level_names == ("synthetic_variant", "synthetic_shape", "synthetic_family")
        assert ds.metadata["synthetic"] is True
        counts = np.bincount(ds.labels[:, 0])
        assert counts.size == 200 and counts.min() >= 12
        # contiguous ids per level
        for level, k in enumerate((200, 20, 4)):
            assert np.array_equal(np.unique(ds.labels[:, level]), np.arange(k))
    assert evaluation_splits("synthetic") == ("test",)
    assert "SYNTHETIC" in dataset_spec("synthetic").description


def test_open_set_disjoint_fine_classes(synthetic_train, synthetic_test):
    train, test = set(_variant_ids(synthetic_train)), set(_variant_ids(synthetic_test))
    assert len(train) == len(test) == 200
    assert not train & test


def test_hierarchy_consistent_with_generator(synthetic_train):
    ds = synthetic_train
    variants = _variant_ids(ds)
    table = {c["variant"]: c for c in class_table(0)}
    for level in (1, 2):  # each fine class sits under exactly one coarser label
        pairs = {(f, c) for f, c in zip(ds.labels[:, 0].tolist(), ds.labels[:, level].tolist())}
        assert len(pairs) == 200
    # the remapped shape/family ids follow the generator's table (sorted raw ids)
    raw_shape = np.array([table[v]["shape"] for v in variants])
    raw_family = np.array([FAMILIES.index(SHAPES[SHAPE_NAMES[s]][0]) for s in raw_shape])
    assert np.array_equal(ds.labels[:, 1], raw_shape)
    assert np.array_equal(ds.labels[:, 2], raw_family)


def test_images_are_rgb_and_differ_within_a_class(synthetic_train):
    ds = synthetic_train
    members = np.flatnonzero(ds.labels[:, 0] == 0)
    imgs = np.stack([np.asarray(Image.open(ds.paths[i]), dtype=np.float32) for i in members])
    assert imgs.shape[1:] == (56, 56, 3)
    diffs = np.abs(imgs[:, None] - imgs[None]).mean(axis=(2, 3, 4))
    off_diag = diffs[~np.eye(len(members), dtype=bool)]
    assert off_diag.min() > 5.0  # nuisance variation: no two images of a class are near-identical
    item = ds[int(members[0])]
    assert item["image"].shape == (3, 56, 56) and item["label"].tolist() == ds.labels[members[0]].tolist()


def test_deterministic_from_seed(synthetic_root, synthetic_train):
    folder, manifest = ensure_generated(synthetic_root)
    table = class_table(0)
    for cls in (table[0], table[123], table[399]):
        rng = np.random.default_rng([0, cls["variant"]])
        first = render(cls, rng, 56)
        stored = np.asarray(Image.open(folder / cls["split"] / f"{cls['variant']:03d}_{cls['name']}" / "00.png"))
        assert np.array_equal(first, stored)
    assert manifest["seed"] == 0 and manifest["version"] >= 1
    # another seed changes the open-set split of the variants
    assert [c["split"] for c in class_table(1)] != [c["split"] for c in table]


def test_pixel_retrieval_is_poor_but_above_chance(synthetic_test):
    """Raw-pixel nearest neighbour (a stand-in for an untrained network) leaves room to learn."""
    ds = synthetic_test
    x = np.stack([np.asarray(Image.open(p), dtype=np.float32).ravel() for p in ds.paths])
    x -= x.mean(1, keepdims=True)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    s = x @ x.T
    np.fill_diagonal(s, -np.inf)
    r_at_1 = float((ds.labels[s.argmax(1), 0] == ds.labels[:, 0]).mean())
    assert 15 / 3199 < r_at_1 < 0.3


def test_incomplete_or_corrupt_cache_is_regenerated(tmp_path):
    folder, manifest = ensure_generated(tmp_path, seed=3, images_per_class=2, image_size=16)
    victim = folder / manifest["items"][5][0]
    original = victim.read_bytes()
    victim.write_bytes(original[: len(original) // 2])  # truncated file
    (folder / manifest["items"][7][0]).unlink()  # missing file
    ds = build_dataset("synthetic", tmp_path, "train", seed=3, images_per_class=2, image_size=16)
    assert victim.read_bytes() == original
    assert len(ds) == 400
    (folder / "manifest.json").write_text(json.dumps({"version": -1}))  # stale manifest
    ensure_generated(tmp_path, seed=3, images_per_class=2, image_size=16)
    assert json.loads((folder / "manifest.json").read_text())["version"] == manifest["version"]


def test_bad_arguments():
    with pytest.raises(ValueError, match="split"):
        build_dataset("synthetic", None, "query")
    with pytest.raises(ValueError, match="images_per_class"):
        ensure_generated(None, images_per_class=1)
