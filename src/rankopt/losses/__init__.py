"""rankopt losses: every rank surrogate of the papers as ``nn.Module``s.

``loss(embeddings, labels, ref_embeddings=None, ref_labels=None) -> scalar``;
``build(name, **kwargs)`` for every registered name (``LOSSES.names()``).
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from rankopt.losses.base import RankLoss, RetrievalSet, rowwise
from rankopt.losses.baselines import PMLLoss
from rankopt.losses.blackbox_ap import BlackBoxAPLoss
from rankopt.losses.calibration import CalibrationLoss
from rankopt.losses.combination import ROD
from rankopt.losses.hap import HAPLoss
from rankopt.losses.histogram_ap import FastAPLoss, SoftBinAPLoss
from rankopt.losses.ndcg import SupNDCGLoss
from rankopt.losses.proxy import ProxyDGLoss
from rankopt.losses.recall import SmoothRecallLoss, SupRecallLoss
from rankopt.losses.registry import LOSSES
from rankopt.losses.smooth_ap import SmoothAPLoss
from rankopt.losses.sup_ap import SupAPLoss, SupRankLoss


def build(name: str, /, **kwargs: Any) -> nn.Module:
    """Build a registered loss by name, e.g. ``build("sup_ap", tau=0.01)``."""
    return LOSSES.build(name, **kwargs)


def data_arguments(name: str) -> dict[str, str]:
    """The constructor arguments of loss ``name`` that come from the data and the model (proxy losses),
    each mapped to its source: ``"classes"`` (number of finest-level classes), ``"classes_per_level"``
    (one count per label column, for the Σ-over-levels losses) or ``"embedding_dim"``.

    A factory may declare them as a ``data_arguments`` attribute; otherwise they are read from its signature.
    """
    factory = LOSSES.get(name)
    declared = getattr(factory, "data_arguments", None)
    if declared is not None:
        return dict(declared)
    params = inspect.signature(factory).parameters
    return {arg: source for arg, source in (("num_classes", "classes"), ("embedding_dim", "embedding_dim")) if arg in params}


__all__ = [
    "LOSSES",
    "ROD",
    "BlackBoxAPLoss",
    "CalibrationLoss",
    "FastAPLoss",
    "HAPLoss",
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
    "data_arguments",
    "rowwise",
]
