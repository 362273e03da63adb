"""PKU VehicleID: ``train_test_split/train_list.txt`` and ``test_list_{800,1600,2400}.txt``
(``<image_id> <vehicle_id>`` per line), images ``image/<image_id>.jpg``.

Evaluation follows Smooth-AP and Patel et al.: leave-one-out self-retrieval over one test list
(``test_size`` = 800, 1600 or 2400 vehicles; R@1, R@5), not the probe/gallery protocol.
"""

from __future__ import annotations

from pathlib import Path

from rankopt.data.base import DatasetSpec, Items, parse_int, read_lines, register_dataset, split_fields

TEST_SIZES = (800, 1600, 2400)


def load_vehicleid(root: Path, split: str, test_size: int = 800) -> Items:
    if test_size not in TEST_SIZES:
        raise ValueError(f"vehicleid test_size must be one of {TEST_SIZES}, got {test_size!r}")
    name = "train_list.txt" if split == "train" else f"test_list_{test_size}.txt"
    listing = root / "train_test_split" / name
    rows = []
    for line, text in read_lines(listing):
        image_id, vehicle = split_fields(text, 2, listing, line)
        label = (parse_int(vehicle, listing, line, "vehicle_id"),)
        rows.append((str(root / "image" / f"{image_id}.jpg"), label, split, f"{listing}:{line}"))
    return Items.from_rows(rows, ("vehicle",))


SPEC = register_dataset(
    DatasetSpec(
        name="vehicleid",
        description="PKU VehicleID (vehicle identity); test = leave-one-out over test_list_<test_size>",
        level_names=("vehicle",),
        splits=("train", "test"),
        evaluation_splits=("test",),
        native_files=("train_test_split/train_list.txt", "train_test_split/test_list_{800,1600,2400}.txt",
                      "image/*.jpg"),
        load=load_vehicleid,
        published={
            "train": {"images": 110178, "vehicle": 13134},
            "test": {"images": 7332, "vehicle": 800},
            "test[test_size=800]": {"images": 7332, "vehicle": 800},
            "test[test_size=1600]": {"images": 12995, "vehicle": 1600},
            "test[test_size=2400]": {"images": 20038, "vehicle": 2400},
        },
    )
)
