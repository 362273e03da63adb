"""An index's embeddings and metadata as Parquet, and back (pyarrow, optional: ``pip install 'rankopt[parquet]'``).

* One table (:func:`export_parquet`): columns ``id`` (string), ``path`` (string, null without paths),
  ``label``, ``label_1``, ... (finest first: class names, or ids without names; null: unknown),
  ``embedding`` (``fixed_size_list<float32>[dim]``), then the metadata columns.
* clip-retrieval's layout (:func:`export_clip_layout`): ``OUT/img_emb/img_emb_{i}.npy`` (float32 ``(n, dim)``)
  and row-aligned ``OUT/metadata/metadata_{i}.parquet`` (``image_path``, ``id``, labels, metadata), shards of
  :data:`SHARD_ROWS` rows, as clip-retrieval writes them and autofaiss reads them
  (``autofaiss build_index --embeddings=OUT/img_emb``).

The schema metadata (key ``rankopt``) holds JSON: fingerprint, similarity, preprocessing, level and label
names, threshold, next id, checkpoint, model, DBA; key ``rankopt.whitening`` the whitening (safetensors
bytes) when the embedding pipeline has one. :func:`import_index` reads either form back as an
:class:`~rankopt.search.index.Index` (exact search, or ``faiss=``); files without the ``rankopt`` key
(someone else's clip-retrieval output) need ``fingerprint=``. File stamps and crops are not exported: an
imported index's ``update`` leaves its items alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from rankopt.files import read_npy
from rankopt.postprocess import Whitening, load_whitening, save_whitening
from rankopt.search.embedder import stored_post
from rankopt.search.extras import import_pyarrow
from rankopt.search.index import Index
from rankopt.search.metadata import RESERVED, Columns, text

SHARD_ROWS = 1_000_000
META_KEY = b"rankopt"
WHITENING_KEY = b"rankopt.whitening"
EMBEDDING = "embedding"
CLIP_PATH = "image_path"


def _label_column(level: int) -> str:
    return "label" if level == 0 else f"label_{level}"


def _description(index: Index) -> dict[str, Any]:
    return {"fingerprint": index.fingerprint, "similarity": index.similarity, "preprocessing": index.preprocessing,
            "dim": index.dim, "count": len(index), "level_names": list(index.level_names),
            "label_names": index.label_names, "threshold": index.threshold, "next_id": index.items.next_id,
            "metadata_columns": list(index.metadata),
            "checkpoint": index.record.checkpoint, "model": index.record.model, "dba": index.record.dba,
            "qe": index.record.qe, "created_utc": index.record.created_utc}


def _schema_metadata(index: Index) -> dict[bytes, bytes]:
    out = {META_KEY: json.dumps(_description(index)).encode()}
    if index.post is not None and index.post.whitening is not None:
        with tempfile.TemporaryDirectory() as tmp:
            out[WHITENING_KEY] = save_whitening(index.post.whitening, Path(tmp) / "w.safetensors").read_bytes()
    return out


def _columns(index: Index, rows: slice, path_name: str) -> dict[str, Any]:
    """The non-embedding columns of ``rows`` as pyarrow arrays (a metadata column of mixed types as text)."""
    pa = import_pyarrow()
    ids = index.ids[rows]
    out = {"id": pa.array(ids, pa.string()),
           path_name: pa.array(index.paths[rows] if index.paths is not None else [None] * len(ids), pa.string())}
    labels = index.labels[rows].numpy()
    for level in range(labels.shape[1]):
        values = labels[:, level]
        if index.label_names is not None:
            names = index.label_names[level]
            out[_label_column(level)] = pa.array([names[v] if v >= 0 else None for v in values.tolist()], pa.string())
        else:
            out[_label_column(level)] = pa.array(values, mask=values < 0, type=pa.int64())
    for name, values in index.metadata.items():
        try:
            out[name] = pa.array(values[rows])
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            out[name] = pa.array([None if v is None else text(v) for v in values[rows]], pa.string())
    return out


def export_parquet(index: Index, file: str | os.PathLike[str]) -> Path:
    """Write ``index`` as one Parquet table (see the module docstring), atomically."""
    pa = import_pyarrow()
    columns = _columns(index, slice(None), "path")
    flat = pa.array(index.embeddings.numpy().reshape(-1), pa.float32())
    columns[EMBEDDING] = pa.FixedSizeListArray.from_arrays(flat, index.dim)
    table = pa.table(columns).replace_schema_metadata(_schema_metadata(index))
    out = Path(file)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        pa.parquet.write_table(table, tmp)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def export_clip_layout(index: Index, folder: str | os.PathLike[str], shard_rows: int = SHARD_ROWS) -> Path:
    """Write ``index`` in clip-retrieval's layout (see the module docstring) into ``folder`` (absent or empty),
    built as a temporary sibling and renamed into place."""
    pa = import_pyarrow()
    out = Path(folder)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{str(out)!r} exists and is not an empty folder: choose another output folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        (tmp / "img_emb").mkdir()
        (tmp / "metadata").mkdir()
        schema_metadata = _schema_metadata(index)
        for shard, start in enumerate(range(0, max(len(index), 1), shard_rows)):
            rows = slice(start, start + shard_rows)
            np.save(tmp / "img_emb" / f"img_emb_{shard}.npy", index.embeddings[rows].numpy().astype(np.float32))
            table = pa.table(_columns(index, rows, CLIP_PATH)).replace_schema_metadata(schema_metadata)
            pa.parquet.write_table(table, tmp / "metadata" / f"metadata_{shard}.parquet")
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _shards(folder: Path, sub: str, suffix: str) -> list[Path]:
    found = sorted(((int(m.group(1)), p) for p in (folder / sub).glob(f"*{suffix}")
                    if (m := re.search(r"_(\d+)" + re.escape(suffix) + "$", p.name))))
    if not found:
        raise FileNotFoundError(f"no {sub}/*_N{suffix} file under {str(folder)!r}: not clip-retrieval's layout")
    return [p for _, p in found]


def _read(source: Path) -> tuple[np.ndarray, Any, str]:
    """``(embeddings (N, D) float32, table without embeddings, path column name)`` of either form."""
    pa = import_pyarrow()
    if source.is_dir():
        npys, parts = _shards(source, "img_emb", ".npy"), _shards(source, "metadata", ".parquet")
        if len(npys) != len(parts):
            raise ValueError(f"{source}: {len(npys)} img_emb shard(s) but {len(parts)} metadata shard(s)")
        tables = [pa.parquet.read_table(p) for p in parts]
        arrays = [read_npy(p, "embeddings").astype(np.float32, copy=False) for p in npys]
        for npy, part, array, table in zip(npys, parts, arrays, tables):
            if array.ndim != 2 or array.shape[0] != table.num_rows:
                raise ValueError(f"{npy} holds {array.shape} embeddings but {part} has {table.num_rows} rows")
        table = pa.concat_tables(tables).replace_schema_metadata(tables[0].schema.metadata)
        return np.concatenate(arrays), table, CLIP_PATH
    if not source.is_file():
        raise FileNotFoundError(f"Parquet file or clip-retrieval folder {str(source)!r} does not exist")
    table = pa.parquet.read_table(source)
    if EMBEDDING not in table.column_names:
        raise ValueError(f"{source} has no {EMBEDDING!r} column (columns: {', '.join(table.column_names)})")
    column = table.column(EMBEDDING).combine_chunks()
    dim = column.type.list_size if hasattr(column.type, "list_size") else None
    if dim is None or column.null_count:
        raise ValueError(f"{source}: column {EMBEDDING!r} must be fixed-size lists of floats without nulls")
    embeddings = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(-1, dim)
    return embeddings, table.drop_columns([EMBEDDING]), "path"


def import_index(source: str | os.PathLike[str], *, fingerprint: str | None = None, faiss: str | None = None,
                 faiss_params: str | None = None, progress: bool = True) -> Index:
    """The :class:`Index` of a Parquet file or clip-retrieval folder written by :func:`export_parquet` /
    :func:`export_clip_layout` (or by clip-retrieval itself, with ``fingerprint=``)."""
    source = Path(source)
    embeddings, table, path_name = _read(source)
    meta = table.schema.metadata or {}
    described = json.loads(meta[META_KEY]) if META_KEY in meta else {}
    if fingerprint is not None and described and fingerprint != described["fingerprint"]:
        raise ValueError(f"{source} holds embeddings of fingerprint {described['fingerprint']}, not {fingerprint}")
    if not described and fingerprint is None:
        raise ValueError(f"{source} has no rankopt description (schema metadata {META_KEY.decode()!r}): pass the "
                         "fingerprint of the model that made its embeddings (--fingerprint)")
    data = table.to_pydict()
    level_names = described.get("level_names") or ["class"]
    label_names = described.get("label_names")
    labels = np.full((table.num_rows, len(level_names)), -1, dtype=np.int64)
    for level in range(len(level_names)):
        values = data.get(_label_column(level), [None] * table.num_rows)
        lookup = {name: i for i, name in enumerate(label_names[level])} if label_names is not None else None
        labels[:, level] = [-1 if v is None else lookup[v] if lookup is not None else int(v) for v in values]
    columns: Columns = {name: data[name] for name in described.get("metadata_columns", [])}
    if not described:  # someone else's table: its other columns are the metadata
        columns = {n: v for n, v in data.items() if n not in (path_name, "id") and not RESERVED.match(n)}
    paths = data.get(path_name)
    index = Index.from_embeddings(
        embeddings, None if paths is None or all(p is None for p in paths) else paths, labels,
        fingerprint=described.get("fingerprint", fingerprint), similarity=described.get("similarity", "cosine"),
        preprocessing=described.get("preprocessing"), level_names=level_names, label_names=label_names,
        ids=data.get("id"), metadata=columns, faiss=faiss, faiss_params=faiss_params, progress=progress)
    index.items.next_id = max(index.items.next_id, int(described.get("next_id") or 0))
    for key in ("checkpoint", "model", "dba", "qe", "created_utc", "threshold"):
        if described.get(key) is not None:
            setattr(index.record, key, described[key])
    index.post = stored_post(index.preprocessing, _whitening(meta.get(WHITENING_KEY)))
    return index


def _whitening(blob: bytes | None) -> Whitening | None:
    """The whitening stored in the schema metadata, or ``None``."""
    if blob is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "w.safetensors"
        path.write_bytes(blob)
        return load_whitening(path)
