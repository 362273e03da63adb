"""The one dataset representation, label remapping and the dataset registry (image files: :mod:`.image_files`).

Every loader turns a dataset's native files into :class:`Items` (paths, raw labels
finest level first, split of each item, and the ``file:line`` each item came from);
:meth:`DatasetSpec.__call__` then applies the bad-file policy, remaps every label
level to contiguous ids (sorted raw values, ``np.unique`` order, so deterministic)
*jointly over the splits that share identities* (query and gallery; any other split
alone), and keeps the requested split as a :class:`RetrievalDataset`.
"""

from __future__ import annotations

import io
import os
import warnings
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from rankopt.data.decode import decode_image, decode_jpeg_pixels
from rankopt.data.image_files import image_exists, pil_to_tensor, read_bytes, to_rgb, undecodable
from rankopt.data.face_alignment import ARCFACE_SIZE, align_face
from rankopt.registries import Registry

BAD_IMAGE_POLICIES = ("raise", "skip")


class BadImageError(ValueError):
    """A missing or undecodable image; the message names the file and its dataset line."""


class LabelFileError(ValueError):
    """A malformed annotation file; the message names the file and line number."""


def label_file_error(path: str | Path, line: int, problem: str) -> LabelFileError:
    return LabelFileError(f"{path}:{line}: {problem}")


class DatasetProblems(ValueError):
    """Every problem a loader found in a dataset's files (``problems``: one line each, naming the
    file, folder or row), raised together before any image is decoded, with the loader's ``notes``
    (remarks that are no problem); ``dataset-info`` lists them all."""

    def __init__(self, name: str, problems: Sequence[str], notes: Sequence[str] = ()) -> None:
        self.problems, self.notes = list(problems), list(notes)
        shown = "\n  ".join(self.problems[:10])
        more = (f"\n  ... and {len(self.problems) - 10} more (rankopt dataset-info lists them all)"
                if len(self.problems) > 10 else "")
        super().__init__(f"dataset {name!r}: {len(self.problems)} problem(s):\n  {shown}{more}")


# --------------------------------------------------------------------------- labels
def remap_labels(raw: np.ndarray) -> np.ndarray:
    """Map each column of raw labels to contiguous ids ``0..K-1`` in sorted order of the raw values."""
    raw = np.asarray(raw)
    if raw.ndim == 1:
        raw = raw[:, None]
    out = np.empty(raw.shape, dtype=np.int64)
    for level in range(raw.shape[1]):
        out[:, level] = np.unique(raw[:, level], return_inverse=True)[1].reshape(-1)
    return out


def label_names(raw: np.ndarray) -> list[list[str]]:
    """The raw value behind each id :func:`remap_labels` gives, per level: ``names[c][i]`` is the
    ``i``-th sorted distinct value of column ``c``, as text (a class folder, a landmark id, ...)."""
    raw = np.asarray(raw)
    if raw.ndim == 1:
        raw = raw[:, None]
    return [[str(value) for value in np.unique(raw[:, level])] for level in range(raw.shape[1])]


def hierarchy_violations(labels: np.ndarray) -> dict[int, int]:
    """For each coarser level ``l``, the number of fine classes (column 0) found under more than one
    level-``l`` label. A consistent hierarchy has none."""
    out: dict[int, int] = {}
    fine = labels[:, 0]
    for level in range(1, labels.shape[1]):
        pairs = np.unique(np.stack([fine, labels[:, level]], axis=1), axis=0)
        counts = np.unique(pairs[:, 0], return_counts=True)[1]
        if (counts > 1).any():
            out[level] = int((counts > 1).sum())
    return out


# --------------------------------------------------------------------------- items
@dataclass
class Items:
    """What a loader reads from the native files, before remapping.

    ``labels`` is ``(N, L)`` raw values (ints or strings), finest level first; ``splits``
    gives each item's split; ``sources`` the ``file:line`` it came from. A loader may return
    more splits than asked for: :func:`finalize` keeps the group of the requested split.
    ``boxes`` maps an item position to an ``(x1, y1, x2, y2)`` crop (Revisited Oxford/Paris
    queries); ``landmarks`` maps one to its five ``(5, 2)`` face landmarks, the item then aligned to
    an ``align_size`` square (:func:`~rankopt.data.face_alignment.align_face`) instead;
    ``extra`` holds per-split metadata copied to the dataset (e.g. ground truth). ``per_item``
    holds arrays with one row per item (IJB-C media ids) and ``item_tables`` ``(M, k)`` integer
    tables whose last column is an item position (IJB-C template membership): :func:`finalize`
    puts the rows of the kept items in the metadata, table positions renumbered to the dataset's.
    """

    paths: list[str]
    labels: np.ndarray
    splits: np.ndarray
    sources: list[str]
    level_names: tuple[str, ...]
    boxes: dict[int, tuple[float, float, float, float]] = field(default_factory=dict)
    extra: dict[str, dict[str, Any]] = field(default_factory=dict)
    landmarks: dict[int, np.ndarray] = field(default_factory=dict)
    align_size: int = ARCFACE_SIZE
    per_item: dict[str, np.ndarray] = field(default_factory=dict)
    item_tables: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def from_rows(
        cls,
        rows: Sequence[tuple[str, Sequence[Any], str, str]],
        level_names: tuple[str, ...],
        **kwargs: Any,
    ) -> Items:
        """Build from ``(path, raw_labels, split, source)`` rows."""
        if not rows:
            return cls([], np.empty((0, len(level_names)), dtype=object), np.empty(0, dtype=object), [], level_names,
                       **kwargs)
        paths, labels, splits, sources = zip(*rows)
        label_arr = np.empty((len(rows), len(level_names)), dtype=object)
        label_arr[:] = [tuple(lab) for lab in labels]
        return cls(list(paths), label_arr, np.asarray(splits, dtype=object), list(sources), level_names, **kwargs)


class RetrievalDataset(torch.utils.data.Dataset):
    """Images with ``(N, L)`` int64 labels (column 0 finest, last coarsest).

    ``__getitem__(i)`` returns ``{"image": FloatTensor (3, H, W), "label": LongTensor (L,),
    "index": i, "path": str}``; without a transform the image is the decoded RGB in [0, 1].
    ``metadata["label_names"]`` (when the loader knows them): ``names[c][i]``, the raw class of id
    ``i`` at level ``c`` (:func:`label_names`). An item with ``boxes[i]`` is cropped to it, one with
    ``landmarks[i]`` aligned on them to an ``align_size`` square (:meth:`load`).
    """

    def __init__(
        self,
        paths: Sequence[str],
        labels: np.ndarray,
        split: str,
        level_names: Sequence[str],
        transform: Callable[[Image.Image], torch.Tensor] | None = None,
        *,
        name: str = "custom",
        sources: Sequence[str] | None = None,
        boxes: dict[int, tuple[float, float, float, float]] | None = None,
        metadata: dict[str, Any] | None = None,
        landmarks: dict[int, np.ndarray] | None = None,
        align_size: int = ARCFACE_SIZE,
    ) -> None:
        labels = np.asarray(labels)
        if labels.ndim == 1:
            labels = labels[:, None]
        if labels.ndim != 2 or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(f"labels must be an (N, L) integer array, got {labels.dtype} {labels.shape}")
        if len(paths) != labels.shape[0]:
            raise ValueError(f"{len(paths)} paths but {labels.shape[0]} label rows")
        if len(level_names) != labels.shape[1]:
            raise ValueError(f"{len(level_names)} level names for {labels.shape[1]} label levels")
        self.name = name
        self.paths = list(paths)
        self.labels = labels.astype(np.int64, copy=False)
        self.split = split
        self.level_names = tuple(level_names)
        self.transform = transform
        self.sources = list(sources) if sources is not None else [f"item {i}" for i in range(len(paths))]
        self.boxes = dict(boxes or {})
        self.landmarks = dict(landmarks or {})
        self.align_size = int(align_size)
        self.metadata: dict[str, Any] = dict(metadata or {})

    @property
    def num_levels(self) -> int:
        return int(self.labels.shape[1])

    def num_classes(self, level: int = 0) -> int:
        return int(np.unique(self.labels[:, level]).size) if len(self) else 0

    def __len__(self) -> int:
        return len(self.paths)

    def _whole_image(self, index: int) -> bool:
        """Whether item ``index`` is its whole decoded image: no landmarks or box, whose coordinates are in full-size
        pixels."""
        return index not in self.landmarks and index not in self.boxes

    def read(self, index: int) -> bytes:
        """The bytes of item ``index``'s file; a :class:`BadImageError` naming it and its line when they cannot be
        read."""
        try:
            return read_bytes(self.paths[index])
        except (OSError, KeyError, zipfile.BadZipFile) as err:
            raise BadImageError(f"cannot read image {self.paths[index]!r} (listed at {self.sources[index]}): "
                                f"{err}") from err

    def load(self, index: int, min_side: int | None = None, data: bytes | None = None) -> Image.Image:
        """The decoded RGB image: aligned on its landmarks if it has them, else cropped to its box if
        it has one (the part of the box inside the image: no padding). ``min_side``: the shorter side
        the transform resizes to, allowing a reduced JPEG decode (:func:`load_image`; not for items
        with landmarks or a box, whose coordinates are in full-size pixels). ``data``: the file's bytes, when read
        already."""
        path = self.paths[index]
        if not self._whole_image(index):
            min_side = None
        data = self.read(index) if data is None else data
        try:
            img = to_rgb(decode_image(data, min_side))
        except (OSError, UnidentifiedImageError, ValueError) as err:
            why = "not an image file Pillow can read" if isinstance(err, UnidentifiedImageError) else err
            raise BadImageError(f"cannot read image {path!r} (listed at {self.sources[index]}): {why}") from err
        points = self.landmarks.get(index)
        if points is not None:
            return align_face(img, points, self.align_size)
        box = self.boxes.get(index)
        if box is None:
            return img
        x1, y1, x2, y2 = (int(round(v)) for v in box)
        x1, y1, x2, y2 = max(x1, 0), max(y1, 0), min(x2, img.width), min(y2, img.height)
        if x1 >= x2 or y1 >= y2:
            raise BadImageError(f"crop box {tuple(box)} of {path!r} (listed at {self.sources[index]}) has no pixel "
                                f"inside the {img.width}x{img.height} image")
        return img.crop((x1, y1, x2, y2))

    def __getitem__(self, index: int) -> dict[str, Any]:
        min_side = getattr(self.transform, "decode_min_side", None)
        data = self.read(index)
        # a transform with a fused path takes a JPEG's pixels as decoded (no Pillow image), unless the item is cropped
        # or aligned
        plain = getattr(self.transform, "takes_pixels", False) and self._whole_image(index)
        pixels = decode_jpeg_pixels(data, min_side) if plain else None
        if pixels is not None:
            image = self.transform(pixels)
        else:
            img = self.load(index, min_side, data)
            image = self.transform(img) if self.transform is not None else pil_to_tensor(img)
        return {"image": image, "label": torch.from_numpy(self.labels[index]), "index": int(index),
                "path": self.paths[index]}

    def summary(self) -> dict[str, Any]:
        """Counts for ``dataset-info``: images and classes per level."""
        return {
            "split": self.split,
            "images": len(self),
            "classes": {name: self.num_classes(level) for level, name in enumerate(self.level_names)},
        }

    def __repr__(self) -> str:
        levels = ", ".join(f"{n}={self.num_classes(i)}" for i, n in enumerate(self.level_names))
        return f"RetrievalDataset({self.name!r}, split={self.split!r}, images={len(self)}, classes: {levels})"


# --------------------------------------------------------------------------- registry
@dataclass(frozen=True)
class DatasetSpec:
    """A registered dataset: how to read it natively and what it should contain.

    ``load(root, split, **kwargs) -> Items`` reads the native files; ``published`` maps a
    split to the published counts (``"images"`` and one entry per level name). When the splits
    depend on the files (a user's folder or CSV), ``layout(root, **kwargs) -> (splits,
    evaluation_splits)`` gives them and the static fields only describe the dataset.
    """

    name: str
    description: str
    level_names: tuple[str, ...]
    splits: tuple[str, ...]
    evaluation_splits: tuple[str, ...]
    native_files: tuple[str, ...]
    load: Callable[..., Items]
    published: dict[str, dict[str, int]] = field(default_factory=dict)
    joint_splits: tuple[str, ...] = ("query", "gallery")
    needs_root: bool = True
    layout: Callable[..., tuple[tuple[str, ...], tuple[str, ...]]] | None = None

    def splits_of(self, root: str | os.PathLike[str] | None = None,
                  **kwargs: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """``(splits, evaluation_splits)`` of the copy at ``root`` (the static fields without a layout or root)."""
        if self.layout is None or root is None:
            return self.splits, self.evaluation_splits
        return self.layout(Path(root).expanduser(), **kwargs)

    def group(self, split: str) -> tuple[str, ...]:
        """The splits remapped together with ``split`` (query and gallery share identities)."""
        return self.joint_splits if split in self.joint_splits else (split,)

    def __call__(
        self,
        root: str | os.PathLike[str] | None = None,
        split: str = "train",
        transform: Callable[[Image.Image], torch.Tensor] | None = None,
        *,
        on_bad_image: str = "raise",
        verify_images: bool | str = True,
        **kwargs: Any,
    ) -> RetrievalDataset:
        if on_bad_image not in BAD_IMAGE_POLICIES:
            raise ValueError(f"on_bad_image must be one of {BAD_IMAGE_POLICIES}, got {on_bad_image!r}")
        path = require_root(root, self.name) if self.needs_root else (Path(root) if root is not None else None)
        splits = self.splits_of(path, **kwargs)[0]
        if split not in splits:
            raise ValueError(f"dataset {self.name!r} has no split {split!r}; splits: {', '.join(splits)}")
        items = self.load(path, split, **kwargs)
        return finalize(self.name, items, split, self.group(split), transform, on_bad_image, verify_images)


DATASETS: Registry[RetrievalDataset] = Registry("dataset")
SPECS: dict[str, DatasetSpec] = {}


def register_dataset(spec: DatasetSpec, *aliases: str) -> DatasetSpec:
    for key in (spec.name, *aliases):
        DATASETS.register(key)(spec)
        SPECS[key] = spec
    return spec


def require_root(root: str | os.PathLike[str] | None, name: str) -> Path:
    """The dataset folder, or a clear error if it is missing."""
    if root is None:
        raise ValueError(f"dataset {name!r} needs root=<folder with the native files>")
    path = Path(root).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"dataset {name!r}: root folder {str(path)!r} does not exist")
    if not path.is_dir():
        raise NotADirectoryError(f"dataset {name!r}: root {str(path)!r} is not a folder")
    return path


def require_file(path: Path, what: str = "annotation file") -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r} not found")
    return path


def read_lines(path: Path, skip: int = 0) -> Iterator[tuple[int, str]]:
    """Non-empty lines of a text file as ``(1-based line number, stripped text)``."""
    with open(require_file(path), encoding="utf-8-sig") as fh:
        for number, line in enumerate(fh, start=1):
            text = line.strip()
            if number > skip and text:
                yield number, text


def parse_int(value: str, path: Path, line: int, what: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise label_file_error(path, line, f"{what} {value!r} is not an integer") from None


def split_fields(text: str, count: int, path: Path, line: int, sep: str | None = None) -> list[str]:
    """Split a line into exactly ``count`` fields or raise a :class:`LabelFileError`."""
    fields = [f.strip() for f in text.split(sep)] if sep else text.split()
    if len(fields) != count:
        raise label_file_error(path, line, f"expected {count} fields, got {len(fields)}: {text[:80]!r}")
    return fields


def _usable(
    paths: list[str], sources: list[str], on_bad_image: str, name: str, verify: bool | str
) -> tuple[np.ndarray, list[str]]:
    """Keep-mask and descriptions of bad files: missing files always; with ``skip`` also files Pillow cannot parse:
    ``verify=True`` by its header check (``Image.verify``: header and structure), ``verify="decode"`` by decoding
    every file (:func:`~rankopt.data.image_files.undecodable`, in parallel: a truncated file is caught too)."""
    keep = np.ones(len(paths), dtype=bool)
    bad: list[str] = []
    decoded = undecodable(paths) if on_bad_image == "skip" and verify == "decode" else {}
    for i, path in enumerate(paths):
        problem = None
        if i in decoded:
            problem = "missing" if not image_exists(path) else f"unreadable ({decoded[i]})"
        elif not image_exists(path):
            problem = "missing"
        elif on_bad_image == "skip" and verify is True:
            try:
                with Image.open(io.BytesIO(read_bytes(path))) as img:
                    img.verify()
            except Exception as err:  # noqa: BLE001 - any decoder failure means a bad file
                why = "not an image file Pillow can read" if isinstance(err, UnidentifiedImageError) else err
                problem = f"unreadable ({why})"
        if problem:
            keep[i] = False
            bad.append(f"{path} (listed at {sources[i]}): {problem}")
    if bad and on_bad_image == "raise":
        shown = "\n  ".join(bad[:5])
        more = f"\n  ... and {len(bad) - 5} more" if len(bad) > 5 else ""
        raise BadImageError(
            f"dataset {name!r}: {len(bad)} image(s) missing:\n  {shown}{more}\n"
            "(pass on_bad_image='skip' to skip and count bad files)"
        )
    if bad:
        warnings.warn(f"dataset {name!r}: skipped {len(bad)} bad image(s), first: {bad[0]}", stacklevel=3)
    return keep, bad


ITEM_METADATA = "item_metadata"  # metadata key: {"rows": per-item array keys, "tables": item table keys}


def _renumbered(table: np.ndarray, new_position: np.ndarray) -> np.ndarray:
    """The rows of an item table whose item (last column) is kept, that column renumbered by
    ``new_position`` (-1 for an item left out)."""
    table = np.asarray(table, dtype=np.int64)
    renumbered = new_position[table[:, -1]]
    kept = table[renumbered >= 0]
    kept[:, -1] = renumbered[renumbered >= 0]
    return kept


def select_item_metadata(per_item: dict[str, Any], item_tables: dict[str, Any], rows: np.ndarray,
                         num_items: int) -> dict[str, Any]:
    """Metadata of the items ``rows`` (in that order) of ``num_items``: each per-item array's rows,
    each item table's rows of kept items renumbered, and :data:`ITEM_METADATA` naming both kinds
    (so that :func:`rankopt.data.splits.subset` selects them again)."""
    new_position = np.full(num_items, -1, dtype=np.int64)
    new_position[rows] = np.arange(rows.size)
    return {**{key: np.asarray(values)[rows] for key, values in per_item.items()},
            **{key: _renumbered(table, new_position) for key, table in item_tables.items()},
            ITEM_METADATA: {"rows": sorted(per_item), "tables": sorted(item_tables)}}


def finalize(
    name: str,
    items: Items,
    split: str,
    group: tuple[str, ...],
    transform: Callable[[Image.Image], torch.Tensor] | None,
    on_bad_image: str,
    verify_images: bool | str = True,
) -> RetrievalDataset:
    """Bad-file policy on the items of ``group``, joint remapping over them, then selection of ``split``."""
    rows = np.flatnonzero(np.isin(items.splits, group))
    keep, bad = _usable([items.paths[r] for r in rows], [items.sources[r] for r in rows], on_bad_image, name,
                        verify_images)
    rows = rows[keep]
    chosen = items.splits[rows] == split
    if not chosen.any():
        raise ValueError(f"dataset {name!r}: no usable images in split {split!r}")
    labels = remap_labels(items.labels[rows])[chosen]
    names = label_names(items.labels[rows])
    rows = rows[chosen]
    violations = hierarchy_violations(labels)
    if violations:
        warnings.warn(f"dataset {name!r} split {split!r}: inconsistent hierarchy {violations}", stacklevel=3)
    position = {int(r): i for i, r in enumerate(rows)}
    boxes = {position[r]: b for r, b in items.boxes.items() if r in position}
    landmarks = {position[r]: p for r, p in items.landmarks.items() if r in position}
    metadata = {"dataset": name, "bad_images": bad, "num_bad_images": len(bad), "label_names": names,
                **select_item_metadata(items.per_item, items.item_tables, np.asarray(rows), len(items.paths)),
                **items.extra.get(split, {})}
    return RetrievalDataset(
        [items.paths[r] for r in rows],
        labels,
        split,
        items.level_names,
        transform,
        name=name,
        sources=[items.sources[r] for r in rows],
        boxes=boxes,
        metadata=metadata,
        landmarks=landmarks,
        align_size=items.align_size,
    )
