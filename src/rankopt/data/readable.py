"""Images checked by decoding each once, before any heavy work: the unreadable ones (missing, empty, not an image,
truncated or corrupt: :func:`rankopt.data.image_files.decode_problem`) are left out and listed, or, ``strict``,
refused all at once (:class:`~rankopt.data.base.DatasetProblems`). ``rankopt index`` and ``index-add`` check their
images so; ``rankopt fit`` through its dataset (``verify_images="decode"``)."""

from __future__ import annotations

import os
from pathlib import Path

from rankopt.data.base import DatasetProblems, RetrievalDataset
from rankopt.data.image_files import undecodable
from rankopt.data.image_folder import folder_dataset, images_dataset
from rankopt.data.splits import subset


def readable_images(source: str | os.PathLike[str] | RetrievalDataset, *,
                    strict: bool = False) -> tuple[RetrievalDataset, list[str]]:
    """``(the images of source that decode, one line per image left out: "PATH: why")``. ``source``: a folder (its
    class tree, as :func:`~rankopt.data.image_folder.folder_dataset` labels it, from the readable images only), an
    image file, or a dataset (its readable items, labels remapped). ``strict``: any unreadable image is a
    :class:`~rankopt.data.base.DatasetProblems` naming every one; none readable is a ``ValueError``."""
    if isinstance(source, RetrievalDataset):
        dataset = source
    elif Path(source).is_dir():
        dataset = folder_dataset(source)
    else:
        dataset = images_dataset([source])
    bad = undecodable(dataset.paths)
    if not bad:
        return dataset, []
    lines = [f"{dataset.paths[i]}: {why}" for i, why in sorted(bad.items())]
    if strict:
        raise DatasetProblems(dataset.name, lines)
    if len(bad) == len(dataset):
        raise ValueError(f"none of the {len(dataset)} image(s) can be read; the first: {lines[0]}")
    if not isinstance(source, RetrievalDataset) and Path(source).is_dir():
        return folder_dataset(source, exclude={dataset.paths[i] for i in bad}), lines
    return subset(dataset, [i for i in range(len(dataset)) if i not in bad], dataset.split), lines
