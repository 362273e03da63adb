"""An index folder on disk, written atomically and validated when read. Nothing is ever unpickled.

=========================  ===========================================================================
file                       content
=========================  ===========================================================================
``index.json``             format and version, rankopt version, fingerprint, preprocessing, similarity,
                           dim, count, checkpoint path, model summary, faiss spec/parameters/recall, created
``items.json``             ``paths`` (or null), ``level_names``, ``label_names`` (per level, by label id, or null)
``embeddings.safetensors`` ``embeddings`` float32 ``(count, dim)``, ``labels`` int64 ``(count, L)``
``faiss.index``            the faiss index (``faiss.write_index``), only when one was built
``whitening.safetensors``  the learned whitening of the embeddings (``rankopt.postprocess``), only when used
=========================  ===========================================================================

The folder is built as a hidden temporary sibling and then swapped in, so an interrupted save
leaves the previous index intact.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rankopt.files import write_text_atomic
from rankopt.postprocess import WHITENING_KEY, Whitening, load_whitening, save_whitening
from rankopt.search import approximate

FORMAT = "rankopt-index"
FORMAT_VERSION = 1
INDEX_JSON = "index.json"
ITEMS_JSON = "items.json"
EMBEDDINGS = "embeddings.safetensors"
FAISS_INDEX = "faiss.index"
WHITENING = "whitening.safetensors"


@dataclass
class StoredIndex:
    """The content of an index folder: ``info`` is ``index.json``, ``items`` is ``items.json``."""

    embeddings: torch.Tensor
    labels: torch.Tensor
    info: dict[str, Any]
    items: dict[str, Any]
    faiss_index: Any = None
    whitening: Whitening | None = None


def write(directory: str | os.PathLike[str], stored: StoredIndex) -> Path:
    """Write ``stored`` as the index folder ``directory``, replacing a previous index there (atomically).

    A ``directory`` that exists but is neither empty nor an index folder is refused (never overwrite user data).
    """
    from safetensors.torch import save_file

    target = check_target(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        save_file({"embeddings": stored.embeddings.detach().float().cpu().contiguous(),
                   "labels": stored.labels.detach().long().cpu().contiguous()}, str(tmp / EMBEDDINGS))
        write_text_atomic(tmp / ITEMS_JSON, json.dumps(stored.items))
        if stored.faiss_index is not None:
            approximate.write(stored.faiss_index, tmp / FAISS_INDEX)
        if stored.whitening is not None:
            save_whitening(stored.whitening, tmp / WHITENING)
        write_text_atomic(tmp / INDEX_JSON, json.dumps(stored.info, indent=2))
        _swap_in(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def check_target(directory: str | os.PathLike[str]) -> Path:
    """``directory`` as a place an index may be written: absent, empty, or an index folder (replaced);
    a file or a non-empty folder of other things (a user's data) is refused."""
    target = Path(directory)
    if target.exists() and not target.is_dir():
        raise ValueError(f"index folder {str(target)!r} is a file")
    if target.is_dir() and any(target.iterdir()) and not (target / INDEX_JSON).is_file():
        raise ValueError(f"{str(target)!r} is a non-empty folder without {INDEX_JSON}, not a rankopt index: "
                         "refusing to replace it; choose another --out")
    return target


def _swap_in(tmp: Path, target: Path) -> None:
    """Rename ``tmp`` to ``target``; a previous ``target`` is moved aside first and deleted after."""
    if not target.exists():
        os.replace(tmp, target)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
    os.replace(target, old / target.name)
    try:
        os.replace(tmp, target)
    except BaseException:
        os.replace(old / target.name, target)
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)


def read(directory: str | os.PathLike[str]) -> StoredIndex:
    """Read and validate an index folder: every error names the file at fault."""
    folder = Path(directory)
    if not folder.is_dir():
        raise FileNotFoundError(f"index folder {str(folder)!r} does not exist")
    info = _read_json(folder / INDEX_JSON)
    if info.get("format") != FORMAT:
        raise ValueError(f"{folder / INDEX_JSON} is not a rankopt index description (format {info.get('format')!r})")
    if info.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{folder / INDEX_JSON}: unknown format version {info.get('format_version')!r} "
                         f"(this rankopt reads version {FORMAT_VERSION})")
    for key in ("fingerprint", "similarity", "dim", "count"):
        if key not in info:
            raise ValueError(f"{folder / INDEX_JSON} has no {key!r} entry")
    count, dim = info["count"], info["dim"]
    items = _read_json(folder / ITEMS_JSON)
    paths = items.get("paths")
    if paths is not None and len(paths) != count:
        raise ValueError(f"{folder / ITEMS_JSON} lists {len(paths)} paths but {INDEX_JSON} says count={count}")
    embeddings, labels = _read_tensors(folder / EMBEDDINGS)
    if tuple(embeddings.shape) != (count, dim) or embeddings.dtype != torch.float32:
        raise ValueError(f"{folder / EMBEDDINGS}: embeddings are {embeddings.dtype} {tuple(embeddings.shape)}, "
                         f"expected float32 ({count}, {dim}) as {INDEX_JSON} says")
    if labels.ndim != 2 or labels.shape[0] != count or labels.dtype != torch.int64:
        raise ValueError(f"{folder / EMBEDDINGS}: labels are {labels.dtype} {tuple(labels.shape)}, "
                         f"expected int64 ({count}, L)")
    if not bool(torch.isfinite(embeddings).all()):
        raise ValueError(f"{folder / EMBEDDINGS}: embeddings hold NaN or Inf values")
    faiss_index = None
    if info.get("faiss"):
        path = folder / FAISS_INDEX
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing ({INDEX_JSON} says the index uses faiss {info['faiss']['spec']!r})")
        faiss_index = approximate.read(path)
        if faiss_index.ntotal != count or faiss_index.d != dim:
            raise ValueError(f"{path} holds {faiss_index.ntotal} vectors of dimension {faiss_index.d}, "
                             f"but {INDEX_JSON} says {count} of dimension {dim}")
        approximate.set_params(faiss_index, info["faiss"].get("params"))
    return StoredIndex(embeddings, labels, info, items, faiss_index, _read_whitening(folder, info))


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
        raise ValueError(f"{path} holds a JSON {type(value).__name__}, expected an object")  # noqa: TRY004 - bad file content
    return dict(value)


def _read_tensors(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
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
    return tensors["embeddings"], tensors["labels"]
