"""Parity of an exported model with its PyTorch original: per-row cosine and retrieval metrics.

With ``a_i`` and ``b_i`` the embeddings of image ``i`` by PyTorch and by the exported model, the per-row cosine
is ``c_i = a_i·b_i / (|a_i| |b_i|)`` (float64). The export is faithful when ``min_i c_i >= 0.99999`` and, on
labelled images, the recall@1 and mAP@R of both (:func:`rankopt.metrics.evaluate`, self-retrieval on the finest
labels, each image excluded from its own results) differ by at most 1e-3.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from rankopt.data.base import RetrievalDataset
from rankopt.data.splits import subset
from rankopt.data.transforms import build_transform, output_size
from rankopt.engine.embed_and_score import embed_dataset
from rankopt.metrics import evaluate

COSINE_TOLERANCE = 0.99999
"""The smallest per-row cosine a faithful export may give."""
METRIC_TOLERANCE = 1e-3
"""The largest difference of a retrieval metric between a faithful export and PyTorch."""
PARITY_METRICS = ("recall@1", "map@r")
DEFAULT_LIMIT = 1000
"""Images of a split compared by default (:func:`sample`)."""
SYNTHETIC_IMAGES = 16


def row_cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``c_i = a_i·b_i / (|a_i| |b_i|)`` of two ``(N, D)`` embedding sets, float64 (NaN for a zero row)."""
    if a.shape != b.shape:
        raise ValueError(f"the two embedding sets have shapes {tuple(a.shape)} and {tuple(b.shape)}")
    a, b = a.double(), b.double()
    return (a * b).sum(dim=1) / (a.norm(dim=1) * b.norm(dim=1))


@dataclass(frozen=True)
class ParityReport:
    """Per-row cosines and retrieval metrics of PyTorch (reference) and exported (candidate) embeddings."""

    source: str
    images: int
    cosine_min: float
    cosine_max: float
    metrics: dict[str, tuple[float, float]]
    """``{name: (PyTorch, ONNX)}``; empty without labelled images."""
    note: str = ""
    """Why the metrics were not compared."""

    def failures(self) -> list[str]:
        """What falls outside the tolerances (NaN always does)."""
        out = []
        if not self.cosine_min >= COSINE_TOLERANCE:
            out.append(f"min per-row cosine {self.cosine_min:.8f} < {COSINE_TOLERANCE}")
        for name, (reference, candidate) in self.metrics.items():
            if not abs(reference - candidate) <= METRIC_TOLERANCE:
                out.append(f"{name} {candidate:.4f} vs PyTorch {reference:.4f} (tolerance {METRIC_TOLERANCE:g})")
        return out

    @property
    def ok(self) -> bool:
        return not self.failures()

    def lines(self) -> list[str]:
        """The report as printed by ``rankopt export``."""
        lines = [f"parity on {self.source}: per-row cosine ONNX vs PyTorch min {self.cosine_min:.8f}, "
                 f"max {self.cosine_max:.8f} (required >= {COSINE_TOLERANCE})"]
        lines += [f"  {name}: PyTorch {reference:.4f}, ONNX {candidate:.4f}, |difference| "
                  f"{abs(reference - candidate):.2g} (required <= {METRIC_TOLERANCE:g})"
                  for name, (reference, candidate) in self.metrics.items()]
        if self.note:
            lines.append(f"  {self.note}")
        return lines


def sample(dataset: RetrievalDataset, limit: int | None) -> RetrievalDataset:
    """A new dataset of at most ``limit`` items of ``dataset`` (all of them when ``None``). With labels (column 0):
    the first ``k = max(2, ceil(limit / K))`` items of each of ``floor(limit / k)`` classes evenly spaced among the
    ``K`` labelled ones, so every query keeps its positives; unlabelled: ``limit`` items at evenly spaced positions."""
    if limit is not None and limit < 1:
        raise ValueError(f"the number of images to compare must be >= 1, got {limit}")
    if limit is None or limit >= len(dataset):
        return subset(dataset, np.arange(len(dataset)), dataset.split)
    labels = dataset.labels[:, 0]
    classes = np.unique(labels[labels >= 0])
    if classes.size == 0:
        return subset(dataset, np.unique(np.linspace(0, len(dataset) - 1, limit).round().astype(np.int64)),
                      dataset.split)
    per_class = max(2, -(-limit // classes.size))
    count = max(1, min(classes.size, limit // per_class))
    kept = classes[np.unique(np.linspace(0, classes.size - 1, count).round().astype(np.int64))]
    rows = np.concatenate([np.flatnonzero(labels == c)[:per_class] for c in kept])
    return subset(dataset, np.sort(rows), dataset.split)


def _device(model: nn.Module) -> torch.device:
    parameter = next(model.parameters(), None)
    return torch.device("cpu") if parameter is None else parameter.device


def _metrics(embeddings: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:

    return evaluate(embeddings, labels, metrics=PARITY_METRICS).metrics


def compare(reference: nn.Module, candidate: nn.Module, preprocessing: Mapping[str, Any],
            images: RetrievalDataset | None = None, *, limit: int | None = DEFAULT_LIMIT, batch_size: int = 64,
            progress: bool = True, description: str | None = None) -> ParityReport:
    """Embed ``images`` (at most ``limit`` of them, :func:`sample`; the test transform of ``preprocessing``) with both
    models and compare (module docstring). ``images=None``: a synthetic batch of 16 random-pixel images
    (uniform in [0, 1], 1.25 times the input size) through the test transform; no metrics then.
    ``description``: how the report names ``images`` (default: the dataset's name and split)."""
    transform = build_transform(preprocessing["transform"], preprocessing.get("image_size"))
    if images is None:
        height, width = output_size(preprocessing["transform"], preprocessing.get("image_size"))
        pixels = torch.rand(SYNTHETIC_IMAGES, 3, round(1.25 * height), round(1.25 * width),
                            generator=torch.Generator().manual_seed(0))
        batch = transform(pixels)
        was_training = reference.training
        reference.eval()
        try:
            with torch.no_grad():
                a, b = reference(batch.to(_device(reference))).cpu(), candidate(batch)
        finally:
            reference.train(was_training)
        cosines = row_cosines(a, b)
        return ParityReport(f"a synthetic batch of {SYNTHETIC_IMAGES} random-pixel images (no images given)",
                            SYNTHETIC_IMAGES, float(cosines.min()), float(cosines.max()), {},
                            "retrieval metrics not compared: no labelled images given")
    dataset = sample(images, limit)
    dataset.transform = transform
    options = {"batch_size": batch_size, "show_progress": progress}
    a = embed_dataset(reference, dataset, device=_device(reference), desc="embedding (PyTorch)", **options)
    b = embed_dataset(candidate, dataset, device="cpu", desc="embedding (ONNX)", **options)
    cosines = row_cosines(a.embeddings, b.embeddings)
    labels = a.labels[:, 0]
    labelled = labels >= 0
    _, counts = np.unique(labels[labelled].numpy(), return_counts=True)
    metrics: dict[str, tuple[float, float]] = {}
    note = "retrieval metrics not compared: no class with two labelled images"
    if counts.size and counts.max() >= 2:
        of_reference, of_candidate = (_metrics(split.embeddings[labelled], labels[labelled]) for split in (a, b))
        metrics, note = {name: (of_reference[name], of_candidate[name]) for name in PARITY_METRICS}, ""
    sampled = len(dataset) < len(images)
    spaced = f" (sampled from {len(images)}: the first images of evenly spaced classes)" if sampled else ""
    what = description or f"{images.name} split {images.split!r}"
    return ParityReport(f"{len(dataset)} images of {what}{spaced}", len(dataset), float(cosines.min()),
                        float(cosines.max()), metrics, note)
