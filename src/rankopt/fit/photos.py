"""The photos of a fit: read and checked before any heavy work, and split for validation.

``PHOTOS`` is a class-folder tree (``image_folder``'s ``all`` split with torchvision ``ImageFolder``'s convention:
a class is a folder in ``PHOTOS``, every image below it, sub-folders included, is of that class; an empty class
folder is left out and said), a flat folder of photos (no classes: :mod:`rankopt.fit.flat`) or a CSV in open-metric-learning's format (``csv``: every row of every split). Every image is decoded first, in
parallel (:func:`rankopt.data.image_files.undecodable`: a truncated file is caught, not only a bad header); a
missing, empty or unreadable photo is left out and listed (``strict``: refused, with every bad file named), and an
empty class or a malformed table is refused with the list of every problem, before a model is loaded. The split
for validation is :func:`rankopt.fit.validation.make_split`'s.
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
from rankopt.data.image_folder import scan_folder
from rankopt.data.near_duplicates import duplicate_groups, grouped_count, photo_hashes
from rankopt.data.readable import readable_images
from rankopt.data.splits import subset
from rankopt.files import write_text_atomic
from rankopt.fit.validation import KNOWN_FRACTION, ValidationSplit, make_split


@dataclass
class Photos:
    """Every photo (``dataset``, with the test transform), its finest label, class names and the validation split
    (:mod:`rankopt.fit.validation`)."""

    dataset: RetrievalDataset
    labels: np.ndarray
    class_names: list[str]
    split: ValidationSplit
    near_duplicates: int = 0
    """Photos with a near-duplicate of their class in the folder (kept on one side of every split)."""

    def part(self, rows: np.ndarray, name: str) -> RetrievalDataset:
        """The photos ``rows`` as a dataset split named ``name``."""
        return subset(self.dataset, rows, name)


def read_photos(source: str | os.PathLike[str], transform: Any, *, strict: bool = False) -> RetrievalDataset:
    """Every readable photo of ``source`` (a class-folder tree, a flat folder of photos, every label ``-1``, or an
    OML CSV), each decoded once to check it; the others are left out and listed in ``metadata["bad_images"]``
    (``strict``: :class:`~rankopt.data.DatasetProblems` lists every one). Photos loose beside class folders are
    refused."""
    path = Path(source).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"photos {str(path)!r} do not exist")
    name = "csv" if path.is_file() else "image_folder"
    if name == "csv" and path.suffix.lower() != ".csv":
        raise ValueError(f"photos {str(path)!r}: give a folder of class folders or a .csv table")
    if name == "image_folder" and _flat(path):
        dataset, bad = readable_images(path, strict=strict)  # every label -1: rankopt.fit.flat serves it
        dataset.metadata["bad_images"] = bad
        return dataset
    with warnings.catch_warnings():  # the bad files are raised below, every one named
        warnings.simplefilter("ignore", UserWarning)
        folders = {"class_folders": "top"} if name == "image_folder" else {}  # ImageFolder's convention
        dataset = build_dataset(name, path, "all", transform=transform, on_bad_image="skip", verify_images="decode",
                                **folders)
    if strict and dataset.metadata["bad_images"]:
        raise DatasetProblems(name, list(dataset.metadata["bad_images"]), [])
    if len(dataset) == 0:
        raise ValueError(f"no photos found under {str(path)!r}")
    labelled = np.asarray(dataset.labels)[:, 0] >= 0
    if not labelled.all():
        loose = [dataset.paths[i] for i in np.flatnonzero(~labelled)[:5]]
        raise DatasetProblems(name, [f"{p}: not in a class folder (put each photo in its class's folder)"
                                     for p in loose], [])
    return dataset


def _flat(path: Path) -> bool:
    """Whether the folder holds images directly in it and none below (no class folders)."""
    scan = scan_folder(path)
    return bool(scan.images) and all(scan.depth(image) == 0 for image in scan.images)


def split_photos(dataset: RetrievalDataset, seed: int, fraction: float = KNOWN_FRACTION) -> Photos:
    """The photos with their validation split drawn with ``seed``, ``fraction`` of each class's photos kept back and
    of the classes held out (:func:`rankopt.fit.validation.make_split`), each group of near-duplicates
    (:mod:`rankopt.data.near_duplicates`) on one side."""
    labels = np.asarray(dataset.labels)[:, 0]
    names = list(dataset.metadata.get("label_names", [[]])[0]) or [str(c) for c in np.unique(labels)]
    groups = duplicate_groups(photo_hashes(dataset.paths), labels)
    split = make_split(labels, names, seed, known_fraction=fraction, open_fraction=fraction, groups=groups)
    return Photos(dataset, labels, names, split, grouped_count(groups))


def save_split(photos: Photos, folder: str | os.PathLike[str]) -> None:
    """``folder/classes/{train,validation}.txt`` (the classes trained on, the classes held out whole: one name a
    line) and ``folder/classes/kept_back.txt`` (the photos never trained on while validating: one path a line)."""
    split, out = photos.split, Path(folder) / "classes"
    for side, rows in (("train", split.train), ("validation", split.new_gallery)):
        names = sorted({photos.class_names[c] for c in np.unique(photos.labels[rows])})
        write_text_atomic(out / f"{side}.txt", "".join(f"{n}\n" for n in names))
    kept = np.union1d(split.known_queries, split.new_queries)
    write_text_atomic(out / "kept_back.txt", "".join(f"{photos.dataset.paths[r]}\n" for r in kept))
