"""faiss indexes built from faiss's own factory strings, and their recall measured against exact search.

``faiss.index_factory(dim, spec, metric)`` with ``METRIC_INNER_PRODUCT`` for ``cosine`` (on
L2-normalised vectors) and ``dot``, ``METRIC_L2`` for ``neg_l2``; inputs and scores as the exact
faiss path of the metrics (:func:`rankopt.metrics.topk.faiss_input`, :func:`faiss_scores`).
faiss is optional (:func:`rankopt.search.extras.import_faiss`). :class:`Faiss` is the search backend.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from rankopt.console import echo, progress
from rankopt.metrics.topk import chunked_topk, faiss_input, faiss_scores
from rankopt.search.backend import Backend, Gallery, Hits
from rankopt.search.extras import import_faiss
from rankopt.search.record import FaissEntry

TRAINING_POINTS_PER_CENTROID = 39
"""faiss's rule of thumb (its k-means warns below it): at least 39 training vectors per centroid."""
RECALL_QUERIES = 1000
ADD_BATCH = 65536


class Faiss(Backend):
    """Search through a faiss index (:attr:`index`) described by ``entry``; rebuilt on the gallery's vectors
    after a removal or re-embedding (its training kept), its recall measured again after each change."""

    def __init__(self, index: Any, entry: FaissEntry, similarity: str) -> None:
        self.index, self.entry, self.similarity = index, entry, similarity

    @classmethod
    def build(cls, gallery: Gallery, spec: str, params: str | None, *, show_progress: bool = True) -> Faiss:
        """A faiss index of the gallery's vectors from the factory string ``spec`` (see :func:`build`)."""
        backend = cls(build(gallery.embeddings, spec, gallery.similarity, params, show_progress=show_progress),
                      FaissEntry(spec, params), gallery.similarity)
        backend.measure(gallery)
        return backend

    def describe(self) -> str:
        return f"faiss {self.entry.spec}"

    def search(self, gallery: Gallery, queries: torch.Tensor, k: int, filter: Any = None) -> Hits:
        return search(self.index, queries, k, self.similarity)

    def changed(self, gallery: Gallery, added: int = 0) -> None:
        if added:
            add(self.index, gallery.embeddings[-added:], self.similarity, show_progress=False)
        else:
            self.index = rebuilt(self.index, gallery.embeddings, self.similarity, self.entry.params)
        self.measure(gallery)

    def measure(self, gallery: Gallery) -> None:
        """recall@10 vs exact search of an approximate index (not of a flat one), printed and stored in ``entry``."""
        if isinstance(self.index, import_faiss().IndexFlat) or len(gallery.embeddings) < 2:
            return
        recall = self.entry.recall = measure_recall(self.index, gallery.embeddings, self.similarity)
        echo(f"faiss {self.entry.spec}: recall@{recall['k']} vs exact = {recall['value']:.3f} "
             f"on {recall['queries']} queries")


def build(vectors: torch.Tensor, spec: str, similarity: str, params: str | None = None, *,
          show_progress: bool = True) -> Any:
    """A faiss index of ``vectors`` from the factory string ``spec``, trained on them when it needs training.

    ``params``: faiss ``ParameterSpace`` settings such as ``"nprobe=32"`` or ``"efSearch=128"``.
    IVF needs at least ``39 * nlist`` vectors (faiss's rule of thumb): fewer is a ``ValueError``.
    """
    faiss = import_faiss()
    metric = faiss.METRIC_L2 if similarity == "neg_l2" else faiss.METRIC_INNER_PRODUCT
    try:
        index = faiss.index_factory(vectors.shape[1], spec, metric)
    except RuntimeError as err:
        raise ValueError(f"faiss cannot build {spec!r} for {vectors.shape[1]}-d vectors: {_first_line(err)}") from None
    data = faiss_input(vectors, similarity)
    if not index.is_trained:
        nlist = re.search(r"IVF(\d+)", spec)
        needed = TRAINING_POINTS_PER_CENTROID * int(nlist.group(1)) if nlist else 1
        if len(data) < needed:
            smaller = max(1, len(data) // TRAINING_POINTS_PER_CENTROID)
            raise ValueError(f"faiss {spec!r} needs at least {needed} vectors to train ({TRAINING_POINTS_PER_CENTROID} "
                             f"per IVF list), the index has {len(data)}: use a smaller nlist (IVF{smaller} or less) "
                             "or exact search")
        try:
            index.train(data)
        except RuntimeError as err:
            raise ValueError(f"faiss cannot train {spec!r} on {len(data)} vectors: {_first_line(err)}") from None
    set_params(index, params)
    add(index, vectors, similarity, show_progress=show_progress)
    return index


def set_params(index: Any, params: str | None) -> None:
    if params:
        try:
            import_faiss().ParameterSpace().set_index_parameters(index, params)
        except RuntimeError as err:
            raise ValueError(f"faiss parameters {params!r}: {_first_line(err)}") from None


def add(index: Any, vectors: torch.Tensor, similarity: str, *, show_progress: bool = True) -> None:
    """Add ``vectors`` to ``index`` in batches (with a progress bar)."""
    starts = range(0, vectors.shape[0], ADD_BATCH)
    for start in progress(starts, desc="indexing", enabled=show_progress and len(starts) > 1):
        index.add(faiss_input(vectors[start : start + ADD_BATCH], similarity))


def rebuilt(index: Any, vectors: torch.Tensor, similarity: str, params: str | None = None) -> Any:
    """A copy of ``index`` holding ``vectors`` alone, its training kept (IVF centroids, PQ codebooks): after
    items are removed or re-embedded, faiss's ids are the index's rows again."""
    new = import_faiss().clone_index(index)
    new.reset()
    set_params(new, params)
    add(new, vectors, similarity, show_progress=False)
    return new


def search(index: Any, queries: torch.Tensor, k: int, similarity: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scores, ids)`` ``(Q, k)``, rows by decreasing score; ``id = -1`` (score ``-inf``) where the index
    returned fewer than ``k`` results (an IVF probing too few lists)."""
    dist, idx = index.search(faiss_input(queries, similarity), k)
    scores, ids = faiss_scores(dist, similarity), torch.from_numpy(idx).long()
    return scores.masked_fill(ids < 0, float("-inf")), ids


def measure_recall(index: Any, vectors: torch.Tensor, similarity: str, k: int = 10,
                   queries: int = RECALL_QUERIES, seed: int = 0) -> dict[str, Any]:
    """recall@k of ``index`` against exact search, with up to ``queries`` indexed items as queries (self excluded).

    ``recall@k = mean over queries of |approximate top-k ∩ exact top-k| / k``.
    """
    num = vectors.shape[0]
    k = min(k, num - 1)
    if k < 1:
        raise ValueError(f"recall needs at least 2 indexed vectors, the index has {num}")
    sample = torch.randperm(num, generator=torch.Generator().manual_seed(seed))[: min(queries, num)].sort().values
    _, exact = chunked_topk(vectors[sample], vectors, k, similarity=similarity, exclude=sample)
    _, found = search(index, vectors[sample], k + 1, similarity)
    hits = 0
    for own, row, truth in zip(sample.tolist(), found.tolist(), exact.tolist()):
        hits += len(set([j for j in row if j != own][:k]) & set(truth))
    return {"k": k, "value": hits / (k * len(sample)), "queries": len(sample)}


def write(index: Any, path: Path) -> None:
    import_faiss().write_index(index, str(path))


def read(path: Path) -> Any:
    try:
        return import_faiss().read_index(str(path))
    except RuntimeError as err:
        raise ValueError(f"cannot read faiss index {str(path)!r}: {_first_line(err)}") from None


def _first_line(err: Exception) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(err).__name__
