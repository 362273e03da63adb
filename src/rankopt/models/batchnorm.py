"""Frozen BatchNorm statistics, as in every reference retrieval config.

Frozen BN layers stay in eval mode (they normalise with their running
statistics and never update them) while their affine ``gamma``/``beta`` remain
trainable. :class:`~rankopt.models.RetrievalNet` re-applies the freeze in its
``train()`` override, so it survives ``model.train()``, DDP wrapping (DDP's
``train()`` recurses into the wrapped module) and
``torch.nn.SyncBatchNorm.convert_sync_batchnorm`` (``SyncBatchNorm`` is a
``_BatchNorm`` and is found at call time, unlike a freeze applied once to the
original ``BatchNorm2d`` objects, anchors §5).
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def batchnorm_layers(module: nn.Module) -> list[_BatchNorm]:
    """Every BatchNorm layer (1d/2d/3d, SyncBatchNorm, timm subclasses) inside ``module``."""
    return [m for m in module.modules() if isinstance(m, _BatchNorm)]


def freeze_batchnorm_statistics(module: nn.Module) -> int:
    """Put every BatchNorm layer of ``module`` in eval mode; returns how many were frozen."""
    layers = batchnorm_layers(module)
    for layer in layers:
        layer.eval()
    return len(layers)
