"""IJB-C (Maze et al., ICB 2018) for face retrieval and 1:1 verification: Smooth-AP §5.1 (Table 1), §6.3.

One split, ``test``. An item is one face in one still image or video frame, its label the subject.
``dataset.metadata``:

- ``media``: ``(N,)`` int64, the media (instance) of each item: items of one subject in one media
  share an id (a video's frames; a still is its own media). Smooth-AP §5.1 treats "each video as a
  single instance by averaging the CNN-produced vectors for each frame" (``rankopt.engine.embed_and_score``).
- ``templates``: ``(M, 2)`` int64 rows ``(template_id, item_index)``, ``item_index`` a position in the
  returned dataset (an item may be in several templates).
- ``template_pairs``: ``(P, 3)`` int64 rows ``(template1, template2, label)``, label 1 for the same
  subject, when a pairs file is there; only the pairs whose two templates keep an item after the
  identity filter. (With ``on_bad_image="skip"``, a template whose every image is bad loses its
  ``templates`` rows, and verification scoring then names the pairs that use it.)

Identity filter (Smooth-AP §5.1, "identities with less than 5 instances (images or videos) are
removed"): subjects with fewer than ``min_instances`` (5) distinct media leave, with their items,
template rows and pairs. ``published`` are Smooth-AP Table 1's counts after it: 148,824 images of
3,531 subjects (the NIST release; the loose-crop package counts crops, see below).

Subjects come from the three 1:N protocol files ``ijbc_1N_gallery_G1.csv``,
``ijbc_1N_gallery_G2.csv`` and ``ijbc_1N_probe_mixed.csv`` (header ``TEMPLATE_ID,SUBJECT_ID,FILENAME,
SIGHTING_ID,FACE_X,FACE_Y,FACE_WIDTH,FACE_HEIGHT``; their templates are also the 1:1 protocol's), in
``root/meta``, ``root/protocols`` or ``root/protocols/archive`` (the first holding them). The pairs
file is looked for in that folder: ``ijbc_template_pair_label.txt`` (``<template1> <template2>
<label>``, labels checked against the subjects), else ``ijbc_11_G1_G2_matches.csv``
(``<template1>,<template2>``, no header; label = same subject). Two layouts of ``root``
(``source=None`` picks ``loose_crop`` when ``meta/ijbc_face_tid_mid.txt`` exists, else ``release``):

- ``source="loose_crop"``, insightface's IJB-C package (``IJBC/``): ``meta/ijbc_face_tid_mid.txt``
  (``<n>.jpg <template_id> <media_id>``; one loose crop ``loose_crop/<n>.jpg`` per row: a face in
  several templates is cropped once per template, so items are crops and each is in one template;
  the copies share their media, which media averaging merges into one instance);
  ``meta/ijbc_name_5pts_score.txt`` (``<n>.jpg``, 5 (x, y) points in the crop: left eye, right
  eye, nose, left and right mouth corner, then a detector score). With ``align`` (default: when
  that file exists) each crop is aligned on its points to ``align_size`` x ``align_size``
  (:func:`~rankopt.data.face_alignment.align_face`, the ArcFace crops of Smooth-AP §5.3).
- ``source="release"``, the NIST release (``IJB-C/``): the images ``images/<FILENAME>``
  (``img/<n>.jpg`` stills, ``frames/<n>.png`` video frames). A face is a (``FILENAME``, ``SUBJECT_ID``)
  pair of the protocol rows (an image may show several subjects), cropped to its first row's
  ``FACE_X, FACE_Y, FACE_WIDTH, FACE_HEIGHT`` box extended by ``box_extension``
  (:func:`~rankopt.data.face_alignment.extend_box`; 0.3 for SENet-50 as VGGFace2); its media is its
  ``SIGHTING_ID`` (shared by a video's frames), or, in files without that column, its file (each
  frame its own media; noted).

Problems (malformed lines, unknown templates or images, conflicting subjects, labels that are not
0/1 or contradict the subjects, missing landmarks) are collected and raised together as
:class:`~rankopt.data.base.DatasetProblems`, each naming its ``file:line``.
"""

from __future__ import annotations

import csv
import math
import warnings
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rankopt.data.base import (
    DatasetProblems, DatasetSpec, Items, label_file_error, read_lines, register_dataset, require_file,
)
from rankopt.data.face_alignment import ARCFACE_SIZE, extend_box

NAME = "ijbc"
SOURCES = ("loose_crop", "release")
MIN_INSTANCES = 5
PROTOCOL_FILES = ("ijbc_1N_gallery_G1.csv", "ijbc_1N_gallery_G2.csv", "ijbc_1N_probe_mixed.csv")
PROTOCOL_FOLDERS = ("meta", "protocols", "protocols/archive")
FACE_LIST = "meta/ijbc_face_tid_mid.txt"
LANDMARK_FILE = "meta/ijbc_name_5pts_score.txt"
PAIR_LABEL_FILE = "ijbc_template_pair_label.txt"
MATCHES_FILE = "ijbc_11_G1_G2_matches.csv"
BOX_COLUMNS = ("FACE_X", "FACE_Y", "FACE_WIDTH", "FACE_HEIGHT")
SHOWN_PER_KIND = 10  # bad pair rows named one by one per kind of problem, the rest counted


@dataclass
class _Faces:
    """The faces one layout lists, before the identity filter: path, subject, raw media key and
    ``file:line`` of each; template rows ``(template_id, face)``; crop boxes or landmarks."""

    paths: list[str] = field(default_factory=list)
    subjects: list[int] = field(default_factory=list)
    media: list[Hashable] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    templates: list[tuple[int, int]] = field(default_factory=list)
    boxes: dict[int, tuple[float, float, float, float]] = field(default_factory=dict)
    landmarks: dict[int, np.ndarray] = field(default_factory=dict)

    def add(self, path: str, subject: int, media: Hashable, source: str) -> int:
        self.paths.append(path)
        self.subjects.append(subject)
        self.media.append(media)
        self.sources.append(source)
        return len(self.paths) - 1


# --------------------------------------------------------------------------- protocol files
def _protocol_folder(root: Path) -> Path:
    """The first of ``root/meta``, ``root/protocols``, ``root/protocols/archive`` with the 1:N files."""
    for folder in PROTOCOL_FOLDERS:
        if (root / folder / PROTOCOL_FILES[0]).is_file():
            return root / folder
    where = ", ".join(str(root / folder) for folder in PROTOCOL_FOLDERS)
    raise FileNotFoundError(f"dataset {NAME!r}: {PROTOCOL_FILES[0]} (IJB-C 1:N protocol) found in none of {where}")


def _csv_rows(folder: Path, columns: tuple[str, ...]) -> Iterator[tuple[str, dict[str, str]]]:
    """``(file:line, row)`` of each 1:N protocol file, its header checked for ``columns``."""
    for name in PROTOCOL_FILES:
        path = require_file(folder / name, "IJB-C protocol file")
        with open(path, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            reader.fieldnames = header = [h.strip() for h in reader.fieldnames or ()]
            missing = [c for c in columns if c not in header]
            if missing:
                raise label_file_error(path, 1, f"missing column(s) {missing}; header: {','.join(header) or '(empty)'}")
            for row in reader:
                yield f"{path}:{reader.line_num}", {k: (v or "").strip() for k, v in row.items() if k is not None}


def _read_protocol(folder: Path, columns: tuple[str, ...], problems: list[str]
                   ) -> tuple[list[tuple[str, int, int, dict[str, str]]], dict[int, int]]:
    """Rows ``(file:line, template, subject, row)`` of the 1:N files and each template's subject."""
    rows, subject_of, first_seen = [], {}, {}
    for source, row in _csv_rows(folder, columns):
        try:
            template, subject = int(row["TEMPLATE_ID"]), int(row["SUBJECT_ID"])
        except ValueError:
            problems.append(f"{source}: TEMPLATE_ID and SUBJECT_ID must be integers, got "
                            f"{row['TEMPLATE_ID']!r} and {row['SUBJECT_ID']!r}")
            continue
        if subject_of.setdefault(template, subject) != subject:
            problems.append(f"{source}: template {template} has subject {subject} here and "
                            f"{subject_of[template]} at {first_seen[template]}")
            continue
        first_seen.setdefault(template, source)
        rows.append((source, template, subject, row))
    return rows, subject_of


# --------------------------------------------------------------------------- the two layouts
def _loose_crop_faces(root: Path, subject_of: dict[int, int], problems: list[str]) -> tuple[_Faces, dict[str, int]]:
    """The crops of ``meta/ijbc_face_tid_mid.txt`` and the face index of each crop name."""
    listing, faces, index_of = root / FACE_LIST, _Faces(), {}
    for line, text in read_lines(listing):
        fields = text.split()
        if len(fields) != 3:
            problems.append(f"{listing}:{line}: expected '<image> <template_id> <media_id>', got {text[:80]!r}")
            continue
        name = fields[0]
        try:
            template, media = int(fields[1]), int(fields[2])
        except ValueError:
            problems.append(f"{listing}:{line}: template and media ids must be integers, got {text[:80]!r}")
            continue
        if name in index_of:
            problems.append(f"{listing}:{line}: {name!r} is also listed at {faces.sources[index_of[name]]}")
        elif template not in subject_of:
            problems.append(f"{listing}:{line}: template {template} is in none of {', '.join(PROTOCOL_FILES)}")
        else:
            index_of[name] = face = faces.add(str(root / "loose_crop" / name), subject_of[template], media,
                                              f"{listing}:{line}")
            faces.templates.append((template, face))
    return faces, index_of


def _read_landmarks(path: Path, index_of: dict[str, int], problems: list[str]) -> dict[int, np.ndarray]:
    """``{face: (5, 2) points}`` from ``ijbc_name_5pts_score.txt``."""
    points: dict[int, np.ndarray] = {}
    first_line: dict[int, int] = {}
    for line, text in read_lines(require_file(path, "IJB-C landmark file")):
        fields = text.split()
        if len(fields) != 12:
            problems.append(f"{path}:{line}: expected '<image> x1 y1 ... x5 y5 <score>' (12 fields), got {len(fields)}")
            continue
        try:
            values = np.array([float(v) for v in fields[1:11]])
        except ValueError:
            problems.append(f"{path}:{line}: landmark coordinates must be numbers, got {' '.join(fields[1:11])[:80]!r}")
            continue
        face = index_of.get(fields[0])
        if not np.isfinite(values).all():
            problems.append(f"{path}:{line}: landmark coordinates must be finite, got {' '.join(fields[1:11])[:80]!r}")
        elif face is None:
            problems.append(f"{path}:{line}: landmarks for {fields[0]!r}, an image {FACE_LIST} does not list")
        elif face in first_line:
            problems.append(f"{path}:{line}: second landmarks for {fields[0]!r} (first at line {first_line[face]})")
        else:
            first_line[face] = line
            points[face] = values.reshape(5, 2)
    return points


def _release_faces(root: Path, rows: list[tuple[str, int, int, dict[str, str]]], box_extension: float,
                   problems: list[str], notes: list[str]) -> _Faces:
    """One face per (FILENAME, SUBJECT_ID) of the protocol rows, boxed and with its media."""
    faces, index_of, first = _Faces(), {}, {}
    differing = without_sighting = 0
    for source, template, subject, row in rows:
        key = (row["FILENAME"], subject)
        described = (tuple(row[c] for c in BOX_COLUMNS), row.get("SIGHTING_ID", ""))
        face = index_of.get(key)
        if face is None:
            try:
                x, y, width, height = (float(row[c]) for c in BOX_COLUMNS)
            except ValueError:
                problems.append(f"{source}: {', '.join(BOX_COLUMNS)} must be numbers, got {', '.join(described[0])!r}")
                continue
            if not row["FILENAME"]:
                problems.append(f"{source}: empty FILENAME")
                continue
            if not all(math.isfinite(v) for v in (x, y, width, height)) or width <= 0 or height <= 0:
                problems.append(f"{source}: face box must be finite with FACE_WIDTH, FACE_HEIGHT > 0, got "
                                f"{', '.join(described[0])}")
                continue
            sighting = described[1]
            without_sighting += not sighting
            media = ("sighting", sighting) if sighting else ("file", row["FILENAME"])
            index_of[key] = face = faces.add(str(root / "images" / row["FILENAME"]), subject, media, source)
            faces.boxes[face] = extend_box(x, y, width, height, box_extension)
            first[face] = described
        elif described != first[face]:
            differing += 1
        faces.templates.append((template, face))
    if differing:
        notes.append(f"{differing} protocol row(s) repeat a face (FILENAME, SUBJECT_ID) with another box or "
                     "SIGHTING_ID than its first row; the first row's are used")
    if without_sighting:
        notes.append(f"{without_sighting} face(s) come from protocol files without SIGHTING_ID: each file is its "
                     "own media (a video's frames are not grouped)")
    return faces


# --------------------------------------------------------------------------- template pairs
def _int_rows(path: Path, width: int, delimiter: str | None,
              problems: list[str]) -> tuple[np.ndarray, np.ndarray | None]:
    """``(rows (R, width) int64, line of each row)`` of ``path`` (numpy's parser; a line-by-line pass
    only when it fails, to name the malformed lines, which are left out). Line numbers are None when
    every non-empty line is a row (row ``r`` is then the ``r``-th non-empty line)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an empty file
            table = np.loadtxt(path, dtype=np.int64, delimiter=delimiter, comments=None, ndmin=2)
        if table.size == 0 or table.shape[1] == width:
            return table.reshape(-1, width), None
    except ValueError:
        pass
    rows, lines = [], []
    for line, text in read_lines(path):
        fields = text.split(delimiter)
        try:
            if len(fields) != width:
                raise ValueError(f"expected {width} fields, got {len(fields)}")
            rows.append([int(f) for f in fields])
            lines.append(line)
        except ValueError as err:
            problems.append(f"{path}:{line}: {err}: {text[:80]!r}")
    return np.asarray(rows, dtype=np.int64).reshape(-1, width), np.asarray(lines, dtype=np.int64)


def _name_rows(path: Path, lines: np.ndarray | None, bad: np.ndarray, describe: Callable[[int], str],
               problems: list[str]) -> None:
    """One problem per bad row (``describe(row)``, up to :data:`SHOWN_PER_KIND`), the rest counted."""
    rows = np.flatnonzero(bad)
    if rows.size == 0:
        return
    if lines is None:
        lines = np.array([line for line, _ in read_lines(path)])
    problems += [f"{path}:{lines[r]}: {describe(int(r))}" for r in rows[:SHOWN_PER_KIND]]
    if rows.size > SHOWN_PER_KIND:
        problems.append(f"{path}: ... and {rows.size - SHOWN_PER_KIND} more such row(s)")


def _template_pairs(folder: Path, subject_of: dict[int, int], problems: list[str]) -> np.ndarray | None:
    """``(P, 3)`` rows ``(template1, template2, label)`` of the pairs file in ``folder``, if any: the
    rows naming known templates, with a 0/1 label that agrees with their subjects."""
    labelled = folder / PAIR_LABEL_FILE
    path = labelled if labelled.is_file() else folder / MATCHES_FILE
    if not path.is_file():
        return None
    width = 3 if path == labelled else 2
    table, lines = _int_rows(path, width, None if width == 3 else ",", problems)
    known = np.array(sorted(subject_of), dtype=np.int64)
    subjects = np.array([*(subject_of[t] for t in known.tolist()), -1], dtype=np.int64)  # -1: not found
    found = [np.isin(table[:, c], known) for c in (0, 1)]
    for c in (0, 1):
        _name_rows(path, lines, ~found[c], lambda r, c=c: f"template {table[r, c]} is in none of "
                   f"{', '.join(PROTOCOL_FILES)}", problems)
    subject_pair = [subjects[np.searchsorted(known, table[:, c])] for c in (0, 1)]
    same = (subject_pair[0] == subject_pair[1]).astype(np.int64)
    usable = found[0] & found[1]
    if width == 2:
        return np.column_stack([table, same])[usable]
    valid = np.isin(table[:, 2], (0, 1))
    _name_rows(path, lines, ~valid, lambda r: f"label must be 0 or 1, got {table[r, 2]}", problems)
    wrong = usable & valid & (table[:, 2] != same)
    _name_rows(path, lines, wrong, lambda r: f"label {table[r, 2]}, but templates {table[r, 0]} and {table[r, 1]} "
               f"are of {'one subject' if same[r] else 'different subjects'} in the protocol files", problems)
    return table[usable & valid & ~wrong]


# --------------------------------------------------------------------------- loader
def _identity_filter(faces: _Faces, usable: np.ndarray, min_instances: int,
                     notes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """``(kept, media)``: the faces of the subjects with ``>= min_instances`` distinct media among
    their usable faces (Smooth-AP §5.1), and each usable face's media id (its (subject, media key)
    pair, numbered in order of appearance; -1 for the others)."""
    media_ids: dict[tuple[int, Hashable], int] = {}
    media = np.array([media_ids.setdefault((subject, key), len(media_ids)) if ok else -1
                      for subject, key, ok in zip(faces.subjects, faces.media, usable)], dtype=np.int64)
    count = Counter(subject for subject, _ in media_ids)
    kept_subjects = [subject for subject, n in count.items() if n >= min_instances]
    kept = usable & np.isin(np.asarray(faces.subjects, dtype=np.int64), np.asarray(kept_subjects, dtype=np.int64))
    if len(kept_subjects) < len(count):
        notes.append(f"identity filter (Smooth-AP §5.1): {len(count) - len(kept_subjects)} of {len(count)} subject(s) "
                     f"have fewer than {min_instances} media; their {int((usable & ~kept).sum())} image(s) are left "
                     "out")
    return kept, media


def load_ijbc(root: Path, split: str, source: str | None = None, min_instances: int = MIN_INSTANCES,
              align: bool | None = None, align_size: int = ARCFACE_SIZE, box_extension: float = 0.0,
              keep_going: bool = False) -> Items:
    """The ``test`` items of the IJB-C copy at ``root`` (module docstring).

    ``keep_going`` (``dataset-info``): the problems go to ``metadata["problems"]`` and the bad
    rows are left out instead of raising."""
    source = source or ("loose_crop" if (root / FACE_LIST).is_file() else "release")
    if source not in SOURCES:
        raise ValueError(f"{NAME} source must be one of {SOURCES}, got {source!r}")
    if min_instances < 1:
        raise ValueError(f"{NAME} min_instances must be >= 1, got {min_instances}")
    if align is None:
        align = source == "loose_crop" and (root / LANDMARK_FILE).is_file()
    if align and source != "loose_crop":
        raise ValueError(f"{NAME}: align=True needs the loose crops ({LANDMARK_FILE} holds points in the crops)")
    if box_extension and source != "release":
        raise ValueError(f"{NAME}: box_extension applies to source='release' (the protocol files' face boxes)")
    problems: list[str] = []
    notes: list[str] = []
    folder = _protocol_folder(root)
    columns = ("TEMPLATE_ID", "SUBJECT_ID", "FILENAME", *(BOX_COLUMNS if source == "release" else ()))
    rows, subject_of = _read_protocol(folder, columns, problems)
    if source == "loose_crop":
        faces, index_of = _loose_crop_faces(root, subject_of, problems)
        if align:
            faces.landmarks = _read_landmarks(root / LANDMARK_FILE, index_of, problems)
            problems += [f"{faces.sources[face]}: no landmarks for {name!r} in {root / LANDMARK_FILE}"
                         for name, face in index_of.items() if face not in faces.landmarks]
    else:
        faces = _release_faces(root, rows, box_extension, problems, notes)
    pairs = _template_pairs(folder, subject_of, problems)

    usable = np.array([not align or face in faces.landmarks for face in range(len(faces.paths))], dtype=bool)
    kept, face_media = _identity_filter(faces, usable, min_instances, notes)
    position = np.cumsum(kept) - 1
    templates = np.asarray(faces.templates, dtype=np.int64).reshape(-1, 2)
    templates = np.unique(templates[kept[templates[:, 1]]], axis=0)
    templates[:, 1] = position[templates[:, 1]]
    extra: dict[str, Any] = {"notes": notes, "problems": problems, "source": source, "min_instances": min_instances}
    if pairs is not None:
        both = np.isin(pairs[:, 0], templates[:, 0]) & np.isin(pairs[:, 1], templates[:, 0])
        if not both.all():
            notes.append(f"{int((~both).sum())} of {len(pairs)} template pair(s) name a template with no image left "
                         "(identity filter) and are left out")
        extra["template_pairs"] = pairs[both]
    chosen = np.flatnonzero(kept)
    if problems and not (keep_going and chosen.size):
        raise DatasetProblems(NAME, problems, notes)
    item_rows = [(faces.paths[f], (faces.subjects[f],), split, faces.sources[f]) for f in chosen]
    return Items.from_rows(
        item_rows, ("subject",),
        boxes={i: faces.boxes[f] for i, f in enumerate(chosen) if f in faces.boxes},
        landmarks={i: faces.landmarks[f] for i, f in enumerate(chosen) if f in faces.landmarks},
        align_size=align_size,
        per_item={"media": np.unique(face_media[chosen], return_inverse=True)[1].astype(np.int64).reshape(-1)},
        item_tables={"templates": templates},
        extra={split: extra},
    )


SPEC = register_dataset(
    DatasetSpec(
        name=NAME,
        description="IJB-C faces (subject) with >= 5 media (images or videos); test = leave-one-out over media "
                    "instances, and 1:1 template verification (TAR@FAR) with the pairs file",
        level_names=("subject",),
        splits=("test",),
        evaluation_splits=("test",),
        native_files=("{meta,protocols,protocols/archive}/ijbc_1N_{gallery_G1,gallery_G2,probe_mixed}.csv",
                      "insightface package: meta/ijbc_face_tid_mid.txt, loose_crop/<n>.jpg, "
                      "[meta/ijbc_name_5pts_score.txt], [meta/ijbc_template_pair_label.txt]",
                      "NIST release: images/{img,frames}/..., [protocols/ijbc_11_G1_G2_matches.csv]"),
        load=load_ijbc,
        published={"test": {"images": 148824, "subject": 3531}},
    )
)
