"""The index being served and the model that embeds its image queries, swapped atomically when the
index folder changes on disk.

A request takes :attr:`IndexHolder.current` (a :class:`Snapshot`) once and uses it to the end, so a
reload never drops or mixes requests: in-flight ones finish on the old index and model, later ones
get the new. :meth:`IndexHolder.poll` compares the folder's identity
(:func:`rankopt.search.storage.identity`: its uid, new when the folder is rebuilt at the same path, and its
version, one more at each change) with the served one's and loads the new index (and, when its fingerprint
differs, its model) off to the side, on the torch thread (:mod:`rankopt.serve.torch_thread`: no torch
operation runs on any other thread); a folder failing to load leaves the served snapshot in place.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import torch

from rankopt.search import Embedder, Index, storage
from rankopt.serve.torch_thread import TORCH_THREAD


@dataclass(frozen=True)
class Snapshot:
    """One loaded index with everything a request needs from it."""

    index: Index
    embedder: Embedder
    """Embeds the image queries (its network in eval mode)."""
    rows: dict[str, int]
    """Item id -> row of the index."""
    loaded_utc: str

    @property
    def version(self) -> int | None:
        """The index folder's version this snapshot holds."""
        return self.index.record.version

    @property
    def identity(self) -> tuple[str | None, int]:
        """The index folder's ``(uid, version)`` this snapshot holds (:func:`rankopt.search.storage.identity`)."""
        return self.index.record.uid, int(self.index.record.version or 0)

    @property
    def decode_min_side(self) -> int | None:
        """The shorter side an upload's reduced JPEG decode must keep (as ``rankopt search`` decodes files)."""
        return getattr(self.embedder.transform, "decode_min_side", None)

    def transform(self, image: Any) -> torch.Tensor:
        """A decoded image -> the ``(3, H, W)`` model input (the index's test transform)."""
        return self.embedder.transform(image)

    def transform_here(self, image: Any) -> torch.Tensor | None:
        """:meth:`transform` made on the calling thread when the transform runs no torch operation for ``image``
        (:meth:`~rankopt.data.transforms.ImageTransform.without_torch`), else None: the torch thread transforms it."""
        without_torch = getattr(self.embedder.transform, "without_torch", None)
        return None if without_torch is None else without_torch(image)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, 3, H, W)`` transformed images -> ``(B, D)`` embeddings (:meth:`Embedder.embed_batch`)."""
        return self.embedder.embed_batch(images)


class IndexHolder:
    """The served :class:`Snapshot` of the index folder ``directory``; :meth:`poll` reloads it on change."""

    def __init__(self, directory: str | os.PathLike[str], *, checkpoint: str | os.PathLike[str] | None = None,
                 onnx: str | os.PathLike[str] | None = None, device: str = "auto", threads: int | None = None,
                 runtime: str | None = None) -> None:
        """``threads``: onnxruntime's intra-op threads when queries are embedded by it (torch's are the torch
        thread's, :class:`~rankopt.serve.batcher.MicroBatcher`); ``runtime``: what runs a checkpoint's forward
        (:mod:`rankopt.export.runtimes`; default ``$RANKOPT_RUNTIME``, else ``auto``)."""
        self.directory = storage.index_folder(directory)
        if checkpoint is not None and onnx is not None:
            raise ValueError("give checkpoint or onnx, not both")
        self._model, self._device = onnx or checkpoint, device
        self._options: dict[str, Any] = {"threads": threads} if threads is not None else {}
        if onnx is None:
            self._options["runtime"] = runtime
        self._lock = threading.Lock()
        self.last_error: str | None = None
        """Why the last reload failed (cleared by a successful one)."""
        self.current: Snapshot = TORCH_THREAD.run(self._load, None)

    def _load(self, previous: Snapshot | None) -> Snapshot:
        """The folder's index and embedder (the previous embedder kept when the fingerprint is the same)."""
        index = Index.load(self.directory)
        if previous is not None and previous.embedder.fingerprint == index.fingerprint:
            embedder = previous.embedder
        else:
            embedder = index.embedder_for(checkpoint=self._model, device=self._device, progress=False, **self._options)
            embedder.network.eval()
        return Snapshot(index, embedder, {item: row for row, item in enumerate(index.ids)},
                        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M:%S UTC}")

    def poll(self) -> bool | None:
        """Reload when the folder's uid or version differs from the served one's: True (reloaded), False (failed:
        :attr:`last_error` says why and the served snapshot stays), None (no change, or the same failure
        again)."""
        with self._lock:  # one reload at a time
            try:
                if storage.identity(self.directory) == self.current.identity:
                    self.last_error = None
                    return None
                loaded = TORCH_THREAD.run(self._load, self.current)
            except Exception as err:  # noqa: BLE001 - any failure keeps the served index; reported by /health
                error = f"{type(err).__name__}: {err}"
                if error == self.last_error:
                    return None
                self.last_error = error
                return False
            self.current, self.last_error = loaded, None
            return True
