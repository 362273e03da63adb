"""An index folder on disk: every change atomic and durable, validated when read. Nothing is ever unpickled.

=============================  =======================================================================
file                           content
=============================  =======================================================================
``index.json``                 format and version, rankopt version, fingerprint, preprocessing, similarity,
                               dim, count, checkpoint path (relative to the index folder, POSIX, when the file
                               lies in it or in the folder holding it, a fit's run folder: see
                               :func:`stored_checkpoint`), model summary, faiss spec/parameters/recall,
                               created, threshold, next id; ``uid`` (random, written when the folder is created,
                               kept by every change: a folder rebuilt at the same path has a new one), ``version``
                               (1, 2, ... one more at each change), ``changed_utc`` and ``data``: the name of the
                               data folder below
``vNNNNNN/items.json``         ``ids``, ``paths`` (or null), ``level_names``, ``label_names`` (per level, by label
                               id, or null), ``metadata`` (columns), ``stamps``, ``crops`` (:mod:`.items`)
``vNNNNNN/embeddings.safetensors``  ``embeddings`` float32 ``(count, dim)``, ``labels`` int64 ``(count, L)``; with DBA
                                    also ``unaugmented`` float32 ``(count, dim)``, the vectors before augmentation
``vNNNNNN/faiss.index``        the faiss index (``faiss.write_index``), only when one was built
``vNNNNNN/whitening.safetensors``  the learned whitening of the embeddings (``rankopt.postprocess``), only when used
``.lock``                      taken (``flock``) by a writer for the whole change
=============================  =======================================================================

A change writes a new data folder ``vNNNNNN`` (files flushed to disk), then replaces ``index.json``
(a temporary file renamed over it: atomic) to point at it; the data folder of the previous version is
kept for readers still loading it, older ones are deleted. So a reader (a running ``rankopt serve``)
sees the old or the new index, never a mix, and a process killed at any moment leaves the last complete
version in place (its unfinished folder is removed by the next change). A new folder is built as a
hidden temporary sibling and renamed into place. **To notice a change, poll** :func:`identity`
(``index.json``'s ``uid`` and ``version``): the version grows at every change, and a folder deleted and built
again at the same path starts again at version 1 with a new ``uid``.
Folders of format 1 (the files beside ``index.json``) are read, and upgraded by the next change.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from rankopt import __version__, layout
from rankopt.files import replaceable_folder
from rankopt.layout import INDEX_JSON
from rankopt.postprocess import WHITENING_KEY, Whitening, load_whitening, save_whitening
from rankopt.search import approximate
from rankopt.search.label_names import default_level_names
from rankopt.search.record import IndexInfo

FORMAT = "rankopt-index"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
ITEMS_JSON = "items.json"
EMBEDDINGS = "embeddings.safetensors"
FAISS_INDEX = "faiss.index"
WHITENING = "whitening.safetensors"
LOCK = ".lock"
DATA_FILES = (ITEMS_JSON, EMBEDDINGS, FAISS_INDEX, WHITENING)
DATA_NAME = re.compile(r"^v(\d{6,})$")
READ_ATTEMPTS = 5
"""A reader whose version's files vanished or failed while the version changed (two changes during one load)
reads the new version, up to this many times."""


@dataclass
class StoredIndex:
    """The content of an index folder: ``index.json``'s description (typed) and ``items.json`` (``items``, its
    level names filled in when read)."""

    embeddings: torch.Tensor
    labels: torch.Tensor
    fingerprint: str
    similarity: str
    preprocessing: dict[str, Any]
    info: IndexInfo
    items: dict[str, Any]
    next_id: int | None = None
    faiss_index: Any = None
    whitening: Whitening | None = None
    data: str = ""
    """The data folder it was read from (``""``: a format-1 folder, its files beside ``index.json``)."""
    unaugmented: torch.Tensor | None = None
    """With DBA: the vectors before augmentation (``None``: not kept)."""

    def description(self) -> dict[str, Any]:
        """``index.json`` but for the entries of the version written (uid, version, data, changed)."""
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "rankopt_version": __version__,
                "fingerprint": self.fingerprint, "preprocessing": self.preprocessing, "similarity": self.similarity,
                "dim": int(self.embeddings.shape[1]), "count": int(self.embeddings.shape[0]), **self.info.to_json(),
                "next_id": self.next_id, "metadata_columns": sorted(self.items.get("metadata") or {})}


# ---------------------------------------------------------------------- writing
def write(directory: str | os.PathLike[str], stored: StoredIndex) -> Path:
    """Write ``stored`` as the new version of the index folder ``directory`` (see the module docstring).

    A ``directory`` that exists but is neither empty nor an index folder is refused (never overwrite user data).
    """
    target = check_target(directory)
    if not (target / INDEX_JSON).exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
        try:
            _write_version(tmp, stored, 1, uuid.uuid4().hex, target)
            os.replace(tmp, target)  # a missing or empty folder: replaced at once
            _fsync(target.parent)
            return target
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            if not (target / INDEX_JSON).exists():
                raise  # else another process created it meanwhile: write a new version of it
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    with locked(target):
        check_target(target)
        info = _read_json(target / INDEX_JSON)
        _collect(target, info)
        version = _version_of(info) + 1
        try:
            _write_version(target, stored, version, info.get("uid") or uuid.uuid4().hex, target)
        finally:
            _collect(target, _read_json(target / INDEX_JSON))
    return target


def _write_version(folder: Path, stored: StoredIndex, version: int, uid: str, home: Path) -> None:
    """The data folder of ``version`` in ``folder`` (flushed), then ``folder/index.json`` pointing at it; ``home``:
    where the index folder will be (its checkpoint path is written relative to it)."""
    from safetensors.torch import save_file

    name = f"v{version:06d}"
    data = folder / name
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=folder))
    try:
        tensors = {"embeddings": stored.embeddings, "labels": stored.labels.long()}
        if stored.unaugmented is not None:
            tensors["unaugmented"] = stored.unaugmented
        save_file({name: t.detach().cpu().contiguous() if name == "labels" else t.detach().float().cpu().contiguous()
                   for name, t in tensors.items()}, str(tmp / EMBEDDINGS))
        (tmp / ITEMS_JSON).write_text(json.dumps(stored.items), encoding="utf-8")
        if stored.faiss_index is not None:
            approximate.write(stored.faiss_index, tmp / FAISS_INDEX)
        if stored.whitening is not None:
            save_whitening(stored.whitening, tmp / WHITENING)
        for file in tmp.iterdir():
            _fsync(file)
        _fsync(tmp)
        os.replace(tmp, data)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    info = {**stored.description(), **stored_checkpoint(stored.info.checkpoint, home), "uid": uid,
            "version": version, "data": name, "changed_utc": f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S.%f UTC}"}
    _write_json_durably(folder / INDEX_JSON, info)


def _write_json_durably(path: Path, value: Mapping[str, Any]) -> None:
    """``path`` replaced atomically by ``value`` as JSON, flushed to disk with its folder."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(value, indent=2))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync(path.parent)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _collect(folder: Path, info: Mapping[str, Any]) -> None:
    """Delete what the current version does not need: data folders other than the current one and the one
    before it (readers may still load it), unfinished temporary files, the files of a format-1 folder."""
    current = info.get("data")
    versions = sorted(int(m.group(1)) for e in folder.iterdir() if (m := DATA_NAME.match(e.name)) and e.name != current)
    number = _version_of(info)
    previous = max((v for v in versions if v < number), default=None)
    for entry in folder.iterdir():
        match = DATA_NAME.match(entry.name)
        stale = (match and entry.name != current and int(match.group(1)) != previous) or entry.name.endswith(".tmp")
        legacy = current is not None and entry.name in DATA_FILES
        if (stale or legacy) and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        elif stale or legacy:
            entry.unlink(missing_ok=True)


_held = threading.local()


@contextlib.contextmanager
def locked(directory: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the writers' lock of the index folder ``directory`` (``flock`` on ``.lock``; re-entrant within a
    thread). Readers never wait for it. Without ``fcntl`` (Windows) there is no lock."""
    key = str(Path(directory).resolve())
    held = _held.__dict__.setdefault("folders", {})
    if key in held:
        held[key] += 1
        try:
            yield
        finally:
            held[key] -= 1
        return
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        fcntl = None
    with open(Path(directory) / LOCK, "a+") as fh:
        if fcntl is not None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        held[key] = 1
        try:
            yield
        finally:
            del held[key]
            if fcntl is not None:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def index_folder(path: str | os.PathLike[str]) -> Path:
    """``path``, or ``path/index`` when ``path`` is a ``rankopt fit`` run folder (its index inside, no
    ``index.json`` of its own): a run folder is accepted wherever an index folder is. A fit that did not finish
    (:func:`rankopt.layout.refusal`: its run folder, or the index folder inside one) is a ``ValueError``."""
    folder = Path(path)
    inner = folder / layout.INDEX_DIR
    own = (folder / INDEX_JSON).exists()
    run = folder.parent if own and folder.name == layout.INDEX_DIR else folder
    why = layout.refusal(run, indexed=own or (inner / INDEX_JSON).exists())
    if why is not None:
        raise ValueError(why)
    return inner if not own and (inner / INDEX_JSON).exists() else folder


def stored_checkpoint(checkpoint: str | None, home: str | os.PathLike[str]) -> dict[str, str | None]:
    """``index.json``'s checkpoint entries for an index folder at ``home``: a file in ``home`` or in the folder
    holding it (a fit's run folder) as a POSIX path relative to ``home``, with its absolute path as written
    (``checkpoint_absolute``: for a copy of the index folder alone); another file by its absolute path."""
    if not checkpoint:
        return {"checkpoint": checkpoint}
    path, home = Path(checkpoint).resolve(), Path(home).resolve()
    if not path.is_relative_to(home.parent):
        return {"checkpoint": str(path)}
    return {"checkpoint": Path(os.path.relpath(path, home)).as_posix(), "checkpoint_absolute": str(path)}


def found_checkpoint(info: Mapping[str, Any], folder: str | os.PathLike[str]) -> str | None:
    """The absolute path of the checkpoint ``index.json`` (``info``) of ``folder`` names, as things lie now: a
    relative path against ``folder`` where it is now, else the absolute path written, else (a run moved before
    paths were relative) a file of its name beside ``folder`` or in it; the first of these when none exists."""
    if not info.get("checkpoint"):
        return info.get("checkpoint")
    path, here = Path(info["checkpoint"]), Path(folder).resolve()
    candidates = [here / path, *([Path(info["checkpoint_absolute"])] if info.get("checkpoint_absolute") else []),
                  here.parent / path.name, here / path.name]
    return str(next((c for c in candidates if c.is_file()), candidates[0]).resolve())


def check_target(directory: str | os.PathLike[str]) -> Path:
    """``directory`` as a place an index may be written: absent, empty, or an index folder (replaced);
    a file or a non-empty folder of other things (a user's data) is refused."""
    target = Path(directory)
    replaceable_folder(target, ours=lambda f: (f / INDEX_JSON).is_file(), what="index folder",
                       refusal=f"{str(target)!r} is a non-empty folder without {INDEX_JSON}, not a rankopt index: "
                               "refusing to replace it; choose another --out")
    return target


# ---------------------------------------------------------------------- reading
def version(directory: str | os.PathLike[str]) -> int:
    """The version of the index in ``directory`` (``index.json``'s ``version``, 0 for a format-1 folder):
    cheap to poll, it grows at every change."""
    return _version_of(_read_json(Path(directory) / INDEX_JSON))


def identity(directory: str | os.PathLike[str]) -> tuple[str | None, int]:
    """``(uid, version)`` of the index in ``directory``: it differs after any change or rebuild (``uid`` is None for a
    folder written before uids)."""
    info = _read_json(Path(directory) / INDEX_JSON)
    return info.get("uid"), _version_of(info)


def _version_of(info: Mapping[str, Any]) -> int:
    return int(info.get("version") or 0)


def read(directory: str | os.PathLike[str]) -> StoredIndex:
    """Read and validate an index folder: every error names the file at fault."""
    folder = Path(directory)
    if not folder.is_dir():
        raise FileNotFoundError(f"index folder {str(folder)!r} does not exist")
    for attempt in range(READ_ATTEMPTS):
        info = _read_info(folder)
        try:
            return _read_version(folder, info)
        except (FileNotFoundError, ValueError):
            if attempt + 1 == READ_ATTEMPTS or _version_of(_read_info(folder)) == _version_of(info):
                raise  # not a change during the load: the folder is damaged
    raise AssertionError("unreachable")  # pragma: no cover


def _read_info(folder: Path) -> dict[str, Any]:
    info = _read_json(folder / INDEX_JSON)
    if info.get("format") != FORMAT:
        raise ValueError(f"{folder / INDEX_JSON} is not a rankopt index description (format {info.get('format')!r})")
    if info.get("format_version") not in READABLE_VERSIONS:
        raise ValueError(f"{folder / INDEX_JSON}: unknown format version {info.get('format_version')!r} "
                         f"(this rankopt reads versions {', '.join(map(str, READABLE_VERSIONS))})")
    for key in ("fingerprint", "similarity", "dim", "count", *(("data",) if info["format_version"] > 1 else ())):
        if key not in info:
            raise ValueError(f"{folder / INDEX_JSON} has no {key!r} entry")
    if info["format_version"] > 1 and not DATA_NAME.match(str(info["data"])):
        raise ValueError(f"{folder / INDEX_JSON}: 'data' is {info['data']!r}, not a data folder name (v000001)")
    return info


def _read_version(folder: Path, info: dict[str, Any]) -> StoredIndex:
    data = folder / info["data"] if info["format_version"] > 1 else folder
    count, dim = info["count"], info["dim"]
    items = _read_json(data / ITEMS_JSON)
    paths = items.get("paths")
    if paths is not None and len(paths) != count:
        raise ValueError(f"{data / ITEMS_JSON} lists {len(paths)} paths but {INDEX_JSON} says count={count}")
    tensors = _read_tensors(data / EMBEDDINGS)
    embeddings, labels, unaugmented = tensors["embeddings"], tensors["labels"], tensors.get("unaugmented")
    for name, vectors in (("embeddings", embeddings), ("unaugmented", unaugmented)):
        if vectors is None:
            continue
        if tuple(vectors.shape) != (count, dim) or vectors.dtype != torch.float32:
            raise ValueError(f"{data / EMBEDDINGS}: {name} are {vectors.dtype} {tuple(vectors.shape)}, "
                             f"expected float32 ({count}, {dim}) as {INDEX_JSON} says")
        if not bool(torch.isfinite(vectors).all()):
            raise ValueError(f"{data / EMBEDDINGS}: {name} hold NaN or Inf values")
    if labels.ndim != 2 or labels.shape[0] != count or labels.dtype != torch.int64:
        raise ValueError(f"{data / EMBEDDINGS}: labels are {labels.dtype} {tuple(labels.shape)}, "
                         f"expected int64 ({count}, L)")
    if unaugmented is not None and not info.get("dba"):
        raise ValueError(f"{data / EMBEDDINGS} holds vectors before augmentation but {INDEX_JSON} names no DBA")
    _check_names(data / ITEMS_JSON, items, labels)
    faiss_index = None
    if info.get("faiss"):
        path = data / FAISS_INDEX
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing ({INDEX_JSON} says the index uses faiss "
                                    f"{info['faiss']['spec']!r})")
        faiss_index = approximate.read(path)
        if faiss_index.ntotal != count or faiss_index.d != dim:
            raise ValueError(f"{path} holds {faiss_index.ntotal} vectors of dimension {faiss_index.d}, "
                             f"but {INDEX_JSON} says {count} of dimension {dim}")
        approximate.set_params(faiss_index, info["faiss"].get("params"))
    record = IndexInfo.from_json({**info, "checkpoint": found_checkpoint(info, folder)})
    return StoredIndex(embeddings, labels, info["fingerprint"], info["similarity"], info.get("preprocessing") or {},
                       record, items, info.get("next_id"), faiss_index, _read_whitening(data, info),
                       str(info.get("data", "")), unaugmented)


def _check_names(path: Path, items: dict[str, Any], labels: torch.Tensor) -> None:
    """``items.json``'s level names (filled in when absent) and label names checked against the labels."""
    levels = labels.shape[1]
    level_names = items["level_names"] = items.get("level_names") or list(default_level_names(levels))
    label_names = items.get("label_names")
    if len(level_names) != levels or (label_names is not None and len(label_names) != len(level_names)):
        raise ValueError(f"{path}: {len(level_names)} level names for labels with {levels} levels")
    if label_names is not None and len(labels):
        for level, (names, largest) in enumerate(zip(label_names, labels.max(dim=0).values.tolist())):
            if largest >= len(names):
                raise ValueError(f"{path}: {len(names)} label names at level {level} but {EMBEDDINGS} uses label "
                                 f"{largest}")


def _read_whitening(folder: Path, info: Mapping[str, Any]) -> Whitening | None:
    """The index's whitening when its preprocessing has one, its digest checked against ``index.json``."""
    spec = (info.get("preprocessing") or {}).get(WHITENING_KEY)
    if not spec:
        return None
    path = folder / WHITENING
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing ({INDEX_JSON} says the embeddings are whitened)")
    whitening = load_whitening(path)
    if whitening.digest() != spec.get("digest"):
        raise ValueError(f"{path} is not the whitening {INDEX_JSON} names (digest {whitening.digest()}, "
                         f"expected {spec.get('digest')})")
    return whitening


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: not a complete rankopt index folder")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(value, Mapping):
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, expected an "  # noqa: TRY004 - bad file content
                         "object")
    return dict(value)


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: not a complete rankopt index folder")
    try:
        tensors = load_file(str(path))
    except Exception as err:  # noqa: BLE001 - safetensors raises its own error types for damaged files
        raise ValueError(f"cannot read {path}: {err}") from None
    missing = {"embeddings", "labels"} - set(tensors)
    if missing:
        raise ValueError(f"{path} has no {', '.join(sorted(missing))} tensor")
    return tensors
