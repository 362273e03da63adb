"""ROD combinations (TPAMI Eq. 2): a rank loss plus a decomposability loss, and their named builds.

A combination's kwargs are ``lam`` and one map per term, keyed by the term's registered name, as for sums
(:func:`~rankopt.losses.sums.term_maps`)::

    loss.name=roadmap loss.kwargs.lam=0.5 loss.kwargs.sup_ap.tau=0.01 loss.kwargs.calibration.alpha=0.9
    loss.name=rod_ap loss.kwargs.sup_ap.rho=100 loss.kwargs.proxy_dg.temperature=0.05

The flat spelling (``loss.kwargs.tau=0.01``) is still read, routed by each combination's table
(:class:`Combination`): no signature is inspected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from rankopt.losses.rank_loss import RankLoss
from rankopt.losses.registry import LOSSES, PROXIES, register
from rankopt.losses.sums import term_maps
from rankopt.losses.terms import record, term_name
from rankopt.rank.relevance_input import require_class_labels


class ROD(nn.Module):
    """``L_ROD = (1 - lam) * L_rank + lam * L_DG`` (TPAMI Eq. 2; ROADMAP Eq. 2).

    The reference set (memory bank) goes to ``rank_loss`` and, if it accepts one, to
    ``decomposability_loss``; ``accepts_reference`` follows ``rank_loss``. Learnable
    parameters (proxies) are reached through ``parameters()``.

    When both terms are :class:`~rankopt.losses.rank_loss.RankLoss` es and the decomposability loss can use the
    rank loss's retrieval set (:meth:`~rankopt.losses.rank_loss.RankLoss.can_share`: same similarity, self-inclusion
    and label columns, e.g. ROADMAP's Sup-AP and calibration, or any rank loss with ``L_DG^*``), the inputs are
    checked and the score matrix, levels and masks computed once and handed to both terms; the gradients of the
    two terms meet on the scores, so the embeddings' product is differentiated once. Otherwise each term runs on its
    own.
    """

    def __init__(self, rank_loss: nn.Module, decomposability_loss: nn.Module, lam: float) -> None:
        super().__init__()
        if not 0.0 <= lam <= 1.0:
            raise ValueError(f"lam must be in [0, 1], got {lam}")
        self.rank_loss, self.decomposability_loss, self.lam = rank_loss, decomposability_loss, float(lam)

    @property
    def accepts_reference(self) -> bool:
        return bool(getattr(self.rank_loss, "accepts_reference", False))

    @property
    def last_num_queries_without_positive(self) -> int:
        return int(getattr(self.rank_loss, "last_num_queries_without_positive", 0))

    def shares_retrieval_set(self, with_reference: bool) -> bool:
        """Whether the two terms run on one retrieval set (see the class docstring)."""
        rank, dg = self.rank_loss, self.decomposability_loss
        return isinstance(rank, RankLoss) and isinstance(dg, RankLoss) and dg.can_share(rank, with_reference)

    def forward(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor,
        ref_embeddings: torch.Tensor | None = None,
        ref_labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        require_class_labels(labels, "a ROD combination (its decomposability term)")
        if self.shares_retrieval_set(ref_embeddings is not None):
            batch = self.rank_loss.retrieval_set(embeddings, labels, ref_embeddings, ref_labels)
            with torch.autocast(device_type=embeddings.device.type, enabled=False):
                rank, dg = self.rank_loss.compute(batch), self.decomposability_loss.compute(batch)
        else:
            rank = self.rank_loss(embeddings, labels, ref_embeddings, ref_labels)
            if getattr(self.decomposability_loss, "accepts_reference", False):
                dg = self.decomposability_loss(embeddings, labels, ref_embeddings, ref_labels)
            else:
                dg = self.decomposability_loss(embeddings, labels)
        record(term_name(self.rank_loss), rank)
        record(term_name(self.decomposability_loss), dg)
        return (1.0 - self.lam) * rank + self.lam * dg

    def extra_repr(self) -> str:
        return f"lam={self.lam}"


SHARED = ("similarity", "include_self", "max_elements")
"""The retrieval-set options of :class:`~rankopt.losses.rank_loss.RankLoss`: a flat one goes to both terms."""


@dataclass(frozen=True)
class Combination:
    """A named ROD build ``(1 - lam) rank + lam decomposability`` of two registered losses.

    :meth:`route` gives each term its map (``kwargs[<term name>]``) over the flat keys routed to it:
    those in ``decomposability_keys`` to the decomposability term, :data:`SHARED` and ``both_keys`` to both
    terms, all others (e.g. ``tau``, ``rho``) to the rank term. ``ValueError`` for a key given both ways.
    """

    rank: str
    decomposability: str
    lam: float
    decomposability_keys: tuple[str, ...]
    both_keys: tuple[str, ...] = ()

    def route(self, kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The (rank, decomposability) kwargs of ``kwargs`` (``lam`` taken out)."""
        maps, flat = term_maps((self.rank, self.decomposability), kwargs)
        both = (*SHARED, *self.both_keys)
        rank = {k: v for k, v in flat.items() if k not in self.decomposability_keys or k in both}
        dg = {k: v for k, v in flat.items() if k in self.decomposability_keys or k in both}
        for term, routed in ((self.rank, rank), (self.decomposability, dg)):
            if routed.keys() & maps[term].keys():
                raise ValueError(f"loss.kwargs: {sorted(routed.keys() & maps[term].keys())} given both flat and in "
                                 f"loss.kwargs.{term}; give each once, in the term's map")
        return rank | maps[self.rank], dg | maps[self.decomposability]


_PROXY_DG_KEYS = ("num_classes", "embedding_dim", "temperature")
"""The flat keys of :class:`~rankopt.losses.proxy.ProxyDGLoss` (its data arguments among them)."""
COMBINATIONS: dict[str, Combination] = {}
"""Registered name -> its combination, e.g. ``COMBINATIONS["roadmap"].route(kwargs)`` for its terms' kwargs."""


def _register(name: str, combination: Combination, data: Mapping[str, str] | None, doc: str) -> None:
    def build(lam: float = combination.lam, **kwargs: Any) -> ROD:
        rank_kw, dg_kw = combination.route(kwargs)
        return ROD(LOSSES.build(combination.rank, **rank_kw), LOSSES.build(combination.decomposability, **dg_kw), lam)

    build.__name__ = f"build_{name}"
    build.__doc__ = doc
    COMBINATIONS[name] = combination
    register(name, data=data)(build)


_register("roadmap", Combination("sup_ap", "calibration", 0.5, ("alpha", "beta", "reduction"), ("method",)), None,
          "ROADMAP (NeurIPS 2021 Eq. 2): (1 - lam) Sup-AP + lam calibration, lam = 0.5.")
_register("rod_ap", Combination("sup_ap", "proxy_dg", 0.1, _PROXY_DG_KEYS), PROXIES,
          "ROADMAP of TPAMI (Eq. 12): (1 - lam) Sup-AP + lam L_DG^*, lam = 0.1; needs num_classes, embedding_dim.")
_register("rod_recall", Combination("sup_recall", "proxy_dg", 0.1, _PROXY_DG_KEYS), PROXIES,
          "ROD-R@k (TPAMI Eq. 17 with L_DG^*): lam = 0.1; needs num_classes, embedding_dim.")
_register("happier", Combination("hap", "proxy_dg", 0.1, _PROXY_DG_KEYS), PROXIES,
          "HAPPIER (TPAMI Eq. 22): (1 - lam) Sup-H-AP + lam L_DG^*, lam = 0.1; needs num_classes, embedding_dim.")
_register("rod_ndcg", Combination("sup_ndcg", "proxy_dg", 0.1, _PROXY_DG_KEYS), PROXIES,
          "ROD-NDCG (TPAMI Eq. 25): (1 - lam) Sup-NDCG + lam L_DG^*, lam = 0.1; needs num_classes, embedding_dim.")
