"""How an index answers top-k queries: one small interface, :class:`Backend`, and its exact implementation.

The implementations: :class:`Exact` (here), :class:`rankopt.search.approximate.Faiss` and
:class:`rankopt.search.qdrant.Qdrant`. Filtering sits on top (:meth:`rankopt.search.index.Index.search`): a
filtered search is exact over the items the filter keeps, unless the backend applies filters itself
(:attr:`Backend.filters`). A backend that cannot answer (a Qdrant collection of another version) returns
``None`` and the exact search answers.
"""

from __future__ import annotations

import contextlib
import os
import weakref
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import ClassVar, Protocol

import numpy as np
import torch

from rankopt.metrics.topk import chunked_topk
from rankopt.search.metadata import Columns, Filter
from rankopt.search.record import IndexInfo
from rankopt.similarity import prepare

Hits = tuple[torch.Tensor, torch.Tensor]
"""``(scores, rows)`` ``(Q, k)``, rows by decreasing score (``-1``: no item)."""


class Gallery(Protocol):
    """What a backend reads of an index (:class:`rankopt.search.index.Index` is one)."""

    embeddings: torch.Tensor
    labels: torch.Tensor
    label_names: list[list[str]] | None
    similarity: str
    record: IndexInfo
    searcher: Backend
    folder: os.PathLike[str] | None

    @property
    def dim(self) -> int: ...
    @property
    def ids(self) -> list[str]: ...
    @property
    def paths(self) -> Sequence[str] | None: ...
    @property
    def metadata(self) -> Columns: ...
    @property
    def device(self) -> torch.device: ...


class Backend(ABC):
    """Searches a gallery's vectors and keeps in step with them through its changes."""

    filters: ClassVar[bool] = False
    """Whether :meth:`search` applies a filter itself (else a filtered search is exact among the kept items)."""

    @abstractmethod
    def describe(self) -> str:
        """``"exact"``, ``"faiss <spec>"``, ``"qdrant <collection> (<where>)"``."""

    @abstractmethod
    def search(self, gallery: Gallery, queries: torch.Tensor, k: int, filter: Filter | None = None) -> Hits | None:
        """The top-``k`` items of each query (``filter`` only when :attr:`filters`); ``None``: answer exactly."""

    def changed(self, gallery: Gallery, added: int = 0) -> None:
        """In step with ``gallery`` after a change: its last ``added`` rows appended, or (0) rows removed or
        re-embedded."""

    @contextlib.contextmanager
    def saving(self, gallery: Gallery, directory: str | os.PathLike[str]) -> Iterator[None]:
        """Around the write of the gallery's folder ``directory`` (the block)."""
        yield


class Exact(Backend):
    """Exact search: chunked matrix products over every vector (:func:`exact_search`)."""

    def describe(self) -> str:
        return "exact"

    def search(self, gallery: Gallery, queries: torch.Tensor, k: int, filter: Filter | None = None) -> Hits:
        return exact_search(gallery, queries, k)


def exact_search(gallery: Gallery, queries: torch.Tensor, k: int, keep: np.ndarray | None = None) -> Hits:
    """The exact top-``k`` of ``queries`` among the gallery's vectors (those at the rows ``keep`` when given), on
    the gallery's device; scores and rows on the CPU. Cosine: the gallery normalised once (:func:`unit_vectors`),
    the queries here, then their dot products: the arithmetic of ``similarity="cosine"``, without normalising every
    vector at every search (one query in 50,000 items: 16 against 158 ms, ``benchmarks/results/served_search.md``)."""
    device, similarity = gallery.device, gallery.similarity
    if similarity == "cosine":
        vectors, queries, similarity = unit_vectors(gallery), prepare(queries.to(device), "cosine"), "dot"
    else:
        vectors = gallery.embeddings.to(device)
    if keep is not None:
        vectors = vectors[torch.from_numpy(keep).to(vectors.device)]
    scores, rows = chunked_topk(queries.to(device), vectors, k, similarity=similarity)
    scores, rows = scores.cpu(), rows.cpu()
    return scores, rows if keep is None else torch.from_numpy(keep)[rows]


_UNIT: weakref.WeakKeyDictionary[Gallery, tuple[weakref.ref, int, torch.Tensor]] = weakref.WeakKeyDictionary()
"""Per gallery: a weak reference to its embeddings tensor (a replaced tensor is not kept alive), that tensor's
in-place version, and the tensor L2-normalised."""


def unit_vectors(gallery: Gallery) -> torch.Tensor:
    """The gallery's vectors L2-normalised on its device (:func:`rankopt.similarity.prepare`), made again only when its
    embeddings are another tensor or were changed in place; held beside them (a gallery's size again in memory)."""
    x = gallery.embeddings
    held = _UNIT.get(gallery)
    if held is not None and held[0]() is x and held[1] == x._version:
        return held[2]
    unit = prepare(x.to(gallery.device), "cosine")
    _UNIT[gallery] = (weakref.ref(x), x._version, unit)
    return unit
