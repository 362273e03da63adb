"""Extended Yale Face Database B, cropped faces (Georghiades et al., TPAMI 2001; Lee et al., TPAMI
2005): 38 subjects, each under 64 lighting directions, identity-disjoint splits.

Root: the ``CroppedYale`` folder, one folder per subject ``yaleBNN`` (``yaleB01`` ... ``yaleB39``,
no ``yaleB14``) of 168 x 192 grayscale PGM images (converted to RGB when decoded) named
``yaleBNN_P00A+000E+00.pgm``: pose ``P00``, light azimuth ``A`` and elevation ``E`` in signed
degrees. The faces are the ``.pgm`` files so named. Left out: each folder's
``yaleBNN_P00_Ambient.pgm`` (ambient light only: no lighting direction, not a face of the
protocol) and the files that are no ``.pgm``: ``*.info``, ``WS_FTP.LOG``, ``DEADJOE`` and the
release's 18 ``*.pgm.bad``, images it marks bad (e.g. a nearly black failed exposure), so
38 x 64 - 18 = 2,414 faces. Any other ``.pgm`` name, a name whose subject is not its folder's, a
folder not named ``yaleBNN`` and a subject folder without faces are problems (raised together,
each naming its file).

Split (identity-disjoint, fixed by subject number so that a copy missing a folder keeps every other
subject on its side): subjects 1-20 (``yaleB01`` ... ``yaleB20``, 19 subjects) ``train``, subjects
21-39 (19) ``test``, evaluated as leave-one-out self-retrieval over all test faces.
Counts of the release (``published``): 2,414 faces of 38 subjects; train 1,198, test 1,216.

Per-item metadata (``metadata["pose"]``, ``["azimuth"]``, ``["elevation"]``: int64, one row per
item) follows the items through skipped files and carved validation splits.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from rankopt.data.base import DatasetProblems, DatasetSpec, Items, register_dataset

NAME = "yaleb"
LAST_TRAIN_SUBJECT = 20
SUBJECT_FOLDER = re.compile(r"yaleB(\d{2})")
FACE_FILE = re.compile(r"(?P<subject>yaleB\d{2})_P(?P<pose>\d{2})A(?P<azimuth>[+-]\d{3})E(?P<elevation>[+-]\d{2})\.pgm")
AMBIENT_FILE = re.compile(r"yaleB\d{2}_P\d{2}_Ambient\.pgm")
ITEM_FIELDS = ("pose", "azimuth", "elevation")


def load_yaleb(root: Path, split: str, keep_going: bool = False) -> Items:
    """Items of both splits (label: subject folder) with their pose, azimuth and elevation.

    ``keep_going`` (``dataset-info``): the problems go to ``metadata["problems"]`` and the bad
    files are left out instead of raising."""
    problems: list[str] = []
    notes: list[str] = []
    rows, fields = [], []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        number = SUBJECT_FOLDER.fullmatch(folder.name)
        if number is None:
            problems.append(f"{folder}: not a subject folder (want yaleBNN)")
            continue
        side = "train" if int(number.group(1)) <= LAST_TRAIN_SUBJECT else "test"
        before = len(rows)
        for path in sorted(folder.glob("*.pgm")):
            face = FACE_FILE.fullmatch(path.name)
            if face is None:
                if AMBIENT_FILE.fullmatch(path.name) is None:
                    problems.append(f"{path}: not a face file name (want {folder.name}_P00A+000E+00.pgm)")
            elif face["subject"] != folder.name:
                problems.append(f"{path}: a face of {face['subject']} in the folder of {folder.name}")
            else:
                rows.append((str(path), (folder.name,), side, str(path)))
                fields.append([int(face[key]) for key in ITEM_FIELDS])
        if len(rows) == before:
            problems.append(f"{folder}: subject folder without any face image")
    if not rows:
        raise FileNotFoundError(f"dataset {NAME!r}: no yaleBNN folder with faces in {str(root)!r} "
                                "(root must be the CroppedYale folder)")
    corrupt = sorted(root.glob("*/*.pgm.bad"))
    if corrupt:
        notes.append(f"{len(corrupt)} *.pgm.bad file(s) (marked corrupt in the release) left out, "
                     f"e.g. {corrupt[0]}")
    if problems and not keep_going:
        raise DatasetProblems(NAME, problems, notes)
    table = np.asarray(fields, dtype=np.int64)
    extra = {"problems": problems, "notes": notes}
    return Items.from_rows(rows, ("subject",), per_item={key: table[:, i] for i, key in enumerate(ITEM_FIELDS)},
                           extra={"train": extra, "test": extra})


SPEC = register_dataset(
    DatasetSpec(
        name=NAME,
        description="Extended Yale B cropped faces (subject) under 64 lightings (ambient and marked-bad images left "
                    "out); "
                    "subjects 1-20 train, 21-39 test (leave-one-out); per-item pose, azimuth, elevation",
        level_names=("subject",),
        splits=("train", "test"),
        evaluation_splits=("test",),
        native_files=("yaleBNN/yaleBNN_P00A+000E+00.pgm (root = CroppedYale)",),
        load=load_yaleb,
        published={"train": {"images": 1198, "subject": 19}, "test": {"images": 1216, "subject": 19}},
    )
)
