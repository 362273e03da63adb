"""Classic metric-learning baselines of the papers' tables, through pytorch-metric-learning (PML).

:class:`PMLLoss` adapts PML losses (and miners) to rankopt's call convention:
``loss(embeddings, labels, ref_embeddings=None, ref_labels=None)`` with ``(N,)`` or
``(N, L)`` labels, validation by :meth:`RankLoss.validate`, float32 with autocast off.

* Flat losses use label column 0 (finest level).
* ``sum_*`` losses are the hierarchical baselines of TPAMI Table V (ΣTL_SH, ΣNSM,
  ΣNCA++): one loss per label column, summed, ``sum_l w_l L(labels[:, l])`` with
  ``w_l = 1`` unless ``weights`` are given (the paper states no weighting).
* Pair/triplet losses accept a reference set (memory bank, other ranks): each query
  is compared with the rest of the batch plus the reference set, itself excluded by
  index (PML alone compares with the reference set only when ``ref_emb`` is given).
  Proxy losses do not (``accepts_reference = False``); their proxies are ordinary
  parameters, ``loss.parameters()``, for their own optimizer group; ``paper_lr_mult`` (set by the
  classification losses, :mod:`rankopt.losses.classification`) asks for a group of the model's optimizer
  at that multiple of its learning rate instead, as their papers train them.

ProxyNCA++ (Teh et al. 2020) is not in PML; its loss, ``-log softmax_c(-||x - p_c||^2 / T)``
over normalised embeddings and proxies with the positive proxy in the denominator, is
PML's ``ProxyNCALoss`` with ``softmax_scale = 1 / T`` (T = 1/9, the paper's). Its other
ingredients (fast-moving proxies, max pooling, layer norm) belong to the optimizer and model.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType

import torch
from torch import nn

from rankopt.losses.rank_loss import RankLoss, compute_dtype
from rankopt.losses.registry import PER_LEVEL_PROXIES, PROXIES, register

Indices = tuple[torch.Tensor, ...]


def pml(module: str = "losses") -> ModuleType:
    """pytorch-metric-learning's ``module`` (``losses``, ``miners``, ...), imported when a loss first needs it: the
    package and the SciPy it loads take half a second that ``fit``, ``index`` and ``serve`` never need."""
    return importlib.import_module(f"pytorch_metric_learning.{module}")


def without_self_pairs(indices: Indices) -> Indices:
    """Drop (anchor, positive) pairs where the positive is the anchor itself: anchor ``i`` is
    item ``i`` of the retrieval set (batch first). Works on PML triplets and pair 4-tuples."""
    keep = indices[0] != indices[1]
    return (indices[0][keep], indices[1][keep], *indices[2:]) if len(indices) == 4 else tuple(t[keep] for t in indices)


class PMLLoss(RankLoss):
    """A PML loss (and optional miner) per label level, summed with ``weights``.

    ``losses``/``miners``: one entry shared by every level, or one per level (proxy
    losses, whose proxies differ per level). ``hierarchical=False`` uses column 0 only.
    ``num_classes`` (per entry) and ``embedding_dim`` are checked for proxy losses.
    ``paper_lr_mult``: the learning rate of the loss's parameters as a multiple of the model's (None: their own
    optimizer, ``optim.loss_params``).
    """

    def __init__(
        self,
        losses: Sequence[nn.Module],
        miners: Sequence[nn.Module | None] | None = None,
        *,
        hierarchical: bool = False,
        weights: Sequence[float] | None = None,
        accepts_reference: bool = True,
        num_classes: Sequence[int] | None = None,
        embedding_dim: int | None = None,
        paper_lr_mult: float | None = None,
    ) -> None:
        super().__init__()
        self.losses = nn.ModuleList(losses)
        self.miners: tuple[nn.Module | None, ...] = tuple(miners) if miners is not None else (None,) * len(self.losses)
        if len(self.miners) != len(self.losses) or not self.losses:
            raise ValueError(f"need one miner (or None) per loss, got {len(self.miners)} for {len(self.losses)}")
        self.hierarchical = hierarchical
        self.weights = None if weights is None else [float(w) for w in weights]
        self.accepts_reference = accepts_reference
        self.num_classes = None if num_classes is None else [int(n) for n in num_classes]
        self.embedding_dim = embedding_dim
        self.paper_lr_mult = paper_lr_mult

    def forward(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor,
        ref_embeddings: torch.Tensor | None = None,
        ref_labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        labels, ref_labels = self.validate(embeddings, labels, ref_embeddings, ref_labels)
        num_levels = labels.shape[1]
        if len(self.losses) not in (1, num_levels):
            raise ValueError(f"{type(self).__name__} has {len(self.losses)} per-level losses but the labels have "
                             f"{num_levels} levels")
        weights = self.weights or [1.0] * num_levels
        if len(weights) != num_levels:
            raise ValueError(f"weights has {len(weights)} entries but the labels have {num_levels} levels")
        if self.embedding_dim is not None and embeddings.shape[1] != self.embedding_dim:
            raise ValueError(f"embeddings have dimension {embeddings.shape[1]} but the proxies have "
                             f"{self.embedding_dim}")
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            x = embeddings.to(compute_dtype(embeddings))
            ref = None if ref_embeddings is None else ref_embeddings.to(x.device, x.dtype)
            total = x.new_zeros(())
            for level, weight in enumerate(weights):
                ref_y = None if ref_labels is None else ref_labels[:, level]
                total = total + weight * self.level_loss(level % len(self.losses), x, labels[:, level], ref, ref_y)
        return total

    def level_loss(self, index: int, x: torch.Tensor, y: torch.Tensor, ref: torch.Tensor | None,
                   ref_y: torch.Tensor | None) -> torch.Tensor:
        """Loss ``index`` on one label column; the reference set extends each query's retrieval set."""
        if self.num_classes is not None:
            low, high = int(y.min()), int(y.max())
            if low < 0 or high >= self.num_classes[index]:
                raise ValueError(f"labels must lie in [0, {self.num_classes[index]}) for the proxies of level {index}; "
                                 f"got values in [{low}, {high}]")
        loss, miner = self.losses[index], self.miners[index]
        if ref is None or ref_y is None:
            return loss(x, y, None if miner is None else miner(x, y))
        items, item_y = torch.cat([x, ref]), torch.cat([y, ref_y])
        if miner is None:
            indices = pml("utils.loss_and_miner_utils").get_all_pairs_indices(y, item_y)
        else:
            indices = miner(x, y, items, item_y)
        return loss(x, y, without_self_pairs(indices), ref_emb=items, ref_labels=item_y)

    def extra_repr(self) -> str:
        return f"hierarchical={self.hierarchical}, weights={self.weights}, accepts_reference={self.accepts_reference}"


def _semi_hard_triplet(margin: float) -> tuple[nn.Module, nn.Module]:
    return (pml().TripletMarginLoss(margin=margin),
            pml("miners").TripletMarginMiner(margin=margin, type_of_triplets="semihard"))


def proxy_losses(make: type[nn.Module], num_classes: Sequence[int], embedding_dim: int, hierarchical: bool,
                 weights: Sequence[float] | None, paper_lr_mult: float | None = None, **kwargs: float) -> PMLLoss:
    """PML loss class ``make`` with one set of class weights (proxies) per entry of ``num_classes``."""
    return PMLLoss(
        [make(num_classes=n, embedding_size=embedding_dim, **kwargs) for n in num_classes],
        hierarchical=hierarchical,
        weights=weights,
        accepts_reference=False,
        num_classes=num_classes,
        embedding_dim=embedding_dim,
        paper_lr_mult=paper_lr_mult,
    )


@register("triplet")
def triplet(margin: float = 0.2) -> PMLLoss:
    """Triplet margin loss with semi-hard mining (TL_SH; Schroff et al. 2015's margin 0.2)."""
    loss, miner = _semi_hard_triplet(margin)
    return PMLLoss([loss], [miner])


@register("sum_triplet")
def sum_triplet(margin: float = 0.2, weights: Sequence[float] | None = None) -> PMLLoss:
    """ΣTL_SH (TPAMI Table V): semi-hard triplet loss on every label level, summed."""
    loss, miner = _semi_hard_triplet(margin)
    return PMLLoss([loss], [miner], hierarchical=True, weights=weights)


@register("contrastive")
def contrastive(pos_margin: float = 0.0, neg_margin: float = 1.0) -> PMLLoss:
    """Contrastive loss on Euclidean distances of normalised embeddings (PML defaults)."""
    return PMLLoss([pml().ContrastiveLoss(pos_margin=pos_margin, neg_margin=neg_margin)])


@register("multi_similarity")
def multi_similarity(alpha: float = 2.0, beta: float = 50.0, base: float = 0.5, epsilon: float = 0.1) -> PMLLoss:
    """Multi-similarity loss with its miner (Wang et al. 2019; PML defaults)."""
    return PMLLoss([pml().MultiSimilarityLoss(alpha=alpha, beta=beta, base=base)],
                   [pml("miners").MultiSimilarityMiner(epsilon=epsilon)])


@register("supcon")
def supcon(temperature: float = 0.1) -> PMLLoss:
    """Supervised contrastive loss (Khosla et al. NeurIPS 2020, Eq. 2, L^sup_out, tau = 0.1):
    ``-1/|P(i)| sum_{p in P(i)} log( exp(z_i . z_p / tau) / sum_{a in A(i)} exp(z_i . z_a / tau) )`` over normalised
    embeddings, ``A(i)`` every other item, ``P(i)`` those of ``i``'s class; Eq. 2 sums it over the anchors ``i``,
    PML's ``SupConLoss`` averages."""
    return PMLLoss([pml().SupConLoss(temperature=temperature)])


@register("normalized_softmax", data=PROXIES)
def normalized_softmax(num_classes: int, embedding_dim: int, temperature: float = 0.05) -> PMLLoss:
    """NSM (Zhai & Wu 2018): softmax over cosine similarities to class proxies / temperature."""
    return proxy_losses(pml().NormalizedSoftmaxLoss, [num_classes], embedding_dim, False, None,
                        temperature=temperature)


@register("sum_nsm", data=PER_LEVEL_PROXIES)
def sum_nsm(num_classes: Sequence[int], embedding_dim: int, temperature: float = 0.05,
            weights: Sequence[float] | None = None) -> PMLLoss:
    """ΣNSM (TPAMI Table V): one NSM per label level (``num_classes[l]`` proxies), summed."""
    return proxy_losses(pml().NormalizedSoftmaxLoss, num_classes, embedding_dim, True, weights,
                        temperature=temperature)


@register("proxy_nca", data=PROXIES)
def proxy_nca(num_classes: int, embedding_dim: int, softmax_scale: float = 1.0) -> PMLLoss:
    """ProxyNCA as in PML: ``-log softmax(-softmax_scale * ||x - p||^2)`` of the class proxy."""
    return proxy_losses(pml().ProxyNCALoss, [num_classes], embedding_dim, False, None, softmax_scale=softmax_scale)


@register("proxy_nca_pp", data=PROXIES)
def proxy_nca_pp(num_classes: int, embedding_dim: int, temperature: float = 1 / 9) -> PMLLoss:
    """ProxyNCA++ loss (Teh et al. 2020, temperature T = 1/9): PML ProxyNCA with scale 1/T."""
    return proxy_losses(pml().ProxyNCALoss, [num_classes], embedding_dim, False, None,
                        softmax_scale=1.0 / temperature)


@register("sum_proxy_nca_pp", data=PER_LEVEL_PROXIES)
def sum_proxy_nca_pp(num_classes: Sequence[int], embedding_dim: int, temperature: float = 1 / 9,
                     weights: Sequence[float] | None = None) -> PMLLoss:
    """ΣNCA++ (TPAMI Table V): one ProxyNCA++ per label level, summed."""
    return proxy_losses(pml().ProxyNCALoss, num_classes, embedding_dim, True, weights,
                        softmax_scale=1.0 / temperature)
