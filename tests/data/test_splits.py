"""Class-disjoint validation splits (rankopt.data.splits)."""

from __future__ import annotations

import numpy as np
import pytest

from rankopt.data.base import RetrievalDataset
from rankopt.data.splits import carve_validation, held_out_classes


def _dataset() -> RetrievalDataset:
    fine = np.repeat(np.arange(40), 3)
    labels = np.stack([fine, fine // 4], axis=1)  # 10 coarse groups of 4 classes
    return RetrievalDataset([f"/x/{i}.png" for i in range(120)], labels, "train", ("fine", "coarse"))


def test_carving_holds_out_whole_coarse_classes_deterministically():
    ds = _dataset()
    train, val = carve_validation(ds, 0.2, seed=3)
    assert len(train) + len(val) == 120 and len(val) == 2 * 4 * 3
    coarse = lambda part: {int(p.split("/")[-1][:-4]) // 12 for p in part.paths}  # noqa: E731
    assert not coarse(train) & coarse(val)
    assert set(train.paths).isdisjoint(val.paths)
    assert val.split == "validation" and train.split == "train"
    for part in (train, val):  # labels remapped to 0..K-1 per level
        for c in range(2):
            assert np.array_equal(np.unique(part.labels[:, c]), np.arange(np.unique(part.labels[:, c]).size))
    again = carve_validation(ds, 0.2, seed=3)[1]
    assert again.paths == val.paths
    assert carve_validation(ds, 0.2, seed=4)[1].paths != val.paths


def test_fine_level_and_bounds():
    labels = np.stack([np.repeat(np.arange(5), 2), np.zeros(10, int)], axis=1)
    assert held_out_classes(labels, 0.01, level=0).size == 1  # at least one
    assert held_out_classes(labels, 0.99, level=0).size == 4  # at most K - 1
    with pytest.raises(ValueError, match="1 class"):
        held_out_classes(labels, 0.5)  # the coarsest level has a single class
    with pytest.raises(ValueError, match="fraction"):
        held_out_classes(labels, 1.0)


def test_subset_carries_per_item_metadata_landmarks_and_item_tables():
    """IJB-C-style metadata follows its items: per-item rows selected, table rows of kept items renumbered."""
    from rankopt.data.base import ITEM_METADATA, RetrievalDataset
    from rankopt.data.splits import subset

    media = np.array([10, 10, 11, 12])
    templates = np.array([[7, 0], [7, 2], [8, 3], [8, 1]])  # (template, item)
    points = np.arange(10, dtype=np.float64).reshape(5, 2)
    dataset = RetrievalDataset([f"p{i}" for i in range(4)], np.array([[0], [0], [1], [2]]), "test", ("subject",),
                               metadata={"media": media, "templates": templates,
                                         ITEM_METADATA: {"rows": ["media"], "tables": ["templates"]}},
                               landmarks={2: points}, align_size=56)
    part = subset(dataset, [2, 0], "part")
    np.testing.assert_array_equal(part.metadata["media"], [11, 10])
    np.testing.assert_array_equal(part.metadata["templates"], [[7, 1], [7, 0]])  # item 3 (template 8) and 1 left out
    assert set(part.landmarks) == {0} and np.array_equal(part.landmarks[0], points) and part.align_size == 56
    assert part.metadata[ITEM_METADATA] == {"rows": ["media"], "tables": ["templates"]}
