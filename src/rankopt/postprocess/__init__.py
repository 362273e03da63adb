"""Post-processing of retrieval embeddings (the landmark-retrieval toolbox).

Order of application: multi-scale descriptors (at embedding time, :mod:`rankopt.models.multiscale`)
→ learned whitening (:mod:`.whitening`, per item) → DBA of the gallery → αQE of the queries
against the augmented gallery (:mod:`.expansion`). :class:`PostProcessing` holds the chosen steps;
:meth:`PostProcessing.preprocessing` is the JSON-able part that changes embeddings (multi-scale,
whitening) and joins ``rankopt.models.fingerprint.model_fingerprint``'s ``preprocessing``, so an
index built with whitening refuses queries embedded without it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rankopt.models.multiscale import multiscale
from rankopt.postprocess.expansion import (
    PAPER_ALPHA,
    PAPER_K,
    Expansion,
    alpha_query_expansion,
    database_augmentation,
    expand,
)
from rankopt.postprocess.whitening import (
    PairCovariance,
    Whitening,
    fit_pca_whitening,
    fit_supervised_whitening,
    load_whitening,
    matching_pairs,
    pair_covariance,
    save_whitening,
)


MULTISCALE_KEY = "multiscale"
WHITENING_KEY = "whitening"
"""The keys :meth:`PostProcessing.preprocessing` adds to a model's preprocessing settings."""


@dataclass(frozen=True)
class PostProcessing:
    """The chosen steps; each None is skipped. ``scales``: multi-scale embedding (None: single scale)."""

    scales: tuple[float, ...] | None = None
    whitening: Whitening | None = None
    dba: Expansion | None = None
    qe: Expansion | None = None

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """The model that embeds with :attr:`scales` (``model`` itself for a single scale)."""
        return multiscale(model, self.scales)

    def whiten(self, embeddings: torch.Tensor) -> torch.Tensor:
        """:meth:`Whitening.apply` when a whitening is set, else ``embeddings`` unchanged."""
        return embeddings if self.whitening is None else self.whitening.apply(embeddings)

    @property
    def expands(self) -> bool:
        """Whether DBA or αQE is set (then a self-retrieval split scores as query vs augmented gallery)."""
        return self.dba is not None or self.qe is not None

    def expand(self, query: torch.Tensor, gallery: torch.Tensor | None, *, exclude: torch.Tensor | None = None,
               similarity: str = "cosine", chunk_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """DBA of the gallery, then αQE of the queries against the augmented gallery: ``(query', gallery')``.

        ``gallery=None`` (self-retrieval): the gallery is ``query``; with DBA or αQE set, ``gallery'`` is
        returned as a tensor and each query ``i`` must keep being excluded from its results (its item
        ``i`` of ``gallery'``), as it is from its own expansion. ``exclude``: ``(Q,)`` each query's copy
        in a separate gallery (-1: none), excluded from its expansion neighbours.
        """
        if not self.expands:
            return query, gallery
        if gallery is None:
            exclude = torch.arange(query.shape[0], device=query.device)
        augmented = self.augment(query if gallery is None else gallery, similarity=similarity, chunk_size=chunk_size)
        return self.expand_queries(query, augmented, exclude=exclude, similarity=similarity,
                                   chunk_size=chunk_size), augmented

    def augment(self, gallery: torch.Tensor, *, similarity: str = "cosine",
                chunk_size: int | None = None) -> torch.Tensor:
        """DBA of ``gallery`` (:func:`database_augmentation`: each vector averaged with its neighbours), or
        ``gallery`` unchanged without :attr:`dba`."""
        if self.dba is None:
            return gallery
        return database_augmentation(gallery, self.dba, similarity=similarity, chunk_size=chunk_size)

    def expand_queries(self, query: torch.Tensor, gallery: torch.Tensor, *, exclude: torch.Tensor | None = None,
                       similarity: str = "cosine", chunk_size: int | None = None) -> torch.Tensor:
        """αQE of ``query`` against ``gallery`` (:func:`alpha_query_expansion`; ``exclude`` as in :meth:`expand`),
        or ``query`` unchanged without :attr:`qe` (or with ``k = 0``)."""
        if self.qe is None or self.qe.k == 0:
            return query
        return alpha_query_expansion(query, gallery, self.qe, exclude=exclude, similarity=similarity,
                                     chunk_size=chunk_size)

    def embedding_steps(self) -> PostProcessing:
        """Only the steps that change each item's embedding on its own (multi-scale, whitening)."""
        return dataclasses.replace(self, dba=None, qe=None)

    def without_whitening(self) -> PostProcessing:
        """The same steps but the whitening (for embeddings already whitened)."""
        return dataclasses.replace(self, whitening=None)

    def preprocessing(self) -> dict[str, Any]:
        """The JSON-able settings that change embeddings (multi-scale, whitening with its digest), to join
        the model fingerprint's ``preprocessing``; empty when neither is set."""
        out: dict[str, Any] = {}
        if self.scales is not None:
            out[MULTISCALE_KEY] = [round(s, 6) for s in self.scales]
        if self.whitening is not None:
            w = self.whitening
            out[WHITENING_KEY] = {"kind": w.kind, "power": w.power, "shrinkage": w.shrinkage, "dim": w.dim,
                                "digest": w.digest()}
        return out

    def to_dict(self) -> dict[str, Any]:
        """Every step and its settings (for reports): multiscale, whitening, dba, qe (None when off)."""
        return {
            "multiscale": None if self.scales is None else [round(s, 6) for s in self.scales],
            "whitening": None if self.whitening is None else {**self.whitening.metadata(),
                                                             "digest": self.whitening.digest()},
            "dba": None if self.dba is None else dataclasses.asdict(self.dba),
            "qe": None if self.qe is None else dataclasses.asdict(self.qe),
        }


__all__ = [
    "PAPER_ALPHA",
    "PAPER_K",
    "Expansion",
    "PostProcessing",
    "Whitening",
    "alpha_query_expansion",
    "database_augmentation",
    "expand",
    "fit_pca_whitening",
    "fit_supervised_whitening",
    "load_whitening",
    "matching_pairs",
    "pair_covariance",
    "PairCovariance",
    "save_whitening",
]
