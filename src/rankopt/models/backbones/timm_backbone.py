"""Any timm model as a backbone, by name (``create_model("timm:convnext_tiny")``), imported lazily."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor, nn

from rankopt.models.backbones.pretrained import import_timm


class TimmBackbone(nn.Module):
    """``timm.create_model(name, num_classes=0)``; outputs its feature map (CNNs) or pre-logits token (ViTs)."""

    def __init__(self, name: str, pretrained: bool = False, pretrained_path: str | Path | None = None,
                 **kwargs: Any) -> None:
        super().__init__()
        timm = import_timm(f"backbone 'timm:{name}'")
        if pretrained_path is not None:
            kwargs["pretrained_cfg_overlay"] = {"file": str(pretrained_path)}
        self.model = timm.create_model(name, pretrained=pretrained, num_classes=0, **kwargs)
        self.num_features = int(self.model.num_features)

    def forward(self, x: Tensor) -> Tensor:
        features = self.model.forward_features(x)
        if features.ndim == 3:  # tokens: let timm pick its pooled token (CLS for ViTs)
            return self.model.forward_head(features, pre_logits=True)
        return features
