"""Datasets (native on-disk formats + the synthetic default), samplers and transforms.

``build_dataset(name, root, split, transform=None, **kwargs)`` returns a
:class:`RetrievalDataset` with ``(N, L)`` int64 labels, column 0 the finest level.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

# Importing the loader modules registers their datasets.
from rankopt.data import (  # noqa: F401
    caltech101, cars, csv_dataset, cub, dyml, ijbc, image_folder, inaturalist, inshop, landmark_datasets, omniglot,
    sop, synthetic, vehicleid, vggface2, yaleb,
)
from rankopt.data.base import (
    DATASETS, SPECS, BadImageError, DatasetProblems, DatasetSpec, LabelFileError, RetrievalDataset,
)
from rankopt.data.samplers import HierarchicalBatchSampler, MPerClassBatchSampler, build_batch_sampler

__all__ = [
    "DATASETS",
    "BadImageError",
    "DatasetProblems",
    "DatasetSpec",
    "HierarchicalBatchSampler",
    "LabelFileError",
    "MPerClassBatchSampler",
    "RetrievalDataset",
    "build_batch_sampler",
    "build_dataset",
    "dataset_spec",
    "evaluation_splits",
]


def dataset_spec(name: str) -> DatasetSpec:
    """The registered :class:`DatasetSpec` (clear error listing the known names)."""
    DATASETS.get(name)
    return SPECS[name.lower()]


def build_dataset(
    name: str,
    root: str | os.PathLike[str] | None,
    split: str,
    transform: Callable[..., Any] | None = None,
    **kwargs: Any,
) -> RetrievalDataset:
    """Read dataset ``name`` from its native files under ``root`` (``None`` for ``synthetic``)."""
    return dataset_spec(name)(root, split, transform, **kwargs)


def evaluation_splits(name: str, root: str | os.PathLike[str] | None = None, **kwargs: Any) -> tuple[str, ...]:
    """``("test",)`` for self-retrieval (leave-one-out) datasets, ``("query", "gallery")`` otherwise.

    Datasets whose splits depend on the files (``image_folder``, ``csv``) read them from ``root``
    (with the loader's ``kwargs``); without ``root`` their default is returned."""
    return dataset_spec(name).splits_of(root, **kwargs)[1]
