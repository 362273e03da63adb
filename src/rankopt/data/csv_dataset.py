"""``csv``: images listed in a CSV table (``data.name=csv data.root=FILE.csv``), in the dataframe
format of open-metric-learning (OML), so that OML users' files work unchanged.

Columns (a header row; any order; other columns are kept per item, see below):

- ``label``: the finest class, an integer or a name (``3.0`` is read as 3; ``1.5``, empty or
  NaN is an error naming the row);
- ``path``: the image, absolute or relative to the CSV's folder (or to ``dataset_root=DIR``, OML's name);
- ``split``: ``train``, ``validation`` or ``test`` (any case);
- ``is_query``, ``is_gallery`` (optional): ``True``/``False`` (or ``1``/``0``) on the rows of the
  evaluation split, empty on training rows (OML);
- coarser levels: ``label_1``, ``label_2``, ...; else OML's ``category`` as level 1; or the
  columns named by ``levels=[label, category, ...]`` (finest first; they are the level names);
- ``x_1``, ``x_2``, ``y_1``, ``y_2`` (OML: left, right, top, bottom): the image is cropped to
  ``(x_1, y_1, x_2, y_2)`` on rows where all four are filled in;
- ``sequence`` (optional): an id (integer or name, read like a label) shared by the frames of one
  video or burst; empty: the item is in no sequence. At evaluation a query ignores every gallery item
  of its sequence, as it ignores itself (OML's rule: same-sequence frames would inflate the metrics);
  OML's factorisation would put every empty value in one sequence, rankopt leaves such items alone;
- ``category`` (optional, OML): besides its use as a level, the metrics are also reported per category
  of the queries (each query still retrieving from the whole gallery, as in OML).
- ``labels`` (optional): every label of a multi-label item, separated by ``labels_separator`` (default ``|``,
  e.g. ``cat|outdoor``; empty: none). The datasets then hold ``metadata["multilabels"]``, the ``(N, C)`` uint8
  multi-hot matrix (C = the distinct labels of the file), and ``metadata["multilabel_names"]``, its column names
  (sorted), for ``rankopt.rank.Relevance.multilabel`` (``rankopt evaluate-embeddings --multilabels``).
  ``label`` stays the class of each item (samplers, class-based losses).

Per item, the datasets' ``metadata["sequence"]`` and ``metadata["category"]`` hold these columns as
strings (``""``: empty), when the file has them, and ``metadata["column/NAME"]`` every other column
``NAME`` as its raw text (e.g. an ``id`` column, or a search index's metadata: ``rankopt index``); they follow
the items through skipped files and carved splits (``Items.per_item``).

Splits: the rows of ``train``, ``validation`` and ``test`` (and ``all``: every row, as ``rankopt fit`` reads a
table); with ``is_query``/``is_gallery``,
``query`` and ``gallery`` are the rows of the evaluation split (``test`` if the file has test rows,
else ``validation``) flagged so. A row may be both (OML's "1 vs rest"): the gallery then contains
the queries and ``metadata["gallery_contains_queries"]`` makes the evaluation exclude each query's
own copy (by path). Evaluation splits: ``("query", "gallery")`` with those columns, else the
evaluation split itself (self-retrieval).

A finest label found in train and in an evaluation split is an error (open set) unless
``class_disjoint=False`` (closed-set data). Every problem of the table is collected and raised
together as :class:`~rankopt.data.base.DatasetProblems`; missing images are found by the usual
bad-file policy (``on_bad_image``), naming the file's row.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rankopt.data.base import (
    DatasetProblems,
    DatasetSpec,
    Items,
    label_file_error,
    register_dataset,
    require_file,
)

NAME = "csv"
SPLITS = ("train", "validation", "test")
FLAGS = ("is_query", "is_gallery")
BOX = ("x_1", "y_1", "x_2", "y_2")
ITEM_COLUMNS = ("sequence", "category")  # kept per item in the datasets' metadata
MULTI_LABELS = "labels"  # the column of a multi-label item's labels, split by ``labels_separator``
OTHER_COLUMN = "column/"
"""Prefix of the per-item metadata keys of the file's other columns (raw text)."""
_TRUE, _FALSE, _EMPTY = {"true", "1", "1.0", "yes"}, {"false", "0", "0.0", "no"}, {"", "none", "nan", "null"}


def _label(text: str, column: str = "label") -> int | str:
    """An integer label (``3`` or ``3.0``) or a name; empty, NaN and non-integral numbers are errors."""
    if text.lower() in _EMPTY:
        raise ValueError(f"empty or NaN {column} {text!r}")
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        return text
    if not number.is_integer():
        raise ValueError(f"{column} {text!r} is neither an integer nor a name")
    return int(number)


def _item_id(text: str, column: str) -> str:
    """An optional id read like a label (``3.0`` -> ``"3"``), as a string; ``""`` when empty or NaN."""
    return "" if text.lower() in _EMPTY else str(_label(text, column))


def _flag(text: str, column: str) -> bool | None:
    """True/False (or 1/0); None when empty (training rows)."""
    value = text.lower()
    if value in _EMPTY:
        return None
    if value not in _TRUE | _FALSE:
        raise ValueError(f"{column} must be True/False (or 1/0), got {text!r}")
    return value in _TRUE


def _box(values: list[str]) -> tuple[float, float, float, float] | None:
    """``(x_1, y_1, x_2, y_2)`` when all four are filled in, None when none is."""
    filled = [v.lower() not in _EMPTY for v in values]
    if not any(filled):
        return None
    if not all(filled):
        raise ValueError(f"bounding box {dict(zip(BOX, values))} is partly empty (fill in all of x_1, x_2, y_1, y_2 or "
                         "none)")
    x1, y1, x2, y2 = (float(v) for v in values)
    if not (x1 < x2 and y1 < y2):
        raise ValueError(f"bounding box needs x_1 < x_2 and y_1 < y_2, got {dict(zip(BOX, values))}")
    return x1, y1, x2, y2


def _level_columns(header: Sequence[str], levels: Sequence[str] | None) -> tuple[str, ...]:
    if levels is not None:
        return tuple(str(c) for c in levels)
    numbered = []
    while f"label_{len(numbered) + 1}" in header:
        numbered.append(f"label_{len(numbered) + 1}")
    if not numbered and "category" in header:
        numbered = ["category"]
    return ("label", *numbered)


@dataclass
class CsvRows:
    """The checked rows of a CSV file: per row its ``file:line``, resolved path, raw labels
    (finest first), split, query/gallery flags (None without those columns) and crop box."""

    file: Path
    level_names: tuple[str, ...]
    has_flags: bool
    sources: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    labels: list[tuple[int | str, ...]] = field(default_factory=list)
    splits: list[str] = field(default_factory=list)
    flags: list[tuple[bool | None, bool | None]] = field(default_factory=list)
    boxes: list[tuple[float, float, float, float] | None] = field(default_factory=list)
    extras: dict[str, list[str]] = field(default_factory=dict)
    """The optional per-item columns present in the file (:data:`ITEM_COLUMNS`): one string per row, ``""`` when
    empty."""
    others: dict[str, list[str]] = field(default_factory=dict)
    """The file's other columns (none of the above): each row's raw text, stripped."""
    multilabels: list[frozenset[str]] | None = None
    """Each row's labels (the ``labels`` column), None without that column."""
    problems: list[str] = field(default_factory=list)
    """Problems left unraised by ``read_table(..., keep_going=True)``."""

    @property
    def evaluation_split(self) -> str:
        """``test`` when the file has test rows, else ``validation``."""
        return "test" if "test" in self.splits else "validation"


def _unify(labels: list[tuple[int | str, ...]]) -> list[tuple[int | str, ...]]:
    """Each level stays integer when every value is an integer, else every value becomes a string
    (``3`` and ``"3"`` are then one class)."""
    if not labels:
        return labels
    columns = list(zip(*labels))
    columns = [col if all(isinstance(v, int) for v in col) else tuple(str(v) for v in col) for col in columns]
    return list(zip(*columns))


def _disjointness(table: CsvRows) -> list[str]:
    """A finest label in train and in an evaluation split, named with one row of each."""
    first: dict[tuple[str, int | str], str] = {}
    for source, labels, split in zip(table.sources, table.labels, table.splits):
        first.setdefault((split, labels[0]), source)
    return [f"label {label!r} is in train ({source}) and in {split} ({first[(split, label)]}); train and evaluation "
            "classes must differ (open set; pass class_disjoint=false for closed-set data)"
            for (s, label), source in first.items() if s == "train"
            for split in ("validation", "test") if (split, label) in first]


def read_table(
    file: Path | None, *, dataset_root: str | os.PathLike[str] | None = None, levels: Sequence[str] | None = None,
    class_disjoint: bool = True, keep_going: bool = False, labels_separator: str = "|",
) -> CsvRows:
    """Read and check a CSV file in OML's format; every problem is raised together (with ``keep_going``,
    for ``dataset-info``: kept in ``CsvRows.problems`` when some rows are usable, the bad rows left out)."""
    if file is None:
        raise ValueError(f"dataset {NAME!r} needs root=<the CSV file>")
    file = Path(file).expanduser()
    if file.is_dir():
        raise ValueError(f"dataset {NAME!r}: root {str(file)!r} is a folder; give the CSV file itself")
    require_file(file, "CSV file")
    base = Path(dataset_root).expanduser() if dataset_root is not None else file.parent
    with open(file, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        header = [h.strip() for h in reader.fieldnames or ()]
        reader.fieldnames = header
        level_names = _level_columns(header, levels)
        flags = [c for c in FLAGS if c in header]
        missing = [c for c in ("path", "split", *level_names) if c not in header]
        if len(flags) == 1:
            missing.append(next(c for c in FLAGS if c not in header))
        if missing:
            raise label_file_error(file, 1, f"missing column(s) {missing}; header: {','.join(header) or '(empty)'}")
        table = CsvRows(file, level_names, bool(flags))
        has_box = all(c in header for c in BOX)
        table.extras = {c: [] for c in ITEM_COLUMNS if c in header}
        if MULTI_LABELS in header:
            if not labels_separator:
                raise ValueError("labels_separator must be a non-empty string (e.g. '|')")
            table.multilabels = []
        used = {"path", "split", *level_names, *FLAGS, *BOX, *ITEM_COLUMNS, MULTI_LABELS}
        table.others = {c: [] for c in header if c and c not in used}
        problems: list[str] = []
        seen: dict[str, int] = {}
        for row in reader:
            line = reader.line_num
            get = {k: (v or "").strip() for k, v in row.items() if k is not None}
            try:
                split = get["split"].lower()
                if split not in SPLITS:
                    raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {get['split']!r}")
                labels = tuple(_label(get[c], c) for c in level_names)
                if not get["path"]:
                    raise ValueError("empty path")
                path = Path(get["path"]).expanduser()
                path_text = str(path if path.is_absolute() else base / path)
                flagged = ((_flag(get["is_query"], "is_query"), _flag(get["is_gallery"], "is_gallery")) if flags
                           else (None, None))
                box = _box([get[c] for c in BOX]) if has_box else None
                extras = {c: _item_id(get[c], c) for c in table.extras}
            except ValueError as err:
                problems.append(f"{file}:{line}: {err}")
                continue
            if path_text in seen:
                problems.append(f"{file}:{line}: path {get['path']!r} is also listed at line {seen[path_text]}")
                continue
            seen[path_text] = line
            table.sources.append(f"{file}:{line}")
            table.paths.append(path_text)
            table.labels.append(labels)
            table.splits.append(split)
            table.flags.append(flagged)
            table.boxes.append(box)
            for column, value in extras.items():
                table.extras[column].append(value)
            for column, values in table.others.items():
                values.append(get.get(column, ""))
            if table.multilabels is not None:
                table.multilabels.append(frozenset(filter(None, (t.strip() for t in
                                                                 get[MULTI_LABELS].split(labels_separator)))))
    if not table.paths and not problems:
        problems.append(f"{file}: no rows")
    table.labels = _unify(table.labels)
    if flags:
        problems += [f"{source}: is_query/is_gallery must be True or False on the rows of the evaluation split "
                     f"({table.evaluation_split}), got an empty value"
                     for source, s, f in zip(table.sources, table.splits, table.flags)
                     if s == table.evaluation_split and None in f]
    if class_disjoint:
        problems += _disjointness(table)
    if problems and not (keep_going and table.paths):
        raise DatasetProblems(NAME, problems)
    table.problems = problems
    return table


def csv_layout(root: Path | None, **kwargs: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(splits, evaluation_splits)`` of the CSV file ``root``."""
    table = read_table(root, **kwargs)
    splits = (*(s for s in SPLITS if s in table.splits), "all")
    if table.has_flags:
        return (*splits, "query", "gallery"), ("query", "gallery")
    return splits, (table.evaluation_split,)


def load_csv(root: Path | None, split: str, **kwargs: Any) -> Items:
    """Items of ``split`` of the CSV file ``root`` (every split's rows, and each row once more in ``all``; ``finalize``
    keeps the group asked for)."""
    table = read_table(root, **kwargs)
    evaluation = table.evaluation_split if table.has_flags else None
    rows, boxes, both, origin = [], {}, False, []
    for i, (path, labels, s) in enumerate(zip(table.paths, table.labels, table.splits)):
        entries = [s, "all"]
        if s == evaluation:
            is_query, is_gallery = table.flags[i]
            entries += ["query"] * bool(is_query) + ["gallery"] * bool(is_gallery)
            both |= bool(is_query and is_gallery)
        for entry in entries:
            if table.boxes[i] is not None:
                boxes[len(rows)] = table.boxes[i]
            rows.append((path, labels, entry, table.sources[i]))
            origin.append(i)
    extra: dict[str, dict[str, Any]] = {s: {"problems": table.problems} for s in {r[2] for r in rows} | {split}}
    if both:
        extra["query"]["gallery_contains_queries"] = True
    per_item = {column: np.asarray(values, dtype=str)[origin] for column, values in table.extras.items()}
    per_item |= {OTHER_COLUMN + column: np.asarray(values, dtype=str)[origin]
                 for column, values in table.others.items()}
    if table.multilabels is not None:
        names = sorted(set().union(*table.multilabels))
        column = {name: c for c, name in enumerate(names)}
        hot = np.zeros((len(table.multilabels), len(names)), dtype=np.uint8)
        for row, labels in enumerate(table.multilabels):
            hot[row, [column[name] for name in labels]] = 1
        per_item["multilabels"] = hot[origin]
        for values in extra.values():
            values["multilabel_names"] = tuple(names)
    return Items.from_rows(rows, table.level_names, boxes=boxes, extra=extra, per_item=per_item)


SPEC = register_dataset(
    DatasetSpec(
        name=NAME,
        description="images listed in a CSV file, open-metric-learning's format (label, path, split "
                    "[, is_query, is_gallery, category, sequence, labels, x_1, x_2, y_1, y_2]); root = the CSV file",
        level_names=("label",),
        splits=(*SPLITS, "all", "query", "gallery"),
        evaluation_splits=("query", "gallery"),
        native_files=("FILE.csv "
                      "(label,path,split[,is_query,is_gallery][,label_1|category][,sequence][,x_1,x_2,y_1,y_2])",),
        load=load_csv,
        needs_root=False,
        layout=csv_layout,
    )
)
