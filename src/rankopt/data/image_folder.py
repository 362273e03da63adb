"""``image_folder``: a user's own images, one folder per class (``data.name=image_folder data.root=DIR``).

Layout: ``DIR/<top>/.../<class>/<image>``, every image at the same folder depth ``L >= 1``; each
depth is a label level. Column 0 (finest) is the folder holding the images, the last column the
top folder. A class is its path relative to DIR (``a/1`` and ``b/1`` are different classes): the
raw label of level ``c`` is the first ``L - c`` components of the image's folder path. Level names
default to ``("class", "level1", ..., "level{L-1}")`` (``level{c}`` = label column ``c``, as the
metric ``ap@level{c}``); ``level_names=[...]`` names them.

Images are the files whose suffix is in :data:`IMAGE_SUFFIXES` (any case); hidden files and
folders (``.name``) are ignored; other files are ignored and listed in ``metadata["notes"]``.

Splits:

- ``DIR/train`` and ``DIR/test`` folders: those (``test`` is evaluated as self-retrieval);
  ``DIR/train``, ``DIR/query``, ``DIR/gallery``: query against gallery (they share identities and
  are remapped jointly). ``DIR/validation`` is an optional extra split. Each is a class tree.
  Train and evaluation classes must differ unless ``class_disjoint=False`` (closed-set data).
- otherwise the classes are split class-disjointly (open-set protocol): ``test_fraction`` (0.5)
  of the classes of label column ``split_level`` go to ``test``, drawn with ``split_seed`` (0) by
  :func:`rankopt.data.splits.held_out_classes`. The default ``split_level=0`` holds out finest
  classes, so a coarser folder is seen both in training and in testing (the SOP / iNaturalist
  protocol, which the hierarchical metrics need); ``split_level=-1`` holds out whole top folders
  (Omniglot's alphabets). Or explicit lists: ``train_classes=FILE`` and/or ``test_classes=FILE``,
  one class (or coarser folder) path per line, ``#`` comments; with one list the other side gets
  the remaining classes, with both the classes in neither are left out. The split is kept in
  ``metadata["class_split"]`` (the run folder's ``classes/{train,test}.txt``, loadable back).
- ``all``: every image, no split (indexing a collection).

Every problem (empty folders, mixed depths, bad class lists, shared classes) is collected and
raised together as :class:`~rankopt.data.base.DatasetProblems`. Nothing is written into DIR.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rankopt.data.base import (
    DatasetProblems,
    DatasetSpec,
    Items,
    RetrievalDataset,
    label_names,
    read_lines,
    register_dataset,
    remap_labels,
    require_file,
    require_root,
)
from rankopt.data.splits import held_out_classes

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"})
NAME = "image_folder"


def is_image_file(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` has an image suffix (:data:`IMAGE_SUFFIXES`, any case)."""
    return Path(path).suffix.lower() in IMAGE_SUFFIXES


def _suffix_list() -> str:
    return " ".join(sorted(IMAGE_SUFFIXES))


# --------------------------------------------------------------------------- walking a folder
@dataclass(frozen=True)
class FolderScan:
    """A walk of ``root`` (hidden entries skipped): its images (sorted), its other files and the
    folders with no image anywhere beneath them."""

    root: Path
    images: list[Path]
    other_files: list[Path]
    empty_folders: list[Path]

    def depth(self, image: Path) -> int:
        """Folder depth of an image below ``root`` (0: directly in it)."""
        return len(image.relative_to(self.root).parts) - 1


def scan_folder(root: Path) -> FolderScan:
    """Walk ``root`` once (symbolic links to folders are not followed), reading nothing but names."""
    images: list[Path] = []
    others: list[Path] = []
    folders: list[Path] = []
    for current, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        here = Path(current)
        if here != root:
            folders.append(here)
        for name in filenames:
            if not name.startswith("."):
                (images if is_image_file(name) else others).append(here / name)
    nonempty = {parent for image in images for parent in image.parents}
    return FolderScan(root, sorted(images), sorted(others), [f for f in folders if f not in nonempty])


def class_tree(scan: FolderScan, *, loose_ok: bool = False) -> tuple[dict[str, list[Path]], int, list[str]]:
    """``({class path: its images}, depth, problems)`` of the images in sub-folders.

    Every image must sit at the same depth ``>= 1``; with ``loose_ok`` images directly in the root
    are left out of the tree instead of being a problem (``rankopt embed --images``)."""
    by_depth: dict[int, list[Path]] = {}
    for image in scan.images:
        by_depth.setdefault(scan.depth(image), []).append(image)
    if loose_ok:
        by_depth.pop(0, None)
    if not by_depth:
        where = "in sub-folders of" if loose_ok else "under"
        return {}, 0, [f"no image ({_suffix_list()}) {where} {str(scan.root)!r}"]
    if set(by_depth) == {0}:
        return {}, 0, [(f"no class folders in {str(scan.root)!r}: its images sit directly in it "
                        "(put each class's images in a folder of its own)")]
    if len(by_depth) > 1:
        examples = ", ".join(f"depth {d}: {by_depth[d][0].relative_to(scan.root).as_posix()}" for d in sorted(by_depth))
        return {}, 0, [(f"images at different folder depths under {str(scan.root)!r} ({examples}); all images must "
                        "sit at the same depth, one folder level per label level")]
    (depth, images), = by_depth.items()
    classes: dict[str, list[Path]] = {}
    for image in images:
        classes.setdefault(image.parent.relative_to(scan.root).as_posix(), []).append(image)
    return classes, depth, []


def top_folder_classes(scan: FolderScan) -> tuple[dict[str, list[Path]], list[str], list[str]]:
    """``({class: its images}, problems, notes)`` with torchvision ``ImageFolder``'s convention: a class is a folder
    directly in the root, and every image at any depth below it is that class's. Images directly in the root are a
    problem (no class); empty folders are notes (an empty class folder is left out), not problems."""
    classes: dict[str, list[Path]] = {}
    loose = []
    for image in scan.images:
        parts = image.relative_to(scan.root).parts
        if len(parts) == 1:
            loose.append(image)
        else:
            classes.setdefault(parts[0], []).append(image)
    problems = []
    if not scan.images:
        problems.append(f"no image ({_suffix_list()}) under {str(scan.root)!r}")
    elif loose:
        problems.append(f"{len(loose)} image(s) directly in {str(scan.root)!r}, in no class folder (put each in its "
                        f"class's folder), e.g. {loose[0].name!r}")
    empty = [f for f in scan.empty_folders if f.parent == scan.root]
    notes = [f"{len(empty)} empty class folder(s) left out, e.g. {empty[0].name!r}"] if empty else []
    nested = sum(1 for i in scan.images if scan.depth(i) > 1)
    if nested:
        notes.append(f"{nested} image(s) in sub-folders of a class folder, each counted in its class")
    return classes, problems, notes


def _levels(class_path: str, depth: int) -> tuple[str, ...]:
    """Raw labels of a class, finest first: ``a/b/c`` -> (``a/b/c``, ``a/b``, ``a``)."""
    parts = class_path.split("/")
    return tuple("/".join(parts[: depth - c]) for c in range(depth))


def _level_names(level_names: Sequence[str] | None, depth: int) -> tuple[str, ...]:
    if level_names is None:
        return ("class", *(f"level{c}" for c in range(1, depth)))
    names = tuple(str(n) for n in level_names)
    if len(names) != depth:
        raise ValueError(f"{NAME}: level_names has {len(names)} name(s) {list(names)} but the folder tree has "
                         f"{depth} level(s) (finest first)")
    return names


def _tree_notes(scans: Sequence[FolderScan]) -> tuple[list[str], list[str]]:
    """(problems, notes) every tree shares: empty folders are problems, non-image files notes."""
    problems = [f"empty folder {str(f)!r}: no image in it or below it" for s in scans for f in s.empty_folders]
    others = [str(f) for s in scans for f in s.other_files]
    notes = [f"{len(others)} non-image file(s) ignored, e.g. {others[0]!r}"] if others else []
    return problems, notes


# --------------------------------------------------------------------------- class splits
def read_class_list(path: str | os.PathLike[str]) -> list[tuple[int, str]]:
    """``(line number, class path)`` of a class-list file: one class (or coarser folder) path
    relative to the root per line; blank lines and ``#`` comments are skipped."""
    file = require_file(Path(path).expanduser(), "class list")
    return [(line, text.replace("\\", "/").strip("/")) for line, text in read_lines(file) if not text.startswith("#")]


def _listed_split(
    classes: Sequence[str], depth: int, root: Path, lists: dict[str, str]
) -> tuple[dict[str, str], list[str]]:
    """Split of each class named by the class lists ``{split: file}`` and the problems found."""
    under: dict[str, list[str]] = {}
    for cls in classes:
        for prefix in _levels(cls, depth):
            under.setdefault(prefix, []).append(cls)
    listed: dict[str, tuple[str, str]] = {}
    problems: list[str] = []
    for side, file in lists.items():
        for line, entry in read_class_list(file):
            if entry not in under:
                problems.append(f"{file}:{line}: no class folder {entry!r} under {str(root)!r}")
                continue
            for cls in under[entry]:
                first = listed.setdefault(cls, (side, f"{file}:{line}"))
                if first[0] != side:
                    problems.append(f"class {cls!r} is listed for {first[0]} ({first[1]}) and for {side} "
                                    f"({file}:{line})")
    assignment = {cls: side for cls, (side, _) in listed.items()}
    if len(lists) == 1:
        (side,) = lists
        other = "test" if side == "train" else "train"
        assignment.update({cls: other for cls in classes if cls not in assignment})
    return assignment, problems


def _drawn_split(classes: Sequence[str], depth: int, root: Path, fraction: float, level: int,
                 seed: int) -> dict[str, str]:
    """Split of each class: the level-``level`` groups held out by ``held_out_classes`` go to test."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"{NAME}: test_fraction must be in (0, 1), got {fraction}")
    if not -depth <= level < depth:
        raise ValueError(f"{NAME}: split_level must be in [{-depth}, {depth - 1}] for a tree of {depth} level(s), got "
                         f"{level}")
    group = {cls: _levels(cls, depth)[level] for cls in classes}
    if len(set(group.values())) < 2:
        raise ValueError(f"{NAME}: cannot split {str(root)!r} class-disjointly at level {level}: it has "
                         f"{len(set(group.values()))} folder(s) there (need at least 2; or use train/ and test/ "
                         "folders)")
    held = set(held_out_classes(np.array(sorted(set(group.values()))), fraction, seed=seed).tolist())
    return {cls: "test" if group[cls] in held else "train" for cls in classes}


# --------------------------------------------------------------------------- the dataset
def _split_folders(root: Path) -> tuple[str, ...]:
    """The split folders of ``root`` in order (``train``, ``test`` or ``query``/``gallery``,
    ``validation``); ``()`` when it has none, then its sub-folders are classes."""
    names = {p.name for p in root.iterdir() if p.is_dir()}
    if {"train", "query", "gallery"} <= names:
        found: tuple[str, ...] = ("train", "query", "gallery")
    elif {"train", "test"} <= names:
        found = ("train", "test")
    else:
        return ()
    return (*found, "validation") if "validation" in names else found


def image_folder_layout(root: Path, **_: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(splits, evaluation_splits)`` of the folder ``root`` (see the module docstring)."""
    folders = _split_folders(require_root(root, NAME))
    if not folders:
        return ("train", "test", "all"), ("test",)
    return (*folders, "all"), (("query", "gallery") if "query" in folders else ("test",))


def _from_split_folders(
    root: Path, folders: tuple[str, ...], class_disjoint: bool
) -> tuple[list[tuple[str, dict[str, list[Path]], int]], list[str], list[str]]:
    """``([(split, {class: images}, depth)], problems, notes)`` of the split folders of ``root``."""
    scans = {s: scan_folder(root / s) for s in folders}
    problems, notes = _tree_notes(list(scans.values()))
    trees = []
    for s, scan in scans.items():
        classes, depth, found = class_tree(scan)
        problems += found
        trees.append((s, classes, depth))
    depths = {s: d for s, _, d in trees if d}
    if len(set(depths.values())) > 1:
        problems.append(f"split folders of {str(root)!r} have different depths {depths}: every split needs the same "
                        "levels")
    if class_disjoint:
        train = trees[0][1]
        for s, classes, _ in trees[1:]:
            shared = sorted(set(train) & set(classes))
            if shared:
                problems.append(f"{len(shared)} class(es) in both train/ and {s}/ of {str(root)!r}, e.g. {shared[0]!r} "
                                "(open-set evaluation; pass class_disjoint=false for closed-set data)")
    return trees, problems, notes


def load_image_folder(
    root: Path,
    split: str,
    *,
    test_fraction: float | None = None,
    split_level: int = 0,
    split_seed: int = 0,
    train_classes: str | None = None,
    test_classes: str | None = None,
    level_names: Sequence[str] | None = None,
    class_disjoint: bool = True,
    keep_going: bool = False,
    class_folders: str = "levels",
) -> Items:
    """Items of ``split`` (``train``/``test``/``validation``/``query``/``gallery``/``all``) of the tree at ``root``.

    ``class_folders``: ``"levels"`` (default) reads every folder depth as a label level (all images at one depth);
    ``"top"`` reads torchvision ``ImageFolder``'s convention (:func:`top_folder_classes`: one level, the folder
    directly in the root, sub-folders included), for a tree without split folders.

    ``keep_going`` (``dataset-info``): when the tree still has class folders, its problems go to
    ``metadata["problems"]`` instead of being raised, so the counts and image checks can follow."""
    folders = _split_folders(root)
    extra: dict[str, dict[str, Any]] = {}
    if folders:
        if test_fraction is not None or train_classes or test_classes:
            raise ValueError(f"{NAME}: {str(root)!r} has split folders ({', '.join(folders)}); test_fraction, "
                             "train_classes and test_classes only apply to a tree of class folders")
        trees, problems, notes = _from_split_folders(root, folders, class_disjoint)
    else:
        scan = scan_folder(root)
        if class_folders == "top":
            classes, problems, notes = top_folder_classes(scan)
            depth = 1
            notes += _tree_notes([scan])[1]
        elif class_folders == "levels":
            problems, notes = _tree_notes([scan])
            classes, depth, found = class_tree(scan)
            problems += found
        else:
            raise ValueError(f"{NAME}: class_folders must be 'levels' or 'top', got {class_folders!r}")
        assignment = {cls: "all" for cls in classes}
        if split != "all" and classes:
            lists = {s: str(f) for s, f in (("train", train_classes), ("test", test_classes)) if f}
            if lists:
                assignment, found = _listed_split(sorted(classes), depth, root, lists)
                problems += found
                how = " ".join(f"{s}_classes={f}" for s, f in lists.items())
            else:
                fraction = 0.5 if test_fraction is None else float(test_fraction)
                assignment = _drawn_split(sorted(classes), depth, root, fraction, int(split_level), int(split_seed))
                how = f"test_fraction={fraction} split_level={split_level} split_seed={split_seed}"
            left_out = len(classes) - len(assignment)
            if left_out:
                notes.append(f"{left_out} class(es) in neither class list are left out")
            class_split = {s: sorted(c for c, side in assignment.items() if side == s) for s in ("train", "test")}
            extra = {s: {"class_split": {**class_split, "how": how, "left_out": left_out}} for s in ("train", "test")}
        trees = [(s, {c: imgs for c, imgs in classes.items() if assignment.get(c) == s}, depth)
                 for s in ("train", "test", "all")]
    if problems and not (keep_going and any(classes for _, classes, _ in trees)):
        raise DatasetProblems(NAME, problems, notes)
    depth = max(d for _, _, d in trees)
    rows = [
        (str(image), _levels(cls, depth), split if split == "all" else s, str(image.parent))
        for s, classes, _ in trees  # every split: finalize remaps query and gallery jointly
        for cls, images in sorted(classes.items()) for image in images
    ]
    for s in {s for _, _, s, _ in rows} | {split}:
        extra.setdefault(s, {}).update(notes=notes, problems=problems)
    return Items.from_rows(rows, _level_names(level_names, depth), extra=extra)


SPEC = register_dataset(
    DatasetSpec(
        name=NAME,
        description="your own images, one folder per class (nested folders = coarser levels); "
                    "train/test or train/query/gallery folders, else a class-disjoint split",
        level_names=("class",),  # the default for one level; nested folders add "level1", "level2", ...
        splits=("train", "test", "query", "gallery", "validation", "all"),
        evaluation_splits=("test",),
        native_files=("DIR/[<coarser>/...]<class>/<image>", "or DIR/{train,test}/... or DIR/{train,query,gallery}/..."),
        load=load_image_folder,
        layout=image_folder_layout,
    )
)


# --------------------------------------------------------------------------- images without a dataset
def image_files(paths: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The images named by ``paths``, in order: a file as given, a folder expanded to every image
    beneath it (sorted, hidden entries skipped). A missing path or a folder without images is an
    error naming it."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = scan_folder(path).images
            if not found:
                raise FileNotFoundError(f"no image ({_suffix_list()}) under folder {str(path)!r}")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise FileNotFoundError(f"image or folder {str(path)!r} does not exist")
    return files


def images_dataset(paths: Sequence[str | os.PathLike[str]], transform: Any = None) -> RetrievalDataset:
    """The unlabelled images of :func:`image_files` (label ``-1``) as a dataset."""
    files = [str(f) for f in image_files(paths)]
    return RetrievalDataset(files, np.full((len(files), 1), -1, dtype=np.int64), "images", ("class",), transform,
                            name="images", sources=files)


def folder_dataset(folder: str | os.PathLike[str], transform: Any = None, *,
                   exclude: Collection[str] = ()) -> RetrievalDataset:
    """Every image under ``folder`` (sorted) but those ``exclude`` names (paths as this function lists them),
    labelled by its class tree as ``image_folder``'s ``all`` split (every level); images directly in ``folder`` get
    ``-1``. When the sub-folders form no class tree (images at different depths), the label is the image's own
    folder (one level) and a warning says why."""
    root = require_root(folder, "images")
    scan = scan_folder(root)
    if exclude:
        left_out = set(exclude)
        scan = dataclasses.replace(scan, images=[i for i in scan.images if str(i) not in left_out])
    if not scan.images:
        raise FileNotFoundError(f"no image ({_suffix_list()}) under folder {str(root)!r}")
    classes, depth, problems = class_tree(scan, loose_ok=True)
    raw = {str(image): _levels(cls, depth) for cls, images in classes.items() for image in images}
    if problems and any(scan.depth(i) for i in scan.images):
        warnings.warn(f"images are labelled by their own folder only (one level): {problems[0]}", stacklevel=2)
        depth = 1
        raw = {str(i): (i.parent.relative_to(root).as_posix(),) for i in scan.images if scan.depth(i)}
    labels = np.full((len(scan.images), max(depth, 1)), -1, dtype=np.int64)
    paths = [str(image) for image in scan.images]
    labelled = [i for i, p in enumerate(paths) if p in raw]
    metadata = {}
    if labelled:
        raw_labels = np.array([raw[paths[i]] for i in labelled], dtype=object)
        labels[labelled] = remap_labels(raw_labels)
        metadata["label_names"] = label_names(raw_labels)
    return RetrievalDataset(paths, labels, "images", _level_names(None, max(depth, 1)), transform, name="images",
                            sources=paths, metadata=metadata)
