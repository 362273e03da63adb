"""The labels of an index: class names per level, labels merged by name, labels of query images by folder."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath

import torch

from rankopt.data.base import RetrievalDataset
from rankopt.search.result import LabelNames


def default_level_names(levels: int) -> tuple[str, ...]:
    return ("class", *(f"level{c}" for c in range(1, levels)))


def dataset_label_names(dataset: RetrievalDataset) -> LabelNames | None:
    """Class names by label id at each level (``dataset.metadata["label_names"]``, which the data loaders
    fill from the raw labels: :func:`rankopt.data.base.label_names`); ``None``: bare ids."""
    given = dataset.metadata.get("label_names")
    return None if given is None else [list(level) for level in given]


def merge_labels(labels: torch.Tensor, names: LabelNames | None, index_names: LabelNames | None,
                 levels: int) -> torch.Tensor:
    """``labels`` (with class ``names``) in the index's label ids: translated by class name when both sides
    have names, a name the index lacks appended to ``index_names`` (in place)."""
    if bool((labels < 0).all()):
        return torch.full((labels.shape[0], levels), -1, dtype=torch.long)
    if labels.shape[1] != levels:
        raise ValueError(f"the added labels have {labels.shape[1]} levels, the index's {levels}")
    if (index_names is None) != (names is None):
        raise ValueError("the index's labels are class names and the additions' are bare ids, or the reverse: "
                         "they cannot be matched")
    if names is None or index_names is None:
        return labels
    out = labels.clone()
    for level in range(levels):
        known = {name: i for i, name in enumerate(index_names[level])}
        for label in labels[:, level].unique().tolist():
            if label >= 0:
                name = names[level][label]
                if name not in known:
                    known[name] = len(index_names[level])
                    index_names[level].append(name)
                out[labels[:, level] == label, level] = known[name]
    return out


def labels_of_paths(paths: Sequence[str], labels: torch.Tensor, names: LabelNames | None) -> torch.Tensor:
    """``(Q, L)`` labels of images given by path: an image lying in a folder whose trailing path components
    name a class of the index (``.../a/1/x.png`` and class ``a/1``) gets that class's labels (``labels``: the
    index's), any other ``-1``."""
    out = torch.full((len(paths), labels.shape[1]), -1, dtype=torch.long)
    if names is None:
        return out
    finest = {name: i for i, name in enumerate(names[0])}
    rows = {int(label): row for row, label in reversed(list(enumerate(labels[:, 0].tolist())))}
    for q, path in enumerate(paths):
        parts = PurePath(path).parent.parts
        for depth in range(1, len(parts) + 1):
            label = finest.get("/".join(parts[-depth:]))
            if label is not None and label in rows:
                out[q] = labels[rows[label]]
                break
    return out


def label_texts(labels: torch.Tensor, names: LabelNames | None) -> list[str | int | None]:
    """The finest label of each row as its class name (or id; ``None`` for ``-1``)."""
    return [None if v < 0 else names[0][v] if names is not None else v for v in labels[:, 0].tolist()]
