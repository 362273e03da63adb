"""A Qdrant collection kept in step with an index folder: the index's vectors, ids and metadata, searched there.

``qdrant-client`` is optional (the ``qdrant`` extra, :func:`rankopt.search.extras.import_qdrant`); :class:`Qdrant`
is the search backend. The index folder stays the reference (embeddings, items, versions:
:mod:`rankopt.search.storage`); ``index.json``'s ``qdrant`` entry names the collection:
``{"url": URL or null, "path": folder relative to the index folder or null, "collection": NAME}``.
``path`` is Qdrant's embedded local mode (one process at a time: an open client locks the folder, so rankopt
opens it per operation and waits a little for another process's operation), ``url`` a server or cluster.

* Points: id ``uuid5(NAMESPACE, item id)`` (Qdrant takes unsigned integers or UUIDs, rankopt's ids are strings,
  never reused), payload ``{"id", "path", "label", <metadata columns>, "digest"}`` with the label and metadata
  values as the text filters compare (:func:`rankopt.search.metadata.text`), so a rankopt filter becomes a
  payload filter with the same meaning: ``column in accepted texts`` for each condition, ANDed.
* Distances: cosine -> ``Cosine`` (Qdrant normalises the vectors: ``<q/|q|, r/|r|>``), dot -> ``Dot``,
  neg_l2 -> ``Euclid`` (Qdrant returns ``||q - r||_2``; rankopt's score is its negative).
* Search is exact (``SearchParams(exact=True)``): the top-k of rankopt's exact search, ties aside.
* :meth:`Qdrant.saving` around every save: points whose digest (of the vector and payload) differs are upserted,
  points of items no longer in the index deleted (:func:`sync`), so ``add``/``remove``/``update``
  (``index-add``/``-remove``/``-update``) reach the collection, and one left behind by an interrupted save is
  repaired by the next. ``INDEX_DIR/qdrant.json`` (``{"version": v}``) says the collection holds version ``v``:
  removed before a save, written after its sync. A search uses the collection only when that stamp names the
  loaded index's version before and after the query, else (a reader of an older version, a save under way)
  it searches the loaded vectors exactly: the same answer, never a mix of versions.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rankopt.files import write_text_atomic
from rankopt.search.backend import Backend, Gallery, Hits
from rankopt.search.extras import import_qdrant
from rankopt.search.label_names import label_texts
from rankopt.search.metadata import LABEL_KEY, Filter, conditions, text

NAMESPACE = uuid.UUID("6f0d8a52-3c1e-4f7b-9a7e-2b1d5c9e8f10")
"""The namespace of the points' UUIDv5 ids (fixed: a point id depends on the item id alone)."""
LOCAL_FOLDER = "qdrant"
STAMP = "qdrant.json"
"""The local-mode folder inside an index folder (the default backend location)."""
DEFAULT_COLLECTION = "rankopt"
BATCH = 512
LOCK_WAIT_S = 30.0
DISTANCES = {"cosine": "Cosine", "dot": "Dot", "neg_l2": "Euclid"}
_local_locks: dict[str, threading.Lock] = {}


def point_id(item_id: str) -> str:
    """The Qdrant point id of the item ``item_id``: ``uuid5(NAMESPACE, item_id)``."""
    return str(uuid.uuid5(NAMESPACE, item_id))


@dataclass(frozen=True)
class Location:
    """Where a collection lives: a server ``url`` or a local-mode ``path``, and the ``collection`` name."""

    url: str | None
    path: Path | None
    collection: str

    @classmethod
    def of(cls, spec: Mapping[str, Any], folder: str | os.PathLike[str]) -> Location:
        """``index.json``'s ``qdrant`` entry of the index folder ``folder`` (a relative path is inside it)."""
        path = spec.get("path")
        if (spec.get("url") is None) == (path is None):
            raise ValueError(f"{Path(folder) / 'index.json'}: the qdrant entry {dict(spec)} needs a url or a path")
        return cls(spec.get("url"), None if path is None else Path(folder) / path, str(spec["collection"]))

    @contextlib.contextmanager
    def client(self) -> Iterator[Any]:
        """An open client, closed on leaving (local mode: this process's operations on the folder one at a time,
        another process's waited for up to ``LOCK_WAIT_S``)."""
        qdrant_client = import_qdrant()
        if self.url is not None:
            with contextlib.closing(qdrant_client.QdrantClient(url=self.url)) as client:
                yield client
            return
        key = str(self.path.resolve())
        with _local_locks.setdefault(key, threading.Lock()), contextlib.closing(_open_local(key)) as client:
            yield client


def _open_local(path: str) -> Any:
    """A local-mode client of ``path``, waiting up to ``LOCK_WAIT_S`` while another process has it open."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            return import_qdrant().QdrantClient(path=path)
        except RuntimeError as err:
            if "already accessed" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Qdrant(Backend):
    """Search through the Qdrant collection ``spec`` names (``index.json``'s ``qdrant`` entry), kept in step
    at every save; filters become payload filters."""

    filters = True

    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = spec

    def describe(self) -> str:
        """``qdrant COLLECTION (URL | local PATH)``."""
        where = self.spec.get("url") or f"local {self.spec.get('path')}"
        return f"qdrant {self.spec['collection']} ({where})"

    def search(self, gallery: Gallery, queries: torch.Tensor, k: int, filter: Filter | None = None) -> Hits | None:
        return search(gallery, queries, k, filter)  # the module's function

    @contextlib.contextmanager
    def saving(self, gallery: Gallery, directory: str | os.PathLike[str]) -> Iterator[None]:
        """The stamp removed, the folder written (the block), the collection synced, the stamp of the saved
        version written (see the module docstring)."""
        stamp = Path(directory) / STAMP
        stamp.unlink(missing_ok=True)
        yield
        sync(gallery, directory)
        write_text_atomic(stamp, json.dumps({"version": gallery.record.version}))


def attach(index: Gallery, *, url: str | None = None, collection: str | None = None) -> None:
    """Make ``index`` keep a Qdrant collection: at ``url``, else in local mode in ``INDEX_DIR/qdrant``;
    ``collection`` defaults to ``"rankopt"``. Written by the next :meth:`Index.save`, searched after it."""
    import_qdrant()
    if index.record.faiss is not None:
        raise ValueError("an index is searched through faiss or Qdrant, not both: drop --faiss or --backend qdrant")
    if collection is not None and not collection.strip():
        raise ValueError("the Qdrant collection name is empty")
    index.record.qdrant = {"url": url, "path": None if url else LOCAL_FOLDER,
                           "collection": collection or DEFAULT_COLLECTION}
    index.searcher = Qdrant(index.record.qdrant)


# ---------------------------------------------------------------------- writing


def synced_version(folder: str | Path) -> int | None:
    """The index version the collection of ``folder`` holds (``None``: unknown, a save under way)."""
    try:
        return int(json.loads((Path(folder) / STAMP).read_text(encoding="utf-8"))["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def payloads(index: Gallery) -> list[dict[str, Any]]:
    """One payload per item: id, path, label text, metadata texts, and the digest of the vector and the rest."""
    labels = label_texts(index.labels, index.label_names)
    vectors = index.embeddings.detach().float().cpu().contiguous().numpy()
    out = []
    for row, item in enumerate(index.ids):
        payload = {"id": item, "path": None if index.paths is None else index.paths[row], LABEL_KEY: text(labels[row]),
                   **{column: text(values[row]) for column, values in index.metadata.items()}}
        digest = hashlib.blake2b(vectors[row].tobytes(), digest_size=16)
        digest.update(json.dumps(payload, sort_keys=True).encode())
        out.append({**payload, "digest": digest.hexdigest()})
    return out


def sync(index: Gallery, folder: str | os.PathLike[str]) -> dict[str, int]:
    """Bring the collection of ``index.record.qdrant`` in step with ``index`` (saved in ``folder``): created (or
    re-created when its dimension or distance differ), changed points upserted, others' points deleted.
    Returns ``{"upserted": n, "deleted": m}``."""
    models = import_qdrant().models
    location = Location.of(index.record.qdrant, folder)
    distance = models.Distance[DISTANCES[index.similarity].upper()]
    wanted = {point_id(p["id"]): (row, p) for row, p in enumerate(payloads(index))}
    with location.client() as client:
        name = location.collection
        current: dict[str, str] = {}
        if client.collection_exists(name):
            params = client.get_collection(name).config.params.vectors
            if getattr(params, "size", None) == index.dim and getattr(params, "distance", None) == distance:
                current = _digests(client, name)
            else:
                client.delete_collection(name)
        if not client.collection_exists(name):
            client.create_collection(name, vectors_config=models.VectorParams(size=index.dim, distance=distance))
        stale = [p for p in current if p not in wanted]
        changed = [(pid, row, payload) for pid, (row, payload) in wanted.items()
                   if current.get(pid) != payload["digest"]]
        vectors = index.embeddings.detach().float().cpu().numpy()
        for start in range(0, len(stale), BATCH):
            client.delete(name, points_selector=models.PointIdsList(points=stale[start : start + BATCH]))
        for start in range(0, len(changed), BATCH):
            batch = changed[start : start + BATCH]
            client.upsert(name, points=[models.PointStruct(id=pid, vector=vectors[row].tolist(), payload=payload)
                                        for pid, row, payload in batch])
    return {"upserted": len(changed), "deleted": len(stale)}


def _digests(client: Any, name: str) -> dict[str, str]:
    """``{point id: digest}`` of every point of the collection ``name``."""
    out, offset = {}, None
    while True:
        points, offset = client.scroll(name, limit=4096, offset=offset, with_payload=["digest"], with_vectors=False)
        out.update({str(p.id): (p.payload or {}).get("digest") for p in points})
        if offset is None:
            return out


# ---------------------------------------------------------------------- searching
def payload_filter(filter: Filter | None) -> Any:
    """A rankopt filter as a Qdrant payload filter: each condition ``column in accepted texts``, ANDed."""
    if filter is None:
        return None
    models = import_qdrant().models
    return models.Filter(must=[models.FieldCondition(key=key, match=models.MatchAny(any=sorted(accepted)))
                               for key, accepted in conditions(filter).items()])


def search(index: Gallery, queries: torch.Tensor, k: int, filter: Filter | None = None) -> Hits | None:
    """``(scores, rows)`` ``(Q, k)`` of ``index``'s collection, exact, in rankopt's score convention; ``filter``
    becomes a payload filter. ``None`` when the collection does not hold ``index``'s version (see the module
    docstring): :meth:`Index.search` then searches the loaded vectors exactly."""
    version = index.record.version
    if index.folder is None or synced_version(index.folder) != version:
        return None
    models = import_qdrant().models
    location = Location.of(index.record.qdrant, index.folder)
    query_filter = payload_filter(filter)
    params = models.SearchParams(exact=True) if location.url else None  # local mode is brute force (and warns)
    requests = [models.QueryRequest(query=row, limit=k, filter=query_filter, params=params, with_payload=["id"])
                for row in queries.detach().float().cpu().tolist()]
    with location.client() as client:
        responses = client.query_batch_points(location.collection, requests=requests)
    if synced_version(index.folder) != version:  # a save began during the query
        return None
    rows_of = {item: row for row, item in enumerate(index.ids)}
    rows = torch.tensor([[rows_of[p.payload["id"]] for p in response.points] for response in responses],
                        dtype=torch.long)
    scores = torch.tensor([[p.score for p in response.points] for response in responses], dtype=torch.float32)
    return (-scores if index.similarity == "neg_l2" else scores), rows

