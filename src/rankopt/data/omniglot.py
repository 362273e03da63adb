"""Omniglot (Lake et al. 2015): alphabet -> character -> 20 drawings, read from the original zip
archives directly (``images_background.zip`` = train, ``images_evaluation.zip`` = test) or from
their extracted folders; nothing is extracted into the data folder.

Levels: ``character`` (``Alphabet/characterNN``) -> ``alphabet``. Train and test share no
alphabet (open-set). ``train_set="background_small1"`` / ``"background_small2"`` selects the
5-alphabet "minimal" training archives.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from rankopt.data.base import DatasetSpec, Items, label_file_error, register_dataset

LEVEL_NAMES = ("character", "alphabet")
TRAIN_SETS = ("background", "background_small1", "background_small2")


def _members(root: Path, folder: str) -> tuple[list[tuple[str, str]], str]:
    """(path, member relative to the archive root) of every PNG, from the folder or the zip."""
    extracted = root / folder
    if extracted.is_dir():
        files = sorted(extracted.rglob("*.png"))
        return [(str(f), f"{folder}/{f.relative_to(extracted).as_posix()}") for f in files], str(extracted)
    archive = root / f"{folder}.zip"
    if not archive.is_file():
        raise FileNotFoundError(f"omniglot: neither {str(extracted)!r} nor {str(archive)!r} exists")
    try:
        with zipfile.ZipFile(archive) as zf:
            names = sorted(n for n in zf.namelist() if n.lower().endswith(".png"))
    except zipfile.BadZipFile as err:
        raise ValueError(f"omniglot: {str(archive)!r} is not a valid zip archive ({err})") from err
    return [(f"{archive}/{n}", n) for n in names], str(archive)


def load_omniglot(root: Path, split: str, train_set: str = "background", alphabets: int | None = None) -> Items:
    """``alphabets``: keep only the first ``alphabets`` alphabets (sorted by name) of the split (quick runs)."""
    if train_set not in TRAIN_SETS:
        raise ValueError(f"omniglot train_set must be one of {TRAIN_SETS}, got {train_set!r}")
    if alphabets is not None and alphabets < 1:
        raise ValueError(f"omniglot alphabets must be >= 1, got {alphabets}")
    folder = f"images_{train_set}" if split == "train" else "images_evaluation"
    members, container = _members(root, folder)
    rows = []
    for i, (path, member) in enumerate(members, start=1):
        parts = member.split("/")
        if len(parts) != 4 or parts[0] != folder:
            raise label_file_error(container, i,
                                   f"unexpected entry {member!r} (want {folder}/<alphabet>/<character>/<file>.png)")
        _, alphabet, character, _ = parts
        rows.append((path, (f"{alphabet}/{character}", alphabet), split, f"{container}:{member}"))
    if alphabets is not None:
        kept = set(sorted({r[1][1] for r in rows})[:alphabets])
        rows = [r for r in rows if r[1][1] in kept]
    return Items.from_rows(rows, LEVEL_NAMES)


SPEC = register_dataset(
    DatasetSpec(
        name="omniglot",
        description="Omniglot handwritten characters (character -> alphabet); background = train, evaluation = test",
        level_names=LEVEL_NAMES,
        splits=("train", "test"),
        evaluation_splits=("test",),
        native_files=("images_background.zip (or images_background/)", "images_evaluation.zip (or images_evaluation/)"),
        load=load_omniglot,
        published={
            "train": {"images": 19280, "character": 964, "alphabet": 30},
            "test": {"images": 13180, "character": 659, "alphabet": 20},
        },
    )
)
