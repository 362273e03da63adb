"""DyML (Sun et al., CVPR 2021): Vehicle, Animal, Product; 3 levels fine -> middle -> coarse.

Layout of ``dyml_<subset>/``: ``train/label.csv`` (+ ``train/imgs/``); for vehicle and animal
``bmk_<granularity>/{query,gallery}.csv`` with images in ``bmk_<granularity>/{query,gallery}/``
(one label column, ``labels``, at that granularity; the gallery contains the queries, matched by
file name: drop them by index at evaluation); for product ``mini-bmk_all_in_one/label.csv``
(3 levels, self-retrieval). The CSV quirks are handled: fields are ``", "``-separated (leading
spaces in the header) and the header is glued to the first row (``fine_id0.jpg`` = header
``fine_id`` + first file ``0.jpg``); that first row is recovered, not lost.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from rankopt.data.base import DatasetSpec, Items, label_file_error, parse_int, read_lines, register_dataset

LEVEL_NAMES = ("fine", "middle", "coarse")
LABEL_COLUMNS = ("fine_id", "middle_id", "coarse_id")
GRANULARITIES = ("fine", "middle", "coarse")


def _split_header(fields: list[str], names: tuple[str, ...], path: Path,
                  line: int) -> tuple[list[str], list[str] | None]:
    """The header and, when the first data row is glued to it (``fine_id0.jpg, 3, 7, 15``), that row."""
    header = fields[: len(names)]
    glued = next((c for c in names if header and header[-1] != c and header[-1].startswith(c)), None)
    first = None
    if glued:
        first = [header[-1][len(glued) :], *fields[len(names) :]]
        header[-1] = glued
    if sorted(header) != sorted(names) or len(first if first is not None else fields) != len(names):
        raise label_file_error(path, line,
                               f"expected a header with columns {', '.join(names)}, got {', '.join(fields)!r}")
    return header, first


def read_dyml_csv(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    """Rows of a DyML CSV as ``(line, {column: value})``; ``columns`` excludes ``fname``."""
    names = ("fname", *columns)
    rows: list[tuple[int, dict[str, str]]] = []
    header: list[str] | None = None
    for line, text in read_lines(path):
        fields = [f.strip() for f in text.split(",")]
        if header is None:
            header, first = _split_header(fields, names, path, line)
            if first is not None:
                rows.append((line, dict(zip(header, first))))
        elif len(fields) != len(names):
            raise label_file_error(path, line, f"expected {len(names)} comma-separated fields, got {text!r}")
        else:
            rows.append((line, dict(zip(header, fields))))
    if header is None:
        raise label_file_error(path, 1, "empty file")
    return rows


def _labelled(path: Path, folder: Path, split: str,
              columns: tuple[str, ...]) -> list[tuple[str, tuple[int, ...], str, str]]:
    return [
        (str(folder / row["fname"]), tuple(parse_int(row[c], path, line, c) for c in columns), split, f"{path}:{line}")
        for line, row in read_dyml_csv(path, columns)
    ]


def load_dyml(root: Path, split: str, subset: str, granularity: str = "fine") -> Items:
    if split in ("train", "test"):
        folder = root / ("train" if split == "train" else "mini-bmk_all_in_one")
        return Items.from_rows(_labelled(folder / "label.csv", folder / "imgs", split, LABEL_COLUMNS), LEVEL_NAMES)
    if granularity not in GRANULARITIES:
        raise ValueError(f"dyml granularity must be one of {GRANULARITIES}, got {granularity!r}")
    bench = root / f"bmk_{granularity}"
    rows = [r for kind in ("query", "gallery")
            for r in _labelled(bench / f"{kind}.csv", bench / kind, kind, ("labels",))]
    note = {"granularity": granularity, "gallery_contains_queries": True}
    return Items.from_rows(rows, (granularity,), extra={"query": note, "gallery": note})


PUBLISHED_CLASSES = {"vehicle": (39491, 93, 5), "animal": (495, 28, 5), "product": (1639, 171, 36)}
for _subset, _classes in PUBLISHED_CLASSES.items():
    _splits = ("train", "test") if _subset == "product" else ("train", "query", "gallery")
    register_dataset(
        DatasetSpec(
            name=f"dyml_{_subset}",
            description=f"DyML-{_subset.title()} (fine -> middle -> coarse)"
            + ("; test = mini-bmk_all_in_one "
               "self-retrieval" if _subset == "product" else "; query/gallery per granularity= option"),
            level_names=LEVEL_NAMES,
            splits=_splits,
            evaluation_splits=("test",) if _subset == "product" else ("query", "gallery"),
            native_files=("train/label.csv", "train/imgs/")
            + (("mini-bmk_all_in_one/label.csv",) if _subset == "product"
               else ("bmk_{fine,middle,coarse}/{query,gallery}.csv",)),
            load=partial(load_dyml, subset=_subset),
            published={"train": dict(zip(LEVEL_NAMES, _classes))},
        )
    )
