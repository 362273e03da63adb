"""DeepFashion In-shop: ``list_eval_partition.txt`` (line 1: count, line 2: header
``image_name item_id evaluation_status``, then ``img/<GENDER>/<Category>/id_X/NN_k_view.jpg
id_X train|query|gallery``). Levels: item -> ``GENDER/Category``. Query and gallery are disjoint
image sets sharing item identities, so their labels are remapped jointly.
"""

from __future__ import annotations

from pathlib import Path

from rankopt.data.base import DatasetSpec, Items, label_file_error, read_lines, register_dataset, split_fields

SPLITS = ("train", "query", "gallery")
LEVEL_NAMES = ("item", "category")


def _find(root: Path, *candidates: str) -> Path:
    for rel in candidates:
        if (root / rel).exists():
            return root / rel
    return root / candidates[0]


def load_inshop(root: Path, split: str) -> Items:
    listing = _find(root, "list_eval_partition.txt", "Eval/list_eval_partition.txt", "Anno/list_eval_partition.txt")
    image_root = root / "Img" if not (root / "img").exists() and (root / "Img").is_dir() else root
    rows = []
    for line, text in read_lines(listing):
        if line == 1:
            continue  # the image count
        fields = split_fields(text, 3, listing, line)
        if line == 2:
            if fields != ["image_name", "item_id", "evaluation_status"]:
                raise label_file_error(listing, 2,
                                       f"expected the header 'image_name item_id evaluation_status', got {text!r}")
            continue
        rel, item, status = fields
        if status not in SPLITS:
            raise label_file_error(listing, line, f"evaluation_status {status!r} not in {SPLITS}")
        parts = rel.split("/")
        if len(parts) < 5:
            raise label_file_error(listing, line, f"expected img/<GENDER>/<Category>/<id>/<file>, got {rel!r}")
        rows.append((str(image_root / rel), (item, f"{parts[1]}/{parts[2]}"), status, f"{listing}:{line}"))
    return Items.from_rows(rows, LEVEL_NAMES)


SPEC = register_dataset(
    DatasetSpec(
        name="inshop",
        description="DeepFashion In-shop clothes retrieval (item -> gender/category); query vs gallery",
        level_names=LEVEL_NAMES,
        splits=SPLITS,
        evaluation_splits=("query", "gallery"),
        native_files=("list_eval_partition.txt", "img/<GENDER>/<Category>/id_*/*.jpg"),
        load=load_inshop,
        published={
            "train": {"images": 25882, "item": 3997},
            "query": {"images": 14218, "item": 3985},
            "gallery": {"images": 12612, "item": 3985},
        },
    )
)
