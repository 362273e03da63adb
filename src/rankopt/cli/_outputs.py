"""A sub-command's output paths checked before any work."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def check_output(path: str | None, what: str, *, folder: bool = False, inputs: Sequence[str | None] = ()) -> None:
    """Refuse an output ``path`` (named ``what``, e.g. ``--json``) that could not be written, before any work: a
    file that is an existing folder (or, with ``folder``, a folder that is an existing file), one of the
    ``inputs`` (the checkpoint, ...), or a place whose nearest existing folder is not writable. ``None``: no
    output."""
    if path is None:
        return
    target = Path(path).expanduser().resolve()
    if not folder and target.is_dir():
        raise ValueError(f"{what} {path}: is a folder; give a file name")
    if folder and target.exists() and not target.is_dir():
        raise ValueError(f"{what} {path}: is a file; give a folder")
    for given in inputs:
        if given is not None and Path(given).expanduser().resolve() == target:
            raise ValueError(f"{what} {path}: would overwrite an input of this command")
    parent = target if folder else target.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{what} {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{what} {path}: folder {parent} is not writable")
