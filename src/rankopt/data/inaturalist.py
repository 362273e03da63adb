"""iNaturalist 2018 with the Smooth-AP retrieval splits (``Inat_dataset_splits/
Inaturalist_{train,test}_set1.txt``, one ``train_val2018/<supercategory>/<category_id>/<file>.jpg``
per line; disjoint species, self-retrieval on test).

- ``inat_base`` (alias ``inaturalist``): species (category id = parent folder) -> supercategory.
- ``inat_full``: the 7 taxonomy levels of ``train2018.json`` (or ``categories.json``) ``categories``:
  species, genus, family, order, class, phylum, kingdom. A level's label is the full lineage down
  to it, so the hierarchy is a tree even where names repeat across branches.
"""

from __future__ import annotations

import json
from pathlib import Path

from rankopt.data.base import DatasetSpec, Items, label_file_error, parse_int, read_lines, register_dataset

SPLIT_FILES = {"train": "Inaturalist_train_set1.txt", "test": "Inaturalist_test_set1.txt"}
BASE_LEVELS = ("species", "supercategory")
TAXONOMY = ("kingdom", "phylum", "class", "order", "family", "genus")  # coarse -> fine
FULL_LEVELS = ("species", "genus", "family", "order", "class", "phylum", "kingdom")


def _split_file(root: Path, split: str) -> Path:
    for folder in (root / "Inat_dataset_splits", root):
        if (folder / SPLIT_FILES[split]).is_file():
            return folder / SPLIT_FILES[split]
    return root / "Inat_dataset_splits" / SPLIT_FILES[split]


def _entries(root: Path, split: str) -> tuple[Path, list[tuple[str, int, str, int]]]:
    """The split file and its (image path, category id, supercategory, line number)."""
    listing = _split_file(root, split)
    out = []
    for line, rel in read_lines(listing):
        parts = rel.split("/")
        if len(parts) < 3:
            raise label_file_error(listing, line, f"expected <supercategory>/<category_id>/<file>, got {rel!r}")
        category = parse_int(parts[-2], listing, line, "category id (parent folder)")
        out.append((str(root / rel), category, parts[-3], line))
    return listing, out


def load_inat_base(root: Path, split: str) -> Items:
    listing, entries = _entries(root, split)
    rows = [(path, (cat, sup), split, f"{listing}:{line}") for path, cat, sup, line in entries]
    return Items.from_rows(rows, BASE_LEVELS)


def _taxonomy(root: Path) -> dict[int, tuple[int | str, ...]]:
    """category id -> labels finest first (species id, then lineage strings genus .. kingdom)."""
    for name in ("categories.json", "train2018.json"):
        path = root / name
        if path.is_file():
            break
    else:
        raise FileNotFoundError(f"inat_full needs {str(root / 'train2018.json')!r} (or categories.json) for the "
                                "taxonomy")
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    categories = data["categories"] if isinstance(data, dict) else data
    out = {}
    for cat in categories:
        try:
            lineage = ["/".join(cat[k] for k in TAXONOMY[: i + 1]) for i in range(len(TAXONOMY))]
            out[int(cat["id"])] = (int(cat["id"]), *reversed(lineage))
        except KeyError as err:
            raise ValueError(f"{path}: category {cat.get('id')!r} lacks the taxonomy field {err}") from None
    return out


def load_inat_full(root: Path, split: str) -> Items:
    taxonomy = _taxonomy(root)
    listing, entries = _entries(root, split)
    rows = []
    for path, cat, _, line in entries:
        if cat not in taxonomy:
            raise label_file_error(listing, line, f"category {cat} is not in the taxonomy file")
        rows.append((path, taxonomy[cat], split, f"{listing}:{line}"))
    return Items.from_rows(rows, FULL_LEVELS)


_PUBLISHED = {"train": {"images": 325846, "species": 5690}, "test": {"images": 136093, "species": 2452}}
_FILES = ("Inat_dataset_splits/Inaturalist_{train,test}_set1.txt", "train_val2018/<supercategory>/<id>/*.jpg")
for _name, _what, _levels, _load, _extra_files, _aliases in (
    ("inat_base", "species -> supercategory", BASE_LEVELS, load_inat_base, (), ("inaturalist",)),
    ("inat_full", "the 7 taxonomy levels of train2018.json", FULL_LEVELS, load_inat_full, ("train2018.json",), ()),
):
    register_dataset(
        DatasetSpec(
            name=_name,
            description=f"iNaturalist 2018, Smooth-AP retrieval splits ({_what})",
            level_names=_levels,
            splits=("train", "test"),
            evaluation_splits=("test",),
            native_files=(*_FILES, *_extra_files),
            load=_load,
            published=_PUBLISHED,
        ),
        *_aliases,
    )
