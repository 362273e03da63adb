"""Retrieval models: backbones (``BACKBONES``), pooling, :class:`RetrievalNet` and :func:`create_model`."""

from rankopt.models.backbones import BACKBONES, build_backbone
from rankopt.models.batchnorm import freeze_batchnorm_statistics
from rankopt.models.pooling import GeM, build_pooling
from rankopt.models.retrieval_net import RetrievalNet, create_model

__all__ = [
    "BACKBONES",
    "GeM",
    "RetrievalNet",
    "build_backbone",
    "build_pooling",
    "create_model",
    "freeze_batchnorm_statistics",
]
