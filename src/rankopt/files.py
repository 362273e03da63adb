"""Files: atomic writes (a reader never sees a half-written file), safe reading of ``.npy`` arrays, and the check of
an output folder (never replace a person's data)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

NPY_MAGIC = b"\x93NUMPY"


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same folder and ``os.replace``;
    create the folder. The file gets the ordinary permissions of a new file (the umask's)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def open_npy_atomic(path: str | os.PathLike[str], shape: tuple[int, ...],
                    dtype: np.dtype | type = np.float32) -> Iterator[np.memmap]:
    """A writable ``.npy`` memory map of ``shape`` to fill in the ``with`` block; then flushed and moved to
    ``path`` (``os.replace``), so an interrupted writer never leaves a truncated file (the temporary file in
    the same folder is removed). The map stays usable after the block (it follows the renamed file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        array = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.dtype(dtype), shape=shape)
        yield array
        array.flush()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_npy(path: str | os.PathLike[str], what: str = "array", *, mmap: bool = False) -> np.ndarray:
    """A numeric array from a ``.npy`` file, never unpickling; clear errors for other files.

    A file that does not start with the ``.npy`` magic bytes is "not a NumPy array file" (a text
    or CSV file renamed ``.npy``, say); an object array (pickled Python objects) is refused.
    ``mmap``: the array is memory-mapped copy-on-write (``mmap_mode="c"``): pages are read on
    demand, so a file larger than memory can be scanned, and the file itself is never written.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file {str(path)!r} does not exist")
    with open(path, "rb") as fh:
        head = fh.read(len(NPY_MAGIC))
    if head != NPY_MAGIC:
        kind = "it is empty" if not head else f"it starts with {head!r}"
        raise ValueError(f"{what} file {str(path)!r} is not a NumPy array file (.npy): {kind}. "
                         "Write arrays with numpy.save (a text file: numpy.loadtxt, then numpy.save)")
    try:
        with open(path, "rb") as fh:
            major, _ = np.lib.format.read_magic(fh)
            read_header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
            _, _, dtype = read_header(fh)  # the header only, not the data
    except ValueError as err:
        raise ValueError(f"{what} file {str(path)!r} is a damaged .npy file: {err}") from None
    if dtype.hasobject:
        raise ValueError(f"{what} file {str(path)!r} holds Python objects (dtype=object), not numbers; "
                         "rankopt reads numeric arrays only and never unpickles")
    try:
        return np.load(path, allow_pickle=False, mmap_mode="c" if mmap else None)
    except ValueError as err:
        raise ValueError(f"{what} file {str(path)!r} is a damaged .npy file: {err}") from None


def replaceable_folder(path: str | os.PathLike[str], *, ours: Callable[[Path], bool], what: str, refusal: str,
                       error: type[Exception] = ValueError) -> bool:
    """Whether ``path``, where a command writes its output folder, holds an earlier output of that command
    (``ours(path)``: it may be replaced); ``False`` when it is absent or an empty folder. A file, or a non-empty
    folder of anything else (a person's data: never replaced), is an ``error`` naming it: ``"{what} 'PATH' is a
    file"``, or ``refusal`` (one sentence: what the folder is not, and what to do)."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise error(f"{what} {str(folder)!r} is a file; choose a new --out")
    if not folder.exists() or not any(folder.iterdir()):
        return False
    if ours(folder):
        return True
    raise error(refusal)
