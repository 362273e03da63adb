"""ROD combinations (TPAMI Eq. 2): a rank loss plus a decomposability loss, and their named builds."""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from rankopt.losses.base import RankLoss
from rankopt.losses.calibration import CalibrationLoss
from rankopt.losses.hap import HAPLoss
from rankopt.losses.ndcg import SupNDCGLoss
from rankopt.losses.proxy import ProxyDGLoss
from rankopt.losses.recall import SupRecallLoss
from rankopt.losses.registry import LOSSES
from rankopt.losses.sup_ap import SupAPLoss
from rankopt.losses.terms import record, term_name


class ROD(nn.Module):
    """``L_ROD = (1 - lam) * L_rank + lam * L_DG`` (TPAMI Eq. 2; ROADMAP Eq. 2).

    The reference set (memory bank) goes to ``rank_loss`` and, if it accepts one, to
    ``decomposability_loss``; ``accepts_reference`` follows ``rank_loss``. Learnable
    parameters (proxies) are reached through ``parameters()``.

    When both terms are :class:`~rankopt.losses.base.RankLoss` es and the decomposability loss can use the
    rank loss's retrieval set (:meth:`~rankopt.losses.base.RankLoss.can_share`: same similarity, self-inclusion
    and label columns, e.g. ROADMAP's Sup-AP and calibration, or any rank loss with ``L_DG^*``), the inputs are
    checked and the score matrix, levels and masks computed once and handed to both terms; the gradients of the
    two terms meet on the scores, so the embeddings' product is differentiated once. Otherwise each term runs on its own.
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


def _split_kwargs(rank_cls: type, dg_cls: type, kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Route keyword arguments: those named in ``dg_cls.__init__`` (or its ``RankLoss`` base) go to it,
    the others to the rank loss; shared base options (``similarity``, ``include_self``, ``max_elements``) and
    options both classes name (``method`` of Sup-AP and calibration) go to both."""
    dg_names = set(inspect.signature(dg_cls.__init__).parameters) - {"self", "kwargs"}
    rank_names = set(inspect.signature(rank_cls.__init__).parameters) - {"self", "kwargs"}
    shared = {"similarity", "include_self", "max_elements"} | (dg_names & rank_names)
    rank_kw = {k: v for k, v in kwargs.items() if k not in dg_names or k in shared}
    dg_kw = {k: v for k, v in kwargs.items() if k in dg_names or k in shared}
    return rank_kw, dg_kw


def _rod_builder(name: str, rank_cls: type, dg_cls: type, default_lam: float, doc: str) -> None:
    def build(lam: float = default_lam, **kwargs: Any) -> ROD:
        rank_kw, dg_kw = _split_kwargs(rank_cls, dg_cls, kwargs)
        return ROD(rank_cls(**rank_kw), dg_cls(**dg_kw), lam)

    build.__name__ = f"build_{name}"
    build.__doc__ = doc
    dg_params = inspect.signature(dg_cls).parameters
    build.data_arguments = {arg: source for arg, source in (("num_classes", "classes"), ("embedding_dim", "embedding_dim"))  # type: ignore[attr-defined]
                            if arg in dg_params}
    LOSSES.register(name)(build)


_rod_builder("roadmap", SupAPLoss, CalibrationLoss, 0.5, "ROADMAP (NeurIPS 2021 Eq. 2): (1 - lam) Sup-AP + lam calibration, lam = 0.5.")
_rod_builder("rod_ap", SupAPLoss, ProxyDGLoss, 0.1, "ROADMAP of TPAMI (Eq. 12): (1 - lam) Sup-AP + lam L_DG^*, lam = 0.1; needs num_classes, embedding_dim.")
_rod_builder("rod_recall", SupRecallLoss, ProxyDGLoss, 0.1, "ROD-R@k (TPAMI Eq. 17 with L_DG^*): lam = 0.1; needs num_classes, embedding_dim.")
_rod_builder("happier", HAPLoss, ProxyDGLoss, 0.1, "HAPPIER (TPAMI Eq. 22): (1 - lam) Sup-H-AP + lam L_DG^*, lam = 0.1; needs num_classes, embedding_dim.")
_rod_builder("rod_ndcg", SupNDCGLoss, ProxyDGLoss, 0.1, "ROD-NDCG (TPAMI Eq. 25): (1 - lam) Sup-NDCG + lam L_DG^*, lam = 0.1; needs num_classes, embedding_dim.")
