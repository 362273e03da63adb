"""Cars196 (Stanford Cars): ``cars_annos.mat`` (the ``car_ims`` release); classes 1-98 train,
99-196 test (self-retrieval). Each annotation has ``relative_im_path`` (``car_ims/000001.jpg``)
and ``class`` (1-based); the official ``test`` flag is ignored, as in the papers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rankopt.data.base import DatasetSpec, Items, register_dataset, require_file

NUM_TRAIN_CLASSES = 98


def load_cars(root: Path, split: str) -> Items:
    from scipy.io import loadmat  # SciPy's MATLAB reader, loaded only for the datasets stored that way

    mat_path = require_file(root / "cars_annos.mat")
    try:
        annos = loadmat(str(mat_path), squeeze_me=True)["annotations"]
        paths = [str(p) for p in np.atleast_1d(annos["relative_im_path"])]
        classes = np.atleast_1d(annos["class"]).astype(np.int64)
    except (KeyError, ValueError, TypeError) as err:
        raise ValueError(f"{mat_path}: expected an 'annotations' struct with 'relative_im_path' and 'class' "
                         f"({err})") from err
    bad = np.flatnonzero((classes < 1) | (classes > 2 * NUM_TRAIN_CLASSES))
    if bad.size:
        raise ValueError(f"{mat_path}: annotation {int(bad[0]) + 1} has class {int(classes[bad[0]])} outside 1..196")
    rows = [
        (str(root / rel), (int(c),), "train" if c <= NUM_TRAIN_CLASSES else "test", f"{mat_path}:annotation {i + 1}")
        for i, (rel, c) in enumerate(zip(paths, classes))
    ]
    return Items.from_rows(rows, ("model",))


SPEC = register_dataset(
    DatasetSpec(
        name="cars196",
        description="Stanford Cars196: classes 1-98 train, 99-196 test",
        level_names=("model",),
        splits=("train", "test"),
        evaluation_splits=("test",),
        native_files=("cars_annos.mat", "car_ims/*.jpg"),
        load=load_cars,
        published={"train": {"images": 8054, "model": 98}, "test": {"images": 8131, "model": 98}},
    ),
    "cars",
)
