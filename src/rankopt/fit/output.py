"""What a fit leaves to serve: the model checkpoint and the index of every photo, checked against each other."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rankopt.config import config_to_dict
from rankopt.engine.checkpoint import save_model_checkpoint
from rankopt.engine.embed_and_score import EmbeddedSplit
from rankopt.fit.photos import Photos
from rankopt.fit.post import PostChoice
from rankopt.fit.sizing import CPU_BATCH
from rankopt.search.embedder import Embedder
from rankopt.search.index import Index

PARITY_TOLERANCE = 1e-3
"""Largest difference allowed between a photo's indexed vector and its embedding by the saved model."""


def steps_text(index: Index) -> str:
    """The index's post-processing in words."""
    steps = [] if index.post is None or index.post.whitening is None else [f"{index.post.whitening.kind} whitening"]
    steps += [f"{name} k={e['k']}" for name, e in (("DBA", index.record.dba), ("αQE", index.record.qe)) if e]
    return ", ".join(steps) or "no post-processing"


def served_text(model: str, choice: PostChoice, scales: tuple[float, ...] | None, framing: str = "") -> str:
    """The served pipeline in words: the model, the photos' framing where it was chosen, its scales when several,
    the post-processing steps."""
    framed = f" ({framing})" if framing else ""
    at = "" if scales is None else " at scales " + ", ".join(f"{s:.3g}" for s in scales)
    return f"{model}{framed}{at} + {choice.describe()}"


def save_model(path: Path, net: torch.nn.Module, cfg: Any, source: Path) -> Path:
    """``net`` as it is, a checkpoint at ``path`` with ``cfg``, recording the file it was fitted from."""
    return save_model_checkpoint(path, net.state_dict(), config_to_dict(cfg), {"fit_from": source.name})


def save_index(folder: Path, model_path: Path, photos: Photos, embeddings: torch.Tensor, choice: PostChoice,
               scales: tuple[float, ...] | None, device: torch.device, runtime: str | None = None) -> Index:
    """The index of every photo at ``folder``: ``embeddings`` (by the model saved at ``model_path``) with the chosen
    steps, the whitening refitted on every photo's embedding; checked against the saved model first, on ``runtime``
    (the one ``rankopt serve`` will use by default: its export is then cached)."""
    embedder = Embedder.from_checkpoint(model_path, device=str(device), batch_size=CPU_BATCH, runtime=runtime,
                                        progress=False)  # a few photos: the parity check
    whitening = None
    if choice.whitening is not None:
        whitening = choice.whitening.fit(embeddings, photos.labels, "every photo of the fit") or choice.fitted_whitening
        whitening = dataclasses.replace(whitening, model_fingerprint=embedder.fingerprint, scales=scales)
    post = dataclasses.replace(choice.steps(whitening), scales=scales)
    embedder = embedder.with_postprocessing(post)
    vectors = post.whiten(embeddings)
    split = EmbeddedSplit(vectors, torch.as_tensor(np.asarray(photos.dataset.labels)), list(photos.dataset.paths),
                          dict(photos.dataset.metadata))
    check_parity(embedder, photos, vectors)
    index = Index.from_split(embedder, photos.dataset, split, postprocessing=post, progress=False)
    index.save(folder)
    return index


def check_parity(embedder: Embedder, photos: Photos, vectors: torch.Tensor, count: int = 4) -> None:
    """The saved model and steps embed a few photos as the index holds them (cached trunk + tail, whitened):
    else queries would not meet their own photos."""
    rows = np.linspace(0, len(photos.dataset) - 1, min(count, len(photos.dataset))).astype(int)
    direct = embedder.embed([photos.dataset.paths[r] for r in rows]).embeddings
    worst = float((direct - vectors[torch.as_tensor(rows)]).abs().max())
    if worst > PARITY_TOLERANCE:
        raise RuntimeError(f"the saved model's embeddings differ from the indexed ones by {worst:.2e}")
