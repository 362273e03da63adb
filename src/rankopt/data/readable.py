"""Images that cannot be read (missing, empty, not an image, truncated or corrupt:
:func:`rankopt.data.image_files.decode_problem`) left out and listed, or refused all at once.

Two ways to find them. :func:`readable_images` decodes each image once before any heavy work (``strict``: any
unreadable one is a :class:`~rankopt.data.base.DatasetProblems` naming every one): ``rankopt index --strict``,
``calibrate``, and ``rankopt fit`` through its dataset (``verify_images="decode"``). Or the embedding pass finds them
itself, so each photo is decoded once in all (:class:`SkipUnreadable`, :class:`ReadableCollate`, then
:func:`without_unreadable`): ``rankopt index`` and ``index-add`` by default
(:meth:`rankopt.search.embedder.Embedder.embed_images`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rankopt.data.base import DatasetProblems, RetrievalDataset
from rankopt.data.image_files import decode_problem, undecodable
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
    if bad and strict:
        raise DatasetProblems(dataset.name, _lines(dataset, bad))
    return without_unreadable(source, dataset, bad)


def without_unreadable(source: Any, dataset: RetrievalDataset,
                       bad: dict[int, str]) -> tuple[RetrievalDataset, list[str]]:
    """``(dataset without the items bad names, one line per item left out: "PATH: why")``; ``dataset`` was made from
    ``source`` (a folder: its class tree rebuilt from the readable images, so
    a class left empty disappears; else the items kept, labels remapped). Every item bad: a ``ValueError``."""
    if not bad:
        return dataset, []
    lines = _lines(dataset, bad)
    if len(bad) == len(dataset):
        raise ValueError(f"none of the {len(dataset)} image(s) can be read; the first: {lines[0]}")
    if isinstance(source, (str, os.PathLike)) and Path(source).is_dir():
        readable = folder_dataset(source, dataset.transform, exclude={dataset.paths[i] for i in bad})
    else:
        readable = subset(dataset, [i for i in range(len(dataset)) if i not in bad], dataset.split)
    return readable, lines


def _lines(dataset: RetrievalDataset, bad: dict[int, str]) -> list[str]:
    return [f"{dataset.paths[i]}: {why}" for i, why in sorted(bad.items())]


@dataclass(frozen=True)
class Unreadable:
    """Item ``index`` of a dataset, whose image cannot be read (``why``: :func:`decode_problem`'s words)."""

    index: int
    why: str


class SkipUnreadable:
    """``dataset[i]``, or :class:`Unreadable` when reading it fails and :func:`decode_problem` says its image cannot be
    read; any other failure (a readable image) raises as it would. Reads from several threads as ``dataset`` does."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.dataset[index]
        except Exception:  # noqa: BLE001 - classified below: only an unreadable image is left out
            why = decode_problem(self.dataset.paths[index])
            if why is None:
                raise
            return Unreadable(int(index), why)


class ReadableCollate:
    """``(collate(the readable items) or None when there is none, [(index, why) of each Unreadable item])``."""

    def __init__(self, collate: Callable[[list[Any]], Any]) -> None:
        self.collate = collate

    def __call__(self, items: list[Any]) -> tuple[Any, list[tuple[int, str]]]:
        readable = [item for item in items if not isinstance(item, Unreadable)]
        bad = [(item.index, item.why) for item in items if isinstance(item, Unreadable)]
        return (self.collate(readable) if readable else None), bad
