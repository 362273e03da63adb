"""Metadata columns of an index and the filters over them.

A column is a list with one JSON scalar per item (``str``, ``int``, ``float``, ``bool``; ``None``:
missing). Columns come from

* a dataset's per-item values: a CSV dataset's other columns (``rankopt.data.csv_dataset``: every
  column but ``path``, ``split``, the labels, flags and boxes; ``category``, ``sequence``), Yale B's angles, ...;
* a table keyed by image path: a ``.csv`` or ``.parquet`` file with a ``path`` column (a relative path is
  relative to the file's folder), or a ``{path: {column: value}}`` mapping; images it does not list get ``None``;
* columns aligned with the items: ``{column: [value per item]}`` (indexes of your own vectors).

Filters (``Index.search(..., filter=)``, ``rankopt search --filter``) keep the items whose value
matches: a mapping ``{column: value}`` (equality) or ``{column: [v1, v2]}`` (membership), or strings
``"column=value"`` / ``"column in [v1, v2]"`` (one condition per string; a list of them is ANDed; quote
a value holding a comma: ``"place in [\"Paris, FR\", Rome]"``). Values compare by their text:
``str(v)`` for strings and integers, ``true``/``false`` for booleans, an integral float as an integer
(``3.0`` = ``3``), ``""`` for missing, so ``year=2020`` matches ``2020``, ``"2020"`` and ``2020.0``.
The column ``label`` is the finest label (its class name when the index has names).
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np

from rankopt.data.base import ITEM_METADATA
from rankopt.data.csv_dataset import OTHER_COLUMN
from rankopt.search.extras import import_pyarrow

Value = Union[str, int, float, bool, None]
Columns = dict[str, list[Value]]
Filter = Union[Mapping[str, Any], str, Sequence[str]]
MetadataSource = Union[str, os.PathLike, Mapping[str, Any]]
"""A ``.csv``/``.parquet`` file or a ``{path: row}`` mapping keyed by path, or ``{column: values}`` aligned."""

RESERVED = re.compile(r"^(id|path|embedding|label(_\d+)?)$")
"""Names taken by the items themselves (and the Parquet export's columns)."""
LABEL_KEY = "label"


def check_name(name: object, where: str) -> str:
    """``name`` as a metadata column name: a non-empty string not in :data:`RESERVED`."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where}: metadata column name {name!r} is not a non-empty string")
    if RESERVED.match(name):
        raise ValueError(f"{where}: metadata column {name!r} has the name of an item field (id, path, embedding, "
                         "label, label_N): rename it")
    return name


def json_value(value: object, column: str) -> Value:
    """``value`` as a JSON scalar: numpy scalars unwrapped, NaN and infinities as ``None`` (JSON has neither);
    other types refused."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    raise TypeError(f"metadata column {column!r}: value {value!r} of type {type(value).__name__} is not a string, "
                    "number or boolean")


def text(value: Value) -> str:
    """The text a filter compares (see the module docstring)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


# ---------------------------------------------------------------------- sources
def aligned_columns(source: MetadataSource | None, paths: Sequence[str] | None, rows: int,
                    where: str = "metadata") -> tuple[Columns, list[str]]:
    """``(columns, unmatched)``: the columns of ``rows`` items from ``source`` (see the module docstring),
    and the paths of a table keyed by path that name no item (``[]`` otherwise)."""
    if source is None:
        return {}, []
    if isinstance(source, (str, os.PathLike)):
        return by_path(read_table(source), paths, where)
    if not isinstance(source, Mapping):
        raise TypeError(f"{where} must be a file, a {{path: row}} mapping or {{column: values}}, got "
                        f"{type(source).__name__}")
    if source and all(isinstance(v, Mapping) for v in source.values()):
        return by_path({str(Path(p).resolve()): dict(row) for p, row in source.items()}, paths, where)
    columns: Columns = {}
    for name, values in source.items():
        check_name(name, where)
        values = list(values.tolist() if isinstance(values, np.ndarray) else values)
        if len(values) != rows:
            raise ValueError(f"{where}: column {name!r} has {len(values)} values for {rows} items")
        columns[name] = [json_value(v, name) for v in values]
    return columns, []


def by_path(table: Mapping[str, Mapping[str, Any]], paths: Sequence[str] | None,
            where: str) -> tuple[Columns, list[str]]:
    """Columns of the items at ``paths`` from ``table`` keyed by resolved path (``None`` where it has no row)."""
    if paths is None:
        raise ValueError(f"{where}: a table keyed by path needs items with paths")
    names = sorted({check_name(c, where) for row in table.values() for c in row})
    resolved = [str(Path(p).resolve()) for p in paths]
    columns = {c: [json_value(table[p].get(c), c) if p in table else None for p in resolved] for c in names}
    known = set(resolved)
    return columns, [p for p in table if p not in known]


def read_table(file: str | os.PathLike[str]) -> dict[str, dict[str, Value]]:
    """A ``.csv`` (cells as text, empty: ``None``) or ``.parquet`` metadata file as ``{resolved path: row}``;
    it needs a ``path`` column (relative paths are relative to the file's folder), each path once."""
    path = Path(file)
    if not path.is_file():
        raise FileNotFoundError(f"metadata file {str(path)!r} does not exist")
    if path.suffix.lower() == ".parquet":
        data = import_pyarrow().parquet.read_table(path)
        header, records = data.column_names, data.to_pylist()
    elif path.suffix.lower() == ".csv":
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            header = [h.strip() for h in reader.fieldnames or ()]
            records = [{k.strip(): v.strip() or None for k, v in row.items() if k and isinstance(v, str)}
                       for row in reader]
    else:
        raise ValueError(f"metadata file {str(path)!r}: expected a .csv or .parquet file")
    if "path" not in header:
        raise ValueError(f"metadata file {path} has no 'path' column (columns: {', '.join(header) or 'none'})")
    table: dict[str, dict[str, Value]] = {}
    for number, record in enumerate(records, start=1):
        item = record.pop("path", None)
        if not item:
            raise ValueError(f"metadata file {path}: row {number} has an empty path")
        key = str((path.parent / str(item)).resolve())
        if key in table:
            raise ValueError(f"metadata file {path}: row {number} repeats path {item!r}")
        table[key] = record
    return table


def dataset_columns(metadata: Mapping[str, Any], rows: int) -> Columns:
    """The per-item columns of a dataset (``metadata["item_metadata"]["rows"]``: one value per item), a CSV
    file's other columns named without their ``column/`` prefix."""
    columns: Columns = {}
    for key in (metadata.get(ITEM_METADATA) or {}).get("rows", ()):
        values = np.asarray(metadata[key])
        if values.ndim == 1 and values.shape[0] == rows:
            name = key.removeprefix(OTHER_COLUMN)
            columns[name] = [json_value(v, name) for v in values.tolist()]
    return columns


def merged(old: Columns, old_rows: int, new: Columns, new_rows: int) -> Columns:
    """The columns of ``old`` items followed by ``new`` ones (``None`` where a side lacks a column)."""
    return {name: [*old.get(name, [None] * old_rows), *new.get(name, [None] * new_rows)] for name in {**old, **new}}


# ---------------------------------------------------------------------- filters
MEMBERSHIP = re.compile(r"(?<=\s)in\s+\[")
"""`` in [`` of a membership condition (searched in linear time: no nested quantifiers)."""


def parse_condition(condition: str) -> tuple[str, list[str]]:
    """``"key=value"`` -> ``(key, [value])``; ``"key in [a, b]"`` -> ``(key, [a, b])`` (the key before the first
    `` in [``, the values up to the last ``]``)."""
    member = MEMBERSHIP.search(condition)
    key = condition[: member.start()].strip() if member else ""
    rest = condition[member.end():].rstrip() if member else ""
    if key and "=" not in key and rest.endswith("]"):
        inner = rest[:-1].strip()
        values = next(csv.reader([inner], skipinitialspace=True)) if inner else []
        return key, [v.strip().strip("'") for v in values]
    key, sep, value = condition.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"filter {condition!r}: write key=value or 'key in [a, b]'")
    return key.strip(), [value.strip()]


def conditions(filter: Filter) -> dict[str, set[str]]:
    """``{column: accepted texts}`` of a filter (see the module docstring); a ``ValueError`` naming the column
    for a value that is not a scalar or a list of scalars, or a filter of another type."""
    if isinstance(filter, str):
        filter = [filter]
    out: dict[str, set[str]] = {}
    if isinstance(filter, Mapping):
        items = [(k, list(v) if isinstance(v, (list, tuple, set, frozenset)) else [v]) for k, v in filter.items()]
    elif isinstance(filter, Sequence) and all(isinstance(c, str) for c in filter):
        items = [parse_condition(c) for c in filter]
    else:
        raise ValueError(f"filter: {filter!r} is not a mapping, a string or a list of strings")
    for key, values in items:
        if not isinstance(key, str):
            raise ValueError(f"filter: column name {key!r} is not a string")
        try:
            accepted = {text(json_value(v, key)) for v in values}
        except TypeError as err:
            raise ValueError(f"filter: {err}; give a value or a list of values") from None
        out[key] = out[key] & accepted if key in out else accepted
    return out


def check_columns(accepted: Mapping[str, set[str]], columns: Iterable[str]) -> None:
    """A ``ValueError`` naming the known columns when a condition names another one."""
    known = set(columns)
    for key in accepted:
        if key not in known:
            names = ", ".join(sorted(known)) or "none"
            raise ValueError(f"filter: unknown column {key!r}; the index's columns: {names}")


def filter_mask(columns: Mapping[str, Sequence[Value]], rows: int, filter: Filter) -> np.ndarray:
    """``(rows,)`` bool: the items every condition of ``filter`` accepts. Unknown columns are a ``ValueError``
    naming the known ones."""
    mask = np.ones(rows, dtype=bool)
    accepted_by_column = conditions(filter)
    check_columns(accepted_by_column, columns)
    for key, accepted in accepted_by_column.items():
        mask &= np.fromiter((text(v) in accepted for v in columns[key]), dtype=bool, count=rows)
    return mask
