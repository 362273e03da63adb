"""The proxy-based decomposability loss ``L_DG^*`` (TPAMI Eq. 8; HAPPIER): normalised softmax."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from rankopt.losses.rank_loss import RankLoss, RetrievalSet, compute_dtype
from rankopt.losses.registry import PROXIES, register


@register("proxy_dg", data=PROXIES)
class ProxyDGLoss(RankLoss):
    """``L_DG^* = -log( exp(v^T p_y / eta) / sum_z exp(v^T p_z / eta) )`` (TPAMI Eq. 8), with ``v``
    and the proxies ``p_z`` L2-normalised, ``y`` the finest label (column 0), ``eta = 0.05``.

    ``proxies`` (``(num_classes, embedding_dim)``, init ``U(-1/sqrt(d), 1/sqrt(d))``) is an
    ``nn.Parameter``: the training engine puts ``loss.parameters()`` in their own optimizer
    group with the recipe's learning rate (the reference code uses Adam, lr 10). The loss is
    a classification term on the batch only (``accepts_reference = False``).
    """

    accepts_reference = False

    def __init__(self, num_classes: int, embedding_dim: int, *, temperature: float = 0.05, **kwargs) -> None:
        super().__init__(**kwargs)
        if num_classes < 1 or embedding_dim < 1:
            raise ValueError(f"need num_classes >= 1 and embedding_dim >= 1, got {num_classes}, {embedding_dim}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        bound = 1.0 / math.sqrt(embedding_dim)
        self.proxies = nn.Parameter(torch.empty(num_classes, embedding_dim).uniform_(-bound, bound))
        self.temperature = float(temperature)

    def forward(
        self,
        embeddings: torch.Tensor,
        labels: torch.Tensor,
        ref_embeddings: torch.Tensor | None = None,
        ref_labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        labels, _ = self.validate(embeddings, labels, ref_embeddings, ref_labels)
        with torch.autocast(device_type=embeddings.device.type, enabled=False):
            return self.classify(embeddings.to(compute_dtype(embeddings)), labels[:, 0])

    def compute(self, batch: RetrievalSet) -> torch.Tensor:
        """``L_DG^*`` of the batch's queries (their embeddings and finest labels; scores and reference set unused)."""
        return self.classify(batch.embeddings, batch.labels[:, 0])

    def can_share(self, owner: RankLoss, with_reference: bool) -> bool:
        """Always: only the query embeddings and their finest labels are read from the shared set."""
        return True

    def classify(self, embeddings: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Eq. 8 for compute-dtype embeddings ``(B, D)`` and finest labels ``(B,)``, checked against the proxies."""
        num_classes, dim = self.proxies.shape
        if embeddings.shape[1] != dim:
            raise ValueError(f"embeddings have dimension {embeddings.shape[1]} but the proxies have {dim}")
        bad = (target < 0) | (target >= num_classes)
        if bool(bad.any()):
            raise ValueError(f"labels must be class indices in [0, {num_classes}); rows "
                             f"{bad.nonzero().flatten()[:5].tolist()} are not")
        logits = F.normalize(embeddings, dim=1) @ F.normalize(self.proxies.to(embeddings.dtype), dim=1).T
        self.last_num_queries_without_positive = 0
        return F.cross_entropy(logits / self.temperature, target)

    def extra_repr(self) -> str:
        return (f"num_classes={self.proxies.shape[0]}, embedding_dim={self.proxies.shape[1]}, "
                f"temperature={self.temperature}")
