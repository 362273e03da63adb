"""The embedding and index defaults of ``rankopt index``, ``search``, ``serve`` and the :class:`Embedder` API, in
one place and without importing torch (the command line reads them to build its options)."""

from __future__ import annotations

from dataclasses import dataclass

SIMILARITIES = ("cosine", "dot", "neg_l2")
BACKENDS = ("exact", "qdrant")


@dataclass(frozen=True)
class EmbedSettings:
    """How a gallery or a query batch is embedded."""

    batch_size: int = 256
    num_workers: int = 0
    """DataLoader workers (0: decoding overlapped by threads, :mod:`rankopt.data.image_folder`)."""
    device: str = "auto"
    """``auto`` (CUDA when there is one), ``cpu``, ``cuda``, ``cuda:1``, ..."""


@dataclass(frozen=True)
class IndexSettings:
    """How an index searches and where it keeps its vectors."""

    similarity: str = "cosine"
    """One of :data:`SIMILARITIES`."""
    backend: str = "exact"
    """One of :data:`BACKENDS`: exact (or faiss) search in the folder, or a Qdrant collection too."""


EMBED = EmbedSettings()
INDEX = IndexSettings()
