"""Any timm model as a backbone, by name (``create_model("timm:convnext_tiny")``), imported lazily.

Its input convention and licence come from timm's ``pretrained_cfg`` for the name (:meth:`TimmBackbone.
input_convention`); ``rankopt fit`` can cut it into stages where its features are its top-level modules run in turn
(timm's CNNs: ResNet, ConvNeXt, EfficientNet, RegNet, ...; checked on one image, :meth:`TimmBackbone.stages`), not a
ViT (DINOv2 included), whose output is a token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from rankopt.models.backbones.pretrained import (
    HubInput,
    hub_cache,
    hub_unreachable,
    import_timm,
    load_pretrained,
)

TIMM_MEAN = (0.485, 0.456, 0.406)  # timm's defaults where a pretrained_cfg names none (ImageNet's)
TIMM_STD = (0.229, 0.224, 0.225)
CUT_SUPPORTED = ("mobilenet_v2, efficientnet_lite0/2, mobilefacenet, resnet18/34/50/101 and timm CNNs whose features "
                 "are their modules run in turn (e.g. timm:resnet50, timm:convnext_tiny, timm:efficientnet_b0)")
"""The backbones ``rankopt fit`` can cut into a fixed trunk and a trained tail."""


def not_cuttable(backbone: str, why: str) -> ValueError:
    """The error of ``rankopt fit`` for a backbone it cannot cut into stages, ``why``, naming what it can cut."""
    return ValueError(f"rankopt fit cannot fine-tune {backbone}: {why}, and fit trains the last stages of a network "
                      f"cut at a stage boundary, which it can do for {CUT_SUPPORTED}; to search with {backbone}'s "
                      f"features as they are: `rankopt weights fetch {backbone}`, then `rankopt index CHECKPOINT "
                      "--images PHOTOS --out INDEX`")


class TimmBackbone(nn.Module):
    """``timm.create_model(name, num_classes=0)``; outputs its feature map (CNNs) or pre-logits token (ViTs)."""

    def __init__(self, name: str, pretrained: bool = False, pretrained_path: str | Path | None = None,
                 **kwargs: Any) -> None:
        super().__init__()
        timm = import_timm(f"backbone 'timm:{name}'", weights_file=False)
        self.timm_name = name
        if pretrained_path is not None:
            kwargs["pretrained_cfg_overlay"] = {"file": str(pretrained_path)}
        try:
            self.model = timm.create_model(name, pretrained=pretrained, num_classes=0, **kwargs)
        except Exception as err:
            hub = pretrained and pretrained_path is None
            unreachable = hub_unreachable(f"timm:{name}", err, hub_cache()) if hub else None
            if unreachable is not None:
                raise unreachable from err
            raise
        self.num_features = int(self.model.num_features)
        self._stages: list[nn.Module] | None = None

    def forward(self, x: Tensor) -> Tensor:
        features = self.model.forward_features(x)
        if features.ndim == 3:  # tokens: let timm pick its pooled token (CLS for ViTs)
            return self.model.forward_head(features, pre_logits=True)
        return features

    def load_file(self, path: str | Path) -> None:
        """Weights from a same-architecture state dict file (timm's key names; safetensors or a weights-only torch
        file, so no pickled code runs; classifier keys dropped)."""
        load_pretrained(self.model, None, path)

    def input_convention(self) -> HubInput:
        """The input convention and licence of timm's ``pretrained_cfg`` for this model (its defaults where a key
        is absent; licence "unknown"); weights on the Hugging Face hub are cached there, others in torch.hub's."""
        cfg = dict(getattr(self.model, "pretrained_cfg", None) or {})
        height, width = (int(v) for v in tuple(cfg.get("input_size") or (3, 224, 224))[-2:])
        return HubInput(mean=tuple(float(v) for v in cfg.get("mean") or TIMM_MEAN),
                        std=tuple(float(v) for v in cfg.get("std") or TIMM_STD), size=(height, width),
                        crop_pct=float(cfg.get("crop_pct") or 0.875),
                        interpolation=str(cfg.get("interpolation") or "bicubic"),
                        licence=str(cfg.get("license") or "unknown"),
                        cache=hub_cache(url=not cfg.get("hf_hub_id") and bool(cfg.get("url"))))

    def stages(self) -> list[nn.Module]:
        """The model's top-level modules (an ``nn.Sequential`` opened one level) up to the one whose output is its
        feature map, checked on one image at its input size; a clear ``ValueError`` where they are not."""
        if self._stages is None:
            self._stages = self._find_stages()
        return list(self._stages)

    def _find_stages(self) -> list[nn.Module]:
        modules = [part for child in self.model.children()
                   for part in (child if type(child) is nn.Sequential else (child,))]
        modes = {m: m.training for m in self.modules()}
        self.eval()
        try:
            with torch.no_grad():
                x = torch.rand(1, 3, *self.input_convention().size, generator=torch.Generator().manual_seed(0))
                x = x.to(next(self.parameters(), x).device)
                want = self(x)
                if want.ndim != 4:
                    raise not_cuttable(f"timm:{self.timm_name}", "its output is a token, not a feature map (a ViT)")
                for count, module in enumerate(modules, 1):
                    try:
                        x = module(x)
                    except Exception:  # noqa: BLE001 - a module that is not a stage of this order
                        break
                    if count > 1 and x.shape == want.shape and torch.allclose(x, want, rtol=1e-4, atol=1e-5):
                        return modules[:count]
        finally:
            for module, mode in modes.items():
                module.training = mode
        raise not_cuttable(f"timm:{self.timm_name}", "its features are not its top-level modules run in turn")
