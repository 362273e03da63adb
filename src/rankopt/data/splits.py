"""Class-disjoint validation splits carved from a training split (open-set protocol).

Hyper-parameters are chosen on classes the model never trains on *and* that are not the
test classes: :func:`carve_validation` holds out whole classes of one label level (for
Omniglot, whole alphabets) from the training split::

    train, validation = carve_validation(build_dataset("omniglot", root, "train"), fraction=0.2)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rankopt.data.base import ITEM_METADATA, RetrievalDataset, remap_labels, select_item_metadata


def held_out_classes(labels: np.ndarray, fraction: float, *, level: int = -1, seed: int = 0) -> np.ndarray:
    """The classes of label column ``level`` to hold out: ``round(fraction * K)`` of the ``K`` classes
    (at least 1, at most ``K - 1``), drawn with ``seed``; sorted."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"validation fraction must be in (0, 1), got {fraction}")
    labels = np.asarray(labels)
    column = labels[:, level] if labels.ndim == 2 else labels
    classes = np.unique(column)
    if classes.size < 2:
        raise ValueError(f"cannot hold out classes of level {level}: the split has {classes.size} class")
    count = min(max(1, round(fraction * classes.size)), classes.size - 1)
    return np.sort(np.random.default_rng(seed).permutation(classes)[:count])


def subset(dataset: RetrievalDataset, indices: Sequence[int] | np.ndarray, split: str) -> RetrievalDataset:
    """Items ``indices`` of ``dataset`` as a new dataset named ``split``, labels remapped to ``0..K-1``;
    boxes, landmarks and per-item metadata (IJB-C media, template tables) follow their items."""
    rows = np.asarray(indices, dtype=np.int64)
    if rows.size == 0:
        raise ValueError(f"split {split!r} of {dataset.name!r} would be empty")
    position = {int(r): i for i, r in enumerate(rows)}
    kinds = dataset.metadata.get(ITEM_METADATA, {"rows": [], "tables": []})
    metadata = {**dataset.metadata, "carved_from": dataset.split,
                **select_item_metadata({k: dataset.metadata[k] for k in kinds["rows"]},
                                       {k: dataset.metadata[k] for k in kinds["tables"]}, rows, len(dataset))}
    if "label_names" in metadata:  # the kept ids, in the order remap_labels gives them
        kept = [np.unique(dataset.labels[rows, level]) for level in range(dataset.num_levels)]
        metadata["label_names"] = [[names[i] for i in ids] for names, ids in zip(metadata["label_names"], kept)]
    return RetrievalDataset(
        [dataset.paths[r] for r in rows], remap_labels(dataset.labels[rows]), split, dataset.level_names,
        dataset.transform, name=dataset.name, sources=[dataset.sources[r] for r in rows],
        boxes={position[r]: b for r, b in dataset.boxes.items() if r in position}, metadata=metadata,
        landmarks={position[r]: p for r, p in dataset.landmarks.items() if r in position},
        align_size=dataset.align_size,
    )


def carve_validation(
    dataset: RetrievalDataset, fraction: float, *, level: int = -1, seed: int = 0
) -> tuple[RetrievalDataset, RetrievalDataset]:
    """``(train, validation)``: the items whose level-``level`` class is held out
    (:func:`held_out_classes`) form the validation split, the rest the training split.
    No finest class appears in both."""
    column = dataset.labels[:, level]
    held = np.isin(column, held_out_classes(dataset.labels, fraction, level=level, seed=seed))
    return subset(dataset, np.flatnonzero(~held), "train"), subset(dataset, np.flatnonzero(held), "validation")
