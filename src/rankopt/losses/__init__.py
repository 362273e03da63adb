"""rankopt losses: every rank surrogate of the papers as ``nn.Module``s, and the baselines beside them.

``loss(embeddings, labels, ref_embeddings=None, ref_labels=None) -> scalar``;
``build(name, **kwargs)`` for every registered name (``LOSSES.names()``), ``pml:<ClassName>`` for any other
pytorch-metric-learning loss (:mod:`rankopt.losses.pml`) and sums ``a+b`` (:mod:`rankopt.losses.sums`).

In a config (``loss`` section)::

    loss.name=arcface loss.kwargs.margin=28.6              one loss, its keyword arguments
    loss.name=pml:CircleLoss loss.kwargs.m=0.25            PML's CircleLoss(m=0.25)
    loss.name=arcface+smooth_ap loss.kwargs.smooth_ap.tau=0.01
                                                           a sum, weights 1; kwargs per term, keyed by its name
    loss.name=arcface+smooth_ap loss.terms='[{name: arcface, weight: 1.0}, {name: smooth_ap, weight: 0.5,
        kwargs: {tau: 0.01}}]'                             a weighted sum; loss.name is the terms' names joined
    loss.init=class_means                                  class weights (ArcFace, CosFace, Sub-center ArcFace,
                                                           Proxy-Anchor, the proxy losses, pml: ones with
                                                           weights) from the class means of the training
                                                           embeddings before training; default: random (papers)

A ROD combination (``roadmap``, ``rod_ap``, ``happier``, ...) takes ``lam`` and one map per term keyed by the
term's name, as a sum does: ``loss.name=roadmap loss.kwargs.sup_ap.tau=0.01 loss.kwargs.calibration.alpha=0.9``
(:mod:`rankopt.losses.combination`).

``num_classes``/``embedding_dim`` come from the data and the model: each loss declares them where it is
registered (``register(name, data=PROXIES)``, read by :func:`data_arguments`). A sum logs each
term per step (``term/<name>`` columns of ``steps.csv``). The class weights of ArcFace, CosFace, Sub-center
ArcFace (×1) and Proxy-Anchor (×100) train in the model's optimizer at that multiple of its learning rate, as
their papers do; other loss parameters (proxies) in their own (``optim.loss_params``, which decides both).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from rankopt.losses.rank_loss import RankLoss, RetrievalSet, rowwise
from rankopt.losses.baselines import PMLLoss
from rankopt.losses.blackbox_ap import BlackBoxAPLoss
from rankopt.losses.calibration import CalibrationLoss
from rankopt.losses.classification import class_weights, init_class_means
from rankopt.losses.combination import ROD
from rankopt.losses.hap import HAPLoss
from rankopt.losses.histogram_ap import FastAPLoss, SoftBinAPLoss
from rankopt.losses.ndcg import SupNDCGLoss
from rankopt.losses.pml import PREFIX as PML_PREFIX
from rankopt.losses.pml import data_arguments as pml_data_arguments
from rankopt.losses.pml import pml_loss
from rankopt.losses.proxy import ProxyDGLoss
from rankopt.losses.recall import SmoothRecallLoss, SupRecallLoss
from rankopt.losses.registry import DATA_ARGUMENTS, LOSSES
from rankopt.losses.smooth_ap import SmoothAPLoss
from rankopt.losses.sup_ap import SupAPLoss, SupRankLoss
from rankopt.losses.sums import SEPARATOR, LossSum, LossTerm, loss_terms


def build(name: str, /, **kwargs: Any) -> nn.Module:
    """Build a loss by name, e.g. ``build("sup_ap", tau=0.01)``, ``build("pml:CircleLoss", m=0.25)``, or a sum
    with one kwargs map per term, ``build("arcface+smooth_ap", arcface={...}, smooth_ap={"tau": 0.01})``."""
    if SEPARATOR in name:
        return build_terms(loss_terms(name, kwargs))
    if name.startswith(PML_PREFIX):
        return pml_loss(name.removeprefix(PML_PREFIX), **kwargs)
    return LOSSES.build(name, **kwargs)


def build_terms(terms: Sequence[LossTerm]) -> nn.Module:
    """The loss of :func:`~rankopt.losses.sums.loss_terms`: a single term of weight 1 alone, else their sum."""
    if len(terms) == 1 and terms[0].weight == 1.0:
        return build(terms[0].name, **terms[0].kwargs)
    return LossSum([(t.name, t.weight, build(t.name, **t.kwargs)) for t in terms])


def data_arguments(name: str) -> dict[str, str]:
    """The constructor arguments of loss ``name`` that come from the data and the model (proxy losses),
    each mapped to its source: ``"classes"`` (number of finest-level classes), ``"classes_per_level"``
    (one count per label column, for the Σ-over-levels losses) or ``"embedding_dim"``.

    Each registered loss declares them (:func:`rankopt.losses.registry.register`); a ``pml:<ClassName>`` loss
    has those of PML's class (:func:`rankopt.losses.pml.data_arguments`).
    """
    if name.startswith(PML_PREFIX):
        return pml_data_arguments(name.removeprefix(PML_PREFIX))
    LOSSES.get(name)  # KeyError naming the known losses
    return dict(DATA_ARGUMENTS.get(name.lower(), {}))


__all__ = [
    "LOSSES",
    "ROD",
    "BlackBoxAPLoss",
    "CalibrationLoss",
    "FastAPLoss",
    "HAPLoss",
    "LossSum",
    "LossTerm",
    "PMLLoss",
    "ProxyDGLoss",
    "RankLoss",
    "RetrievalSet",
    "SmoothAPLoss",
    "SoftBinAPLoss",
    "SmoothRecallLoss",
    "SupAPLoss",
    "SupNDCGLoss",
    "SupRankLoss",
    "SupRecallLoss",
    "build",
    "build_terms",
    "class_weights",
    "data_arguments",
    "init_class_means",
    "loss_terms",
    "rowwise",
]
