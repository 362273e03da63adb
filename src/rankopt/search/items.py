"""The items of an index besides their vectors: stable string ids, paths, metadata columns, file stamps, crops.

* ``ids``: one string per item, unique, never reused for another item and never changed by ``add``,
  ``remove`` or ``update``; given (a CSV dataset's ``id`` column, ``ids=``) or counted ``"0"``, ``"1"``, ...
  from ``next_id`` (a number already taken is skipped).
* ``stamps``: per item ``[size, mtime_ns, sha256]`` of its image when indexed (``None``: no file, e.g. your
  own vectors); ``update`` re-embeds an item whose file's size or mtime changed and whose sha256 differs.
* ``crops``: ``{id: {"box": [x1, y1, x2, y2]}}`` or ``{id: {"landmarks": (5, 2), "align_size": px}}`` for
  items embedded from a crop of their file (a CSV's boxes, aligned faces), so ``update`` embeds them alike.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from rankopt.console import echo
from rankopt.data.base import RetrievalDataset
from rankopt.search.metadata import Columns, aligned_columns, check_name, dataset_columns, merged

Stamp = list  # [size: int, mtime_ns: int, sha256: str]
HASH_BLOCK = 1 << 20


def file_stamp(path: str | os.PathLike[str]) -> Stamp:
    """``[size, mtime_ns, sha256]`` of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        stat = os.fstat(fh.fileno())
        while block := fh.read(HASH_BLOCK):
            digest.update(block)
    return [stat.st_size, stat.st_mtime_ns, digest.hexdigest()]


@dataclass
class IndexItems:
    """Per-item bookkeeping, row-aligned with the index's embeddings (see the module docstring)."""

    ids: list[str]
    paths: list[str] | None
    metadata: Columns = field(default_factory=dict)
    stamps: list[Stamp | None] | None = None
    crops: dict[str, dict[str, Any]] = field(default_factory=dict)
    next_id: int = 0

    def __post_init__(self) -> None:
        rows = len(self.ids)
        sizes = {"paths": self.paths, "stamps": self.stamps,
                 **{f"metadata column {c!r}": v for c, v in self.metadata.items()}}
        for what, values in sizes.items():
            if values is not None and len(values) != rows:
                raise ValueError(f"{len(values)} {what} for {rows} item ids")
        _check_unique(self.ids, "item ids")

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def new(cls, rows: int, paths: Sequence[str] | None, *, ids: Sequence[Any] | None = None,
            metadata: Columns | None = None, stamps: list[Stamp | None] | None = None,
            crops: dict[str, dict[str, Any]] | None = None) -> IndexItems:
        """The items of a new index: ``ids`` given, else ``"0"`` ... ``str(rows - 1)``."""
        items = cls([], [] if paths is not None else None)
        return items.extended(rows, paths, ids=ids, metadata=metadata, stamps=stamps, crops=crops)

    def extended(self, rows: int, paths: Sequence[str] | None, *, ids: Sequence[Any] | None = None,
                 metadata: Columns | None = None, stamps: list[Stamp | None] | None = None,
                 crops: Mapping[int, dict[str, Any]] | None = None) -> IndexItems:
        """These items followed by ``rows`` new ones (new ids, checked against the existing ones);
        ``crops`` keyed by the new items' positions."""
        if (self.paths is None) != (paths is None) and len(self):
            raise ValueError("the index has item paths and the additions have none, or the reverse: give paths= "
                             "for every item or for none")
        if paths is not None and self.paths:
            again = sorted(set(self.paths) & set(paths))
            if again:
                raise ValueError(f"{len(again)} path(s) already indexed, e.g. {again[0]!r}: remove them first, or "
                                 "re-embed changed files with update (rankopt index-update)")
        new_ids, next_id = self._new_ids(rows, ids)
        new_stamps = None
        if self.stamps is not None or stamps is not None:
            new_stamps = [*(self.stamps or [None] * len(self)), *(stamps or [None] * rows)]
        crops_by_id = {**self.crops, **{new_ids[row]: crop for row, crop in (crops or {}).items()}}
        return IndexItems([*self.ids, *new_ids], None if paths is None else [*(self.paths or []), *paths],
                     merged(self.metadata, len(self), metadata or {}, rows), new_stamps, crops_by_id, next_id)

    def _new_ids(self, rows: int, given: Sequence[Any] | None) -> tuple[list[str], int]:
        used = set(self.ids)
        if given is not None:
            new = [str(i) for i in given]
            if len(new) != rows:
                raise ValueError(f"{len(new)} ids for {rows} items")
            if any(not i.strip() for i in new):
                raise ValueError("item ids must be non-empty strings; item "
                                 f"{next(j for j, i in enumerate(new) if not i.strip())} has none")
            _check_unique(new, "the new item ids")
            taken = [i for i in new if i in used]
            if taken:
                raise ValueError(f"{len(taken)} new item id(s) already in the index, e.g. {taken[0]!r}")
            return new, self.next_id
        new, counter = [], self.next_id
        while len(new) < rows:
            if str(counter) not in used:
                new.append(str(counter))
            counter += 1
        return new, counter

    def selected(self, rows: np.ndarray) -> IndexItems:
        """The items at ``rows`` (in that order); ``next_id`` kept, so removed ids are never reused."""
        take = rows.tolist()
        ids = [self.ids[r] for r in take]
        kept = set(ids)
        return IndexItems(ids, None if self.paths is None else [self.paths[r] for r in take],
                     {c: [v[r] for r in take] for c, v in self.metadata.items()},
                     None if self.stamps is None else [self.stamps[r] for r in take],
                     {i: c for i, c in self.crops.items() if i in kept}, self.next_id)

    def with_stamps(self, rows: Iterable[int], stamps: Iterable[Stamp]) -> IndexItems:
        new = list(self.stamps or [None] * len(self))
        for row, stamp in zip(rows, stamps):
            new[row] = stamp
        return replace(self, stamps=new)

    def rows_of(self, ids: Sequence[str] = (), paths: Sequence[str] = ()) -> np.ndarray:
        """Sorted rows of the items with ``ids`` or ``paths`` (a path given relative or absolute matches the
        item's path resolved); an unknown one is a ``ValueError`` naming it."""
        row_of_id = {i: r for r, i in enumerate(self.ids)}
        rows = set()
        unknown = [str(i) for i in ids if str(i) not in row_of_id]
        rows |= {row_of_id[str(i)] for i in ids if str(i) in row_of_id}
        if paths:
            if self.paths is None:
                raise ValueError("this index has no item paths: remove items by id")
            by_path: dict[str, list[int]] = {}
            for r, p in enumerate(self.paths):
                by_path.setdefault(p, []).append(r)
                by_path.setdefault(str(Path(p).resolve()), []).append(r)
            for p in map(str, paths):
                found = by_path.get(p) or by_path.get(str(Path(p).resolve()))
                if found:
                    rows |= set(found)
                else:
                    unknown.append(p)
        if unknown:
            raise ValueError(f"{len(unknown)} unknown item(s) (not in the index): {', '.join(map(repr, unknown[:5]))}"
                             + (" ..." if len(unknown) > 5 else ""))
        return np.array(sorted(rows), dtype=np.int64)

    def to_json(self) -> dict[str, Any]:
        return {"ids": self.ids, "paths": self.paths, "metadata": self.metadata, "stamps": self.stamps,
                "crops": self.crops}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], rows: int, next_id: int | None, where: str) -> IndexItems:
        """The items of ``items.json`` (an index of format 1 has no ids: ``"0"`` ... counted)."""
        ids = data.get("ids")
        try:
            if ids is None:
                return cls.new(rows, data.get("paths"))
            return cls(list(ids), data.get("paths"), dict(data.get("metadata") or {}), data.get("stamps"),
                       dict(data.get("crops") or {}), rows if next_id is None else int(next_id))
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None


def _check_unique(ids: Sequence[str], what: str) -> None:
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        twice = next(i for i in ids if i in seen or seen.add(i))  # type: ignore[func-returns-value]
        raise ValueError(f"{what} are not unique: {twice!r} appears more than once")


def item_paths(paths: Sequence[str] | None, rows: int) -> list[str] | None:
    """``paths`` as strings, one per row (``ValueError`` otherwise); ``None`` stays ``None``."""
    if paths is None:
        return None
    if len(paths) != rows:
        raise ValueError(f"{len(paths)} paths for {rows} embeddings")
    return [str(p) for p in paths]


def dataset_items(dataset: Any, paths: Sequence[str], metadata: Any = None) -> dict[str, Any]:
    """``IndexItems.extended`` keywords for the embedded items of ``dataset`` (a ``RetrievalDataset``): its
    per-item columns (an ``id`` column gives the ids) and ``metadata`` (:func:`rankopt.search.metadata.aligned_columns`:
    a file or table keyed by path overrides a dataset column of the same name), stamps of the files, crops."""
    rows = len(paths)
    columns = dataset_columns(dataset.metadata, rows)
    ids = columns.pop("id", None)
    for name in columns:
        check_name(name, f"dataset {dataset.name!r}")
    given, unmatched = aligned_columns(metadata, paths, rows)
    if unmatched:
        echo(f"metadata: {len(unmatched)} row(s) name no image of the index, e.g. {unmatched[0]}")
    crops = {i: {"box": [float(v) for v in box]} for i, box in dataset.boxes.items()}
    crops |= {i: {"landmarks": np.asarray(points).tolist(), "align_size": dataset.align_size}
              for i, points in dataset.landmarks.items()}
    stamps = [file_stamp(p) if os.path.isfile(p) else None for p in paths]
    return {"ids": ids, "metadata": {**columns, **given}, "stamps": stamps, "crops": crops}


def changed_files(items: IndexItems) -> tuple[list[int], list[int], list[tuple[int, Stamp]]]:
    """``(changed rows, vanished rows, new stamps)`` of the items with a stamp: changed = content (sha256)
    differs, vanished = the file is gone; new stamps for every file whose size or mtime moved."""
    changed, vanished, restamped = [], [], []
    for row, (path, stamp) in enumerate(zip(items.paths or [], items.stamps or [])):
        if stamp is None:
            continue
        try:
            stat = os.stat(path)
        except FileNotFoundError:
            vanished.append(row)
            continue
        if [stat.st_size, stat.st_mtime_ns] != list(stamp[:2]):
            new = file_stamp(path)
            restamped.append((row, new))
            if new[2] != stamp[2]:
                changed.append(row)
    return changed, vanished, restamped


def crop_dataset(items: IndexItems, rows: Sequence[int]) -> RetrievalDataset:
    """A dataset of the files of ``rows`` cropped as when they were indexed (unlabelled)."""
    paths = [items.paths[r] for r in rows]
    crops = [items.crops.get(items.ids[r], {}) for r in rows]
    boxes = {i: tuple(c["box"]) for i, c in enumerate(crops) if "box" in c}
    landmarks = {i: np.asarray(c["landmarks"], dtype=np.float32) for i, c in enumerate(crops) if "landmarks" in c}
    sizes = {c["align_size"] for c in crops if "align_size" in c}
    extra = {"align_size": sizes.pop()} if len(sizes) == 1 else {}
    return RetrievalDataset(paths, np.full((len(paths), 1), -1, dtype=np.int64), "update", ("class",), name="update",
                            sources=paths, boxes=boxes, landmarks=landmarks, **extra)
