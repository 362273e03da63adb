"""Caltech-101 (Fei-Fei, Fergus and Perona, CVPR-W 2004) as released, split class-disjointly in the
CUB style: the first 50 categories train, the last 50 test (leave-one-out self-retrieval).

Root: the ``101_ObjectCategories`` folder (``<class>/image_NNNN.jpg``), or a folder holding it.
Classes are its folders in Python's ``sorted`` order (code-point order, so the capitalised
``Faces``, ``Leopards``, ``Motorbikes`` come before ``accordion``), less two that are no category
of their own (:data:`EXCLUDED`):

- ``BACKGROUND_Google``: clutter (images returned by a Google search, no object class);
- ``Faces_easy``: the photographs of ``Faces`` again, more tightly cropped around the face. Measured
  on the release: the two folders hold the same 435 names, and every ``Faces_easy/image_i.jpg`` is
  a same-scale crop of ``Faces/image_i.jpg`` (mean absolute grey-level difference at the best
  offset <= 4.2, JPEG noise, against >= 12.9 when placed in the next image of ``Faces``). Kept,
  every face photograph would belong to two classes.

That leaves 100 categories: ``train`` = the 50 that sort up to :data:`LAST_TRAIN_CLASS`
(``Faces`` ... ``helicopter``), ``test`` = the other 50 (``ibis`` ... ``yin_yang``). The boundary is
a name, not a position, so a copy missing a folder keeps every other class on its side.
Images: the ``.jpg`` files (any case) of a class folder; hidden entries are ignored, other files
are ignored and named in ``metadata["notes"]``; a class folder without any image is a problem.
Counts of the release (``published``): 9,144 JPEGs, 467 of them in ``BACKGROUND_Google`` and 435
in ``Faces_easy``; train 5,179 images, test 3,063.
"""

from __future__ import annotations

from pathlib import Path

from rankopt.data.base import DatasetProblems, DatasetSpec, Items, register_dataset

NAME = "caltech101"
RELEASE_FOLDER = "101_ObjectCategories"
EXCLUDED = {"BACKGROUND_Google": "clutter, not a category", "Faces_easy": "the photographs of Faces, cropped tighter"}
LAST_TRAIN_CLASS = "helicopter"


def _visible(folder: Path) -> list[Path]:
    return sorted((p for p in folder.iterdir() if not p.name.startswith(".")), key=lambda p: p.name)


def load_caltech101(root: Path, split: str, keep_going: bool = False) -> Items:
    """Items of both splits (label: class folder name), as the module docstring says.

    ``keep_going`` (``dataset-info``): the problems go to ``metadata["problems"]`` instead of raising."""
    folder = root / RELEASE_FOLDER if (root / RELEASE_FOLDER).is_dir() else root
    problems: list[str] = []
    notes: list[str] = []
    rows = []
    for entry in _visible(folder):
        if not entry.is_dir():
            notes.append(f"{entry}: not a class folder, ignored")
            continue
        files = [f for f in _visible(entry) if f.is_file()]
        images = [f for f in files if f.suffix.lower() == ".jpg"]
        if entry.name in EXCLUDED:
            notes.append(f"{entry}: left out ({EXCLUDED[entry.name]}), {len(images)} image(s)")
            continue
        notes += [f"{f}: not a .jpg file, ignored" for f in files if f.suffix.lower() != ".jpg"]
        if not images:
            problems.append(f"{entry}: class folder without any .jpg image")
        side = "train" if entry.name <= LAST_TRAIN_CLASS else "test"
        rows += [(str(f), (entry.name,), side, str(f)) for f in images]
    if not rows:
        raise FileNotFoundError(f"dataset {NAME!r}: no class folder with .jpg images in {str(folder)!r} "
                                f"(root must be the {RELEASE_FOLDER} folder)")
    if problems and not keep_going:
        raise DatasetProblems(NAME, problems, notes)
    extra = {"problems": problems, "notes": notes}
    return Items.from_rows(rows, ("category",), extra={"train": extra, "test": extra})


SPEC = register_dataset(
    DatasetSpec(
        name=NAME,
        description="Caltech-101 objects: the 100 categories (BACKGROUND_Google and Faces_easy left out) in sorted "
                    "order, first 50 train, last 50 test",
        level_names=("category",),
        splits=("train", "test"),
        evaluation_splits=("test",),
        native_files=(f"<category>/image_NNNN.jpg (root = {RELEASE_FOLDER} or its parent)",),
        load=load_caltech101,
        published={"train": {"images": 5179, "category": 50}, "test": {"images": 3063, "category": 50}},
    )
)
