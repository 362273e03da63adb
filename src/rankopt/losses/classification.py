"""Classification losses with class weights, through pytorch-metric-learning (PML), and their initialisation.

Each is a :class:`~rankopt.losses.baselines.PMLLoss` around PML's class (no second implementation) with the
paper's hyper-parameters (PML's defaults). ``cos θ_j`` is the cosine between the embedding ``x`` and the weight
``W_j`` of class ``j``, ``y`` the class of ``x``:

* ArcFace (Deng et al. CVPR 2019, Eq. 3):
  ``-log( e^{s cos(θ_y + m)} / (e^{s cos(θ_y + m)} + Σ_{j≠y} e^{s cos θ_j}) )``, ``s = 64``, ``m = 0.5`` rad
  (PML takes ``margin`` in degrees: 28.6).
* Sub-center ArcFace (Deng et al. ECCV 2020): ArcFace with ``K = 3`` weights per class and
  ``cos θ_j = max_k cos θ_{j,k}``.
* CosFace (Wang et al. CVPR 2018):
  ``-log( e^{s (cos θ_y - m)} / (e^{s (cos θ_y - m)} + Σ_{j≠y} e^{s cos θ_j}) )``, ``s = 64``, ``m = 0.35``.
* Proxy-Anchor (Kim et al. CVPR 2020, Eq. 4), proxies ``p`` and cosine ``s(x, p)``:
  ``1/|P+| Σ_{p∈P+} log(1 + Σ_{x∈X_p+} e^{-α(s(x,p) - δ)}) + 1/|P| Σ_{p∈P} log(1 + Σ_{x∈X_p-} e^{α(s(x,p) + δ)})``,
  ``α = 32``, ``δ = 0.1``.

Optimizer (``paper_lr_mult``): the papers train the class weights with the model's optimizer, ArcFace and CosFace
as the network's last layer (the same learning rate, ×1), Proxy-Anchor its proxies at 100 times the network's.

Initialisation: PML's random weights (the papers'), or :func:`init_class_means` (``loss.init=class_means``):
each class's weight set to the normalised mean of the normalised embeddings of its training images, so a
pretrained backbone starts with weights that already point at its classes.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from rankopt.losses.baselines import PMLLoss, pml, proxy_losses
from rankopt.losses.proxy import ProxyDGLoss
from rankopt.losses.registry import PROXIES, register

ROW_WEIGHTS = ("proxies",)
"""Class weights stored as rows, ``(C·K, D)``: PML's ProxyAnchor/ProxyNCA, rankopt's ProxyDG."""
COLUMN_WEIGHTS = ("W", "fc", "weight")
"""Class weights stored as columns, ``(D, C·K)``: PML's LargeMarginSoftmax family (ArcFace, CosFace, ...),
NormalizedSoftmax, SoftTriple, P2SGrad. Class ``c`` owns columns (rows) ``c·K .. c·K + K - 1``."""


@register("arcface", data=PROXIES)
def arcface(num_classes: int, embedding_dim: int, margin: float = 28.6, scale: float = 64.0) -> PMLLoss:
    """ArcFace (Deng et al. CVPR 2019, Eq. 3): additive angular margin ``margin`` (degrees), scale ``scale``."""
    return proxy_losses(pml().ArcFaceLoss, [num_classes], embedding_dim, False, None, 1.0,
                        margin=margin, scale=scale)


@register("subcenter_arcface", data=PROXIES)
def subcenter_arcface(num_classes: int, embedding_dim: int, margin: float = 28.6, scale: float = 64.0,
                      sub_centers: int = 3) -> PMLLoss:
    """Sub-center ArcFace (Deng et al. ECCV 2020): ArcFace over the nearest of ``sub_centers`` weights per class."""
    return proxy_losses(pml().SubCenterArcFaceLoss, [num_classes], embedding_dim, False, None, 1.0,
                        margin=margin, scale=scale, sub_centers=sub_centers)


@register("cosface", data=PROXIES)
def cosface(num_classes: int, embedding_dim: int, margin: float = 0.35, scale: float = 64.0) -> PMLLoss:
    """CosFace (Wang et al. CVPR 2018): additive cosine margin ``margin``, scale ``scale``."""
    return proxy_losses(pml().CosFaceLoss, [num_classes], embedding_dim, False, None, 1.0,
                        margin=margin, scale=scale)


@register("proxy_anchor", data=PROXIES)
def proxy_anchor(num_classes: int, embedding_dim: int, margin: float = 0.1, alpha: float = 32.0) -> PMLLoss:
    """Proxy-Anchor (Kim et al. CVPR 2020, Eq. 4): margin δ, scale α; proxies at 100 times the model's lr."""
    return proxy_losses(pml().ProxyAnchorLoss, [num_classes], embedding_dim, False, None, 100.0,
                        margin=margin, alpha=alpha)


def class_weights(loss: nn.Module) -> Iterator[tuple[nn.Parameter, bool, int, int]]:
    """Every set of class weights in ``loss`` (a sum or combination included) as ``(weights, as_rows,
    num_classes, label_column)``: ``as_rows`` for ``(C·K, D)`` storage, else ``(D, C·K)``; ``label_column``
    the label level its classes index (per-level proxies of the Σ-over-levels losses), else 0."""
    for module in loss.modules():
        if isinstance(module, ProxyDGLoss):
            yield module.proxies, True, module.proxies.shape[0], 0
        if not isinstance(module, PMLLoss) or module.num_classes is None:
            continue
        per_level = module.hierarchical and len(module.losses) > 1
        for index, (inner, count) in enumerate(zip(module.losses, module.num_classes)):
            for name, weights in inner.named_parameters(recurse=False):
                if name in ROW_WEIGHTS or name in COLUMN_WEIGHTS:
                    yield weights, name in ROW_WEIGHTS, count, index if per_level else 0


@torch.no_grad()
def init_class_means(loss: nn.Module, embeddings: torch.Tensor, labels: torch.Tensor) -> int:
    """Set the class weights of ``loss`` (:func:`class_weights`) from ``(N, D)`` embeddings and their ``(N,)`` or
    ``(N, L)`` labels: class ``c``'s weight becomes ``normalize(mean_{i: y_i = c} normalize(x_i))``. With ``K``
    weights per class (Sub-center ArcFace, SoftTriple) the first takes the mean and the others keep their random
    start (equal ones would stay equal: the max or softmax over them would split no gradient); classes without an
    embedding keep theirs. Returns the number of weight tensors set; ``ValueError`` when the loss has none."""
    labels = labels.reshape(labels.shape[0], -1)
    found = list(class_weights(loss))
    if not found:
        raise ValueError(f"loss.init=class_means: {type(loss).__name__} has no class weights (proxies) to initialise")
    x = F.normalize(embeddings.float(), dim=1)
    for weights, as_rows, num_classes, column in found:
        per_class, rest = divmod(weights.shape[0] if as_rows else weights.shape[1], num_classes)
        dim = weights.shape[1] if as_rows else weights.shape[0]
        if rest or dim != x.shape[1]:
            raise ValueError(f"class weights of shape {tuple(weights.shape)} do not fit {num_classes} classes of "
                             f"{x.shape[1]}-d embeddings")
        y = labels[:, column].to(x.device)
        sums = x.new_zeros(num_classes, dim).index_add_(0, y, x)
        present = torch.bincount(y, minlength=num_classes) > 0
        rows = (torch.arange(num_classes, device=x.device)[present] * per_class).to(weights.device)
        means = F.normalize(sums[present], dim=1).to(weights)
        if as_rows:
            weights[rows] = means
        else:
            weights[:, rows] = means.T
    return len(found)
