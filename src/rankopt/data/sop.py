"""Stanford Online Products: ``Ebay_train.txt`` / ``Ebay_test.txt`` with the header
``image_id class_id super_class_id path``; levels product -> category (12 super-classes).
"""

from __future__ import annotations

from pathlib import Path

from rankopt.data.base import (DatasetSpec, Items, label_file_error, parse_int, read_lines, register_dataset,
                               split_fields)

HEADER = ["image_id", "class_id", "super_class_id", "path"]
LEVEL_NAMES = ("product", "category")


def load_sop(root: Path, split: str) -> Items:
    listing = root / f"Ebay_{split}.txt"
    rows = []
    for line, text in read_lines(listing):
        fields = split_fields(text, 4, listing, line)
        if line == 1:
            if fields != HEADER:
                raise label_file_error(listing, 1, f"expected the header {' '.join(HEADER)!r}, got {text!r}")
            continue
        _, class_id, super_id, rel = fields
        labels = (parse_int(class_id, listing, line, "class_id"), parse_int(super_id, listing, line, "super_class_id"))
        rows.append((str(root / rel), labels, split, f"{listing}:{line}"))
    return Items.from_rows(rows, LEVEL_NAMES)


SPEC = register_dataset(
    DatasetSpec(
        name="sop",
        description="Stanford Online Products (product -> 12 categories)",
        level_names=LEVEL_NAMES,
        splits=("train", "test"),
        evaluation_splits=("test",),
        native_files=("Ebay_train.txt", "Ebay_test.txt", "<category>_final/*.JPG"),
        load=load_sop,
        published={
            "train": {"images": 59551, "product": 11318, "category": 12},
            "test": {"images": 60502, "product": 11316, "category": 12},
        },
    )
)
