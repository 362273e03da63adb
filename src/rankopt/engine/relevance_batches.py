"""Multi-label items as the relevance of training batches (``loss.relevance``) and of evaluations (``rankopt
evaluate --multilabels``).

``loss.relevance``: ``none`` (the default: the loss ranks by the class labels), ``multilabel`` or
``multilabel_graded``. With a multi-label mode the training dataset must hold ``metadata["multilabels"]``, the
``(N, C)`` 0/1 multi-hot rows of its items (the ``csv`` dataset reads them from a ``labels`` column), and the loss
must take a :class:`~rankopt.rank.Relevance` (``accepts_relevance``: ``sup_ap``, ``smooth_ap``, ``hap``,
``sup_ndcg``). Each step the loss then gets ``Relevance.multilabel(M[batch indices], graded=...)`` instead of the
batch's labels: the rows are picked by the batch's dataset indices (``batch["index"]``), so batches and datasets
are unchanged. Graded, ``G`` is the training set's (the most labels an item has), the same in every batch.

What keeps the class labels (the ``label`` column): the sampler (``m_per_class`` draws classes of ``label``), the
score differences and diagnostics of ``steps.csv`` and a loss's class counts. The evaluations during training
follow ``eval.relevance`` (:func:`evaluation_mode`): by default the loss's relevance, on the evaluation splits'
multi-label items.

Supported with it: multistaged backprop (``train.sub_batch_size``: the full batch's relevance reaches the loss).
Refused, with an error naming the setting: the cross-batch memory (``train.memory.enabled``: it stores class
labels) and DDP (``DistributedLoss`` gathers class labels across ranks).

Evaluation: :func:`split_relevance` builds the ``Relevance.multilabel`` of a query split against its gallery
(or of a split against itself) from the splits' metadata, for ``rankopt.metrics.evaluate(..., relevance=)``, the
call of ``rankopt evaluate-embeddings --multilabels``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rankopt.metrics.verification import parse_far_keys
from rankopt.rank.relevance_input import RELEVANCE_LOSSES, Relevance

MULTILABELS = "multilabels"
"""The per-item metadata key of a dataset's ``(N, C)`` multi-hot rows."""
RELEVANCE_MODES = ("none", "multilabel", "multilabel_graded")
"""The values of ``loss.relevance``."""

BatchLabels = Callable[[torch.Tensor, torch.Tensor], Any]
"""``fn(labels, indices)``: what the loss gets for a batch, its labels or a :class:`Relevance`."""


def check_mode(mode: str, source: str = "relevance") -> bool:
    """Whether ``mode`` (one of :data:`RELEVANCE_MODES`) is graded; a ``ValueError`` naming ``source`` otherwise."""
    if mode not in RELEVANCE_MODES:
        raise ValueError(f"invalid value for {source!r}: {mode!r}; choose one of {', '.join(RELEVANCE_MODES)}")
    return mode == "multilabel_graded"


def uses_multilabels(mode: str, source: str = "relevance") -> bool:
    """Whether ``mode`` (checked by :func:`check_mode`) is a multi-label one (not ``none``)."""
    check_mode(mode, source)
    return mode != "none"


def missing_multilabels(dataset: Any, data_name: str | None = None, file: object = None) -> str:
    """Why ``dataset`` cannot give multi-label relevance (``""``: it can), naming the file and the column to add
    (``data_name``: default ``metadata["dataset"]``)."""
    metadata = getattr(dataset, "metadata", None) or {}
    if MULTILABELS in metadata:
        return ""
    data_name = data_name or metadata.get("dataset", type(dataset).__name__)
    if data_name == "csv":
        return (f"the CSV file{'' if file is None else f' {file}'} has no 'labels' column (each item's labels "
                "separated by '|', option labels_separator, e.g. cat|outdoor)")
    return (f"dataset {data_name!r} has no multi-label items (metadata['multilabels']); give them in a CSV file's "
            "'labels' column (data.name=csv)")


def multilabel_rows(dataset: Any) -> np.ndarray:
    """The ``(N, C)`` multi-hot rows of ``dataset``'s items (``metadata["multilabels"]``)."""
    rows = np.asarray(dataset.metadata[MULTILABELS])
    if rows.ndim != 2 or rows.shape[0] != len(dataset):
        raise ValueError(f"metadata['multilabels'] must be one (C,) row per item: {len(dataset)} items, got shape "
                         f"{rows.shape}")
    return rows


class BatchRelevance:
    """``Relevance.multilabel`` of a batch's items, picked from the dataset's rows by the batch's indices."""

    def __init__(self, rows: np.ndarray, *, graded: bool) -> None:
        self.rows = torch.as_tensor(np.ascontiguousarray(rows), dtype=torch.uint8)
        self.graded = graded
        self.grades = max(int(self.rows.sum(1).max()), 1) if self.rows.numel() else 1  # G of the whole set

    def __call__(self, labels: torch.Tensor, indices: torch.Tensor) -> Relevance:
        if self.rows.device != indices.device:
            self.rows = self.rows.to(indices.device)
        return Relevance.multilabel(self.rows[indices.long()], graded=self.graded,
                                    grades=self.grades if self.graded else None)


def _class_labels(labels: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    return labels


def batch_labels(cfg: Any, train_ds: Any, loss_fn: Any, *, world_size: int = 1,
                 eval_ds: Mapping[str, Any] | None = None) -> BatchLabels:
    """What the trainer's loss gets per batch under ``cfg.loss.relevance``: the class labels (``none``) or a
    :class:`BatchRelevance`, after refusing the combinations it cannot serve (module docstring); then ``eval_ds``,
    the evaluation splits, are checked for the relevance of the evaluations (:func:`evaluation_mode`)."""
    mode = cfg.loss.relevance
    graded = check_mode(mode, "loss.relevance")
    given: BatchLabels = _class_labels
    if mode != "none":
        _check_training(cfg, train_ds, loss_fn, world_size)
        given = BatchRelevance(multilabel_rows(train_ds), graded=graded)
    judged = evaluation_mode(cfg)
    if eval_ds and uses_multilabels(judged):
        source = f"eval.relevance={cfg.eval.relevance}" + (f" (loss.relevance={judged})" if cfg.eval.relevance ==
                                                           "loss" else "")
        check_splits(eval_ds, source, cfg.data.eval_name or cfg.data.name, cfg.data.eval_root or cfg.data.root)
        if world_size > 1:
            raise ValueError(f"{source} evaluates in one process only ({world_size} processes): set "
                             "eval.relevance=none under DDP and evaluate the checkpoint with rankopt evaluate "
                             "--multilabels")
        check_evaluation(judged, getattr(next(iter(eval_ds.values())), "metadata", None) or {}, cfg.eval.metrics)
    return given


def _check_training(cfg: Any, train_ds: Any, loss_fn: Any, world_size: int) -> None:
    source = f"loss.relevance={cfg.loss.relevance}"
    missing = missing_multilabels(train_ds, cfg.data.name, cfg.data.root)
    if missing:
        raise ValueError(f"{source} needs multi-label items, but {missing}")
    if not getattr(loss_fn, "accepts_relevance", False):
        raise ValueError(f"{source}: loss {cfg.loss.name!r} takes class labels, not a Relevance; use one of "
                         f"{', '.join(RELEVANCE_LOSSES)} (alone, not in a sum or combination)")
    if cfg.train.memory.enabled:
        raise ValueError(f"{source} cannot be used with the cross-batch memory (train.memory.enabled=true): the "
                         "memory keeps class labels, not multi-label rows")
    if world_size > 1:
        raise ValueError(f"{source} trains in one process only: DDP's global-batch loss gathers class labels "
                         f"({world_size} processes)")


def evaluation_mode(cfg: Any) -> str:
    """The relevance of the evaluations during training: ``eval.relevance``, or the loss's (``loss.relevance``) when
    it is ``loss``."""
    mode = cfg.eval.relevance
    if mode == "loss":
        return cfg.loss.relevance
    check_mode(mode, "eval.relevance")
    return mode


def check_splits(datasets: Mapping[str, Any], source: str, data_name: str | None = None, file: object = None) -> None:
    """A ``ValueError`` naming ``source`` (e.g. ``--multilabels``) and the file when a split to evaluate has no
    multi-label items (before any image is embedded)."""
    for split, dataset in datasets.items():
        missing = missing_multilabels(dataset, data_name, file)
        if missing:
            raise ValueError(f"{source} needs multi-label items, but {missing} (split {split!r})")


def check_evaluation(mode: str, metadata: Mapping[str, Any], metrics: Sequence[str]) -> None:
    """Refuse what a multi-label evaluation cannot serve: media averaging and landmark ground truth on the query split
    (``metadata``), ``tar@far`` metrics (they verify pairs by class label)."""
    refused = [f"metadata[{key!r}]" for key in ("media", "ground_truth") if key in metadata]
    refused += ["tar@far metrics (pairs verified by class label)"] if parse_far_keys(list(metrics))[1] else []
    if refused:
        raise ValueError(f"relevance={mode!r} scores the items by their multi-label relevance, not with "
                         f"{', '.join(refused)}")


def split_relevance(query: Mapping[str, Any], ref: Mapping[str, Any] | None, mode: str) -> Relevance:
    """``Relevance.multilabel`` of the query split's items against the gallery's (``ref=None``: against
    themselves), from the splits' metadata (``mode``: ``multilabel`` or ``multilabel_graded``)."""
    graded = check_mode(mode)
    if mode == "none":
        raise ValueError("split_relevance needs a multi-label mode (multilabel or multilabel_graded)")
    matrices = []
    for what, metadata in (("query split", query), ("gallery split", ref)):
        if metadata is not None:
            if MULTILABELS not in metadata:
                raise ValueError(f"relevance={mode!r} needs metadata['multilabels'] on the {what}")
            matrices.append(torch.as_tensor(np.asarray(metadata[MULTILABELS])))
    return Relevance.multilabel(matrices[0], matrices[-1], graded=graded)
