"""The typed description of an index that ``index.json`` stores besides its arrays (keys as on disk)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class FaissEntry:
    """A faiss index: its factory string, ``ParameterSpace`` settings and recall@k against exact search."""

    spec: str
    params: str | None = None
    recall: dict[str, Any] | None = None
    """``{"k", "value", "queries"}``; ``None`` for a flat index (exact) or one too small to measure."""


@dataclass
class IndexInfo:
    """Where an index's embeddings came from and how it is searched; ``uid``/``version`` of its folder
    (:func:`rankopt.search.storage.identity`) once saved or loaded."""

    checkpoint: str | None = None
    model: dict[str, Any] | None = None
    """The model's summary (class, backbone, parameters)."""
    faiss: FaissEntry | None = None
    qdrant: dict[str, Any] | None = None
    """``{"url", "path", "collection"}`` of a Qdrant collection kept in step (:mod:`rankopt.search.qdrant`)."""
    dba: dict[str, Any] | None = None
    """``{"k", "alpha"}`` of the database-side augmentation the vectors were rewritten by."""
    qe: dict[str, Any] | None = None
    """``{"k", "alpha"}`` of the αQE a search applies unless it is given another (``rankopt fit`` validates it)."""
    created_utc: str | None = None
    threshold: dict[str, Any] | None = None
    """The calibrated threshold (:func:`rankopt.search.threshold.calibrate`)."""
    uid: str | None = None
    version: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IndexInfo:
        """The record of ``index.json``'s entries (missing ones ``None``, other keys ignored)."""
        values = {f.name: data.get(f.name) for f in dataclasses.fields(cls)}
        faiss = values["faiss"]
        values["faiss"] = FaissEntry(**faiss) if faiss else None
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """``{key: value}`` as ``index.json`` holds them."""
        return dataclasses.asdict(self)
