"""VGGFace2 (Cao et al., FG 2018) in its native layout: Smooth-AP §5.1 (Table 1) and §5.3.

Files (the lists and ``bb_landmark/`` in ``root`` or in ``root/meta``):

- ``train_list.txt`` / ``test_list.txt``: one ``<identity>/<file>.jpg`` per line
  (``n000002/0001_01.jpg``); the images are ``train/<identity>/<file>.jpg`` and ``test/...``;
- ``bb_landmark/loose_bb_train.csv`` / ``loose_bb_test.csv``: header ``NAME_ID,X,Y,W,H``, then one
  face box per image, ``"n000002/0001_01",161,140,224,324`` (top-left corner and size, pixels).

``crop="loose"`` (the default; it needs the box file): each image is cropped to its box extended by
``box_extension`` = 0.3 (:func:`~rankopt.data.face_alignment.extend_box`: 0.15 of the width and of
the height on each side), the part outside the image cut off, as the VGGFace2 authors pre-process
(ox-vgg/vgg_face2 README: the detector box "extended by a factor 0.3 (except the extension outside
image) to include the whole head"; the released images are crops extended by 1.0). These are the
crops Smooth-AP §5.3 gives SENet-50 (then resized to 224 x 224: the ``vggface2_*`` transforms).
``crop=None``: the whole released images, box file not read.

``test`` is evaluated as leave-one-out self-retrieval over all its images (Smooth-AP Table 4).
Counts (``published``): VGGFace2 paper, train 3,141,890 images of 8,631 identities, test 169,396 of
500. Smooth-AP Table 1 writes "3.31 M" for train, the size of the whole dataset (3,311,286 with the
test set), but its 363.7 images per identity is the train count's (3,141,890 / 8,631 = 364.0; 3.31 M
would give 383.5), so the train count is used.

Problems (a malformed list or box line, an image listed twice, a box that is not positive or
belongs to no listed image, a listed image without a box) are collected and raised together as
:class:`~rankopt.data.base.DatasetProblems`, each naming its ``file:line``; a listed image that is
missing is reported when the dataset is built (``BadImageError`` naming its list line).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from rankopt.data.base import DatasetProblems, DatasetSpec, Items, label_file_error, read_lines, register_dataset
from rankopt.data.face_alignment import extend_box

NAME = "vggface2"
SPLITS = ("train", "test")
CROPS = ("loose", None)
LOOSE_BOX_EXTENSION = 0.3
BOX_HEADER = ["NAME_ID", "X", "Y", "W", "H"]


def _native_file(root: Path, relative: str) -> Path:
    """``root/relative``, else ``root/meta/relative`` when only that exists."""
    path = root / relative
    return path if path.exists() or not (root / "meta" / relative).exists() else root / "meta" / relative


def _listed_images(listing: Path, problems: list[str]) -> dict[str, tuple[str, int]]:
    """``{<identity>/<file> without .jpg: (identity, line)}`` of a list file, in file order."""
    listed: dict[str, tuple[str, int]] = {}
    for line, text in read_lines(listing):
        identity, _, file = text.partition("/")
        if not identity or not file or "/" in file or len(text.split()) != 1 or not file.lower().endswith(".jpg"):
            problems.append(f"{listing}:{line}: expected '<identity>/<file>.jpg', got {text[:80]!r}")
            continue
        name = text[:-4]
        if name in listed:
            problems.append(f"{listing}:{line}: {text!r} is also listed at line {listed[name][1]}")
            continue
        listed[name] = (identity, line)
    return listed


def _loose_boxes(table: Path, listed: dict[str, tuple[str, int]], extension: float,
                 problems: list[str]) -> dict[str, tuple[float, float, float, float]]:
    """``{name: extended (x1, y1, x2, y2)}`` from a ``loose_bb_<split>.csv`` file."""
    if not table.is_file():
        raise FileNotFoundError(f"dataset {NAME!r}: face box file {str(table)!r} not found (crop='loose'); "
                                "pass crop=None to use the whole images")
    boxes: dict[str, tuple[float, float, float, float]] = {}
    first_line: dict[str, int] = {}
    with open(table, newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader, [])]
        if header != BOX_HEADER:
            raise label_file_error(table, 1, f"expected the header {','.join(BOX_HEADER)}, got {','.join(header)!r}")
        for fields in reader:
            line = reader.line_num
            if not any(f.strip() for f in fields):
                continue
            if len(fields) != len(BOX_HEADER):
                problems.append(f"{table}:{line}: expected {len(BOX_HEADER)} fields, got {len(fields)}: "
                                f"{','.join(fields)[:80]!r}")
                continue
            name = fields[0].strip()
            try:
                x, y, width, height = (float(v) for v in fields[1:])
            except ValueError:
                problems.append(f"{table}:{line}: X, Y, W, H must be numbers, got {','.join(fields[1:])!r}")
                continue
            if not all(math.isfinite(v) for v in (x, y, width, height)) or width <= 0 or height <= 0:
                problems.append(f"{table}:{line}: box of {name!r} must be finite with W, H > 0, got W={width:g} "
                                f"H={height:g}")
            elif name not in listed:
                problems.append(f"{table}:{line}: box for {name!r}, an image the list file does not list")
            elif name in first_line:
                problems.append(f"{table}:{line}: second box for {name!r} (first at line {first_line[name]})")
            else:
                first_line[name] = line
                boxes[name] = extend_box(x, y, width, height, extension)
    return boxes


def load_vggface2(root: Path, split: str, crop: str | None = "loose", box_extension: float = LOOSE_BOX_EXTENSION,
                  keep_going: bool = False) -> Items:
    """Items of ``split`` (label: identity folder), cropped as the module docstring says.

    ``keep_going`` (``dataset-info``): the problems go to ``metadata["problems"]`` and the bad lines
    and unboxed images are left out instead of raising."""
    if crop not in CROPS:
        raise ValueError(f"{NAME} crop must be one of {CROPS}, got {crop!r}")
    problems: list[str] = []
    listing = _native_file(root, f"{split}_list.txt")
    listed = _listed_images(listing, problems)
    boxes = None
    if crop == "loose":
        table = _native_file(root, f"bb_landmark/loose_bb_{split}.csv")
        boxes = _loose_boxes(table, listed, box_extension, problems)
        problems += [f"{listing}:{line}: no box for {name!r} in "
                     f"{table}" for name, (_, line) in listed.items() if name not in boxes]
    rows, kept_boxes = [], {}
    for name, (identity, line) in listed.items():
        if boxes is not None:
            if name not in boxes:
                continue
            kept_boxes[len(rows)] = boxes[name]
        rows.append((str(root / split / f"{name}.jpg"), (identity,), split, f"{listing}:{line}"))
    if problems and not (keep_going and rows):
        raise DatasetProblems(NAME, problems)
    return Items.from_rows(rows, ("identity",), boxes=kept_boxes, extra={split: {"problems": problems}})


SPEC = register_dataset(
    DatasetSpec(
        name=NAME,
        description="VGGFace2 faces (identity), crops of the loose boxes extended by 0.3 (crop=None: whole images); "
                    "test = leave-one-out self-retrieval",
        level_names=("identity",),
        splits=SPLITS,
        evaluation_splits=("test",),
        native_files=("{train,test}_list.txt", "{train,test}/<identity>/<file>.jpg",
                      "bb_landmark/loose_bb_{train,test}.csv (lists and bb_landmark/ also under meta/)"),
        load=load_vggface2,
        published={"train": {"images": 3141890, "identity": 8631}, "test": {"images": 169396, "identity": 500}},
    )
)
