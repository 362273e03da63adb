"""The photos of a fit: read and checked before any heavy work, and their classes split for validation.

``PHOTOS`` is a class-folder tree (``image_folder``'s ``all`` split: every image, labelled by its folder) or a
CSV in open-metric-learning's format (``csv``: every row of every split). Every image is opened first (the
``dataset-info --verify`` checks); a missing, unreadable or empty file, an empty class, or a malformed table is
refused with the list of every problem, before a model is loaded.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rankopt.data import DatasetProblems, build_dataset
from rankopt.data.base import RetrievalDataset
from rankopt.data.splits import held_out_classes, subset
from rankopt.files import write_text_atomic

MIN_CLASSES = 4
"""Fewest classes a fit accepts: validation holds out at least 2 whole classes and training keeps 2."""


@dataclass
class Photos:
    """Every photo (``dataset``, with the test transform), its finest label and the validation mask:
    ``validation[i]`` when photo ``i``'s class is held out."""

    dataset: RetrievalDataset
    labels: np.ndarray
    class_names: list[str]
    validation: np.ndarray

    @property
    def training(self) -> np.ndarray:
        return ~self.validation

    def part(self, mask: np.ndarray, name: str) -> RetrievalDataset:
        """The photos of ``mask`` as a dataset split named ``name``."""
        return subset(self.dataset, np.flatnonzero(mask), name)

    def summary(self) -> str:
        held = np.unique(self.labels[self.validation]).size
        return (f"{len(self.labels):,} photos in {len(self.class_names)} classes; {held} classes "
                f"({int(self.validation.sum()):,} photos) held out for validation")


def read_photos(source: str | os.PathLike[str], transform: Any) -> RetrievalDataset:
    """Every photo of ``source`` (a class-folder tree or an OML CSV), each opened once to check it.
    :class:`~rankopt.data.DatasetProblems` lists every bad file; a folder without classes is a ``ValueError``."""
    path = Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"photos {str(path)!r} do not exist")
    name = "csv" if path.is_file() else "image_folder"
    if name == "csv" and path.suffix.lower() != ".csv":
        raise ValueError(f"photos {str(path)!r}: give a folder of class folders or a .csv table")
    with warnings.catch_warnings():  # the bad files are raised below, every one named
        warnings.simplefilter("ignore", UserWarning)
        dataset = build_dataset(name, path, "all", transform=transform, on_bad_image="skip", verify_images=True)
    if dataset.metadata["bad_images"]:
        raise DatasetProblems(name, list(dataset.metadata["bad_images"]), [])
    if len(dataset) == 0:
        raise ValueError(f"no photos found under {str(path)!r}")
    labelled = np.asarray(dataset.labels)[:, 0] >= 0
    if not labelled.all():
        loose = [dataset.paths[i] for i in np.flatnonzero(~labelled)[:5]]
        raise DatasetProblems(name, [f"{p}: not in a class folder (put each photo in its class's folder)"
                                     for p in loose], [])
    return dataset


def split_photos(dataset: RetrievalDataset, fraction: float, seed: int) -> Photos:
    """Hold out ``fraction`` of the classes (at least 2, each with 2+ photos so that it can be queried),
    drawn with ``seed``; the rest train."""
    labels = np.asarray(dataset.labels)[:, 0]
    names = list(dataset.metadata.get("label_names", [[]])[0]) or [str(c) for c in np.unique(labels)]
    classes, counts = np.unique(labels, return_counts=True)
    if classes.size < MIN_CLASSES:
        raise ValueError(f"{classes.size} class(es): a fit needs at least {MIN_CLASSES} classes (2 to validate on, "
                         "2 to train on), each in its own folder")
    queryable = classes[counts >= 2]
    if queryable.size < 2:
        raise ValueError("fewer than 2 classes have 2 or more photos: nothing to validate on")
    wanted = max(2, round(fraction * classes.size))
    held = held_out_classes(queryable, min(wanted, queryable.size - 1) / queryable.size, seed=seed)
    return Photos(dataset, labels, names, np.isin(labels, held))


def save_split(photos: Photos, folder: str | os.PathLike[str]) -> None:
    """``folder/classes/{train,validation}.txt``: one class name per line."""
    for side, mask in (("train", photos.training), ("validation", photos.validation)):
        names = sorted({photos.class_names[c] for c in np.unique(photos.labels[mask])})
        write_text_atomic(Path(folder) / "classes" / f"{side}.txt", "".join(f"{n}\n" for n in names))
