"""CUB-200-2011: classes 1-100 train, 101-200 test (self-retrieval), as every paper.

Reads ``images.txt`` (``<image_id> <class folder>/<file>.jpg``) and, if present,
``image_class_labels.txt`` (``<image_id> <class_id>``); the class id otherwise comes from the
``NNN.`` prefix of the folder. Without ``images.txt`` the ``images/NNN.Name/`` folders are
listed (the ImageFolder layout of ROADMAP/SupRank). Images: ``<root>/images/<path>``.
"""

from __future__ import annotations

from pathlib import Path

from rankopt.data.base import (DatasetSpec, Items, label_file_error, parse_int, read_lines, register_dataset,
                               split_fields)

NUM_TRAIN_CLASSES = 100


def _class_from_folder(folder: str, path: Path, line: int) -> int:
    return parse_int(folder.split(".", 1)[0], path, line, "class folder prefix")


def _checked(cls: int, path: Path, line: int) -> int:
    if not 1 <= cls <= 2 * NUM_TRAIN_CLASSES:
        raise label_file_error(path, line, f"class id {cls} outside 1..{2 * NUM_TRAIN_CLASSES}")
    return cls


def load_cub(root: Path, split: str) -> Items:
    listing = root / "images.txt"
    entries: list[tuple[str, int, str]] = []  # (relative path, class id, source)
    if listing.is_file():
        labels_file = root / "image_class_labels.txt"
        class_of: dict[str, int] = {}
        if labels_file.is_file():
            for line, text in read_lines(labels_file):
                image_id, class_id = split_fields(text, 2, labels_file, line)
                class_of[image_id] = parse_int(class_id, labels_file, line, "class_id")
        for line, text in read_lines(listing):
            image_id, rel = split_fields(text, 2, listing, line)
            cls = (class_of[image_id] if image_id in class_of
                   else _class_from_folder(rel.split("/", 1)[0], listing, line))
            entries.append((rel, _checked(cls, listing, line), f"{listing}:{line}"))
    else:
        images = root / "images"
        if not images.is_dir():
            raise FileNotFoundError(f"cub200: neither {str(listing)!r} nor the folder {str(images)!r} exists")
        for folder in sorted(p for p in images.iterdir() if p.is_dir()):
            cls = _checked(_class_from_folder(folder.name, images, 0), images, 0)
            entries.extend((f"{folder.name}/{f.name}", cls, str(f)) for f in sorted(folder.glob("*.jpg")))
    rows = [
        (str(root / "images" / rel), (cls,), "train" if cls <= NUM_TRAIN_CLASSES else "test", source)
        for rel, cls, source in entries
    ]
    return Items.from_rows(rows, ("species",))


SPEC = register_dataset(
    DatasetSpec(
        name="cub200",
        description="CUB-200-2011 birds: classes 1-100 train, 101-200 test",
        level_names=("species",),
        splits=("train", "test"),
        evaluation_splits=("test",),
        native_files=("images.txt", "image_class_labels.txt", "images/NNN.Name/*.jpg"),
        load=load_cub,
        published={"train": {"images": 5864, "species": 100}, "test": {"images": 5924, "species": 100}},
    ),
    "cub",
)
