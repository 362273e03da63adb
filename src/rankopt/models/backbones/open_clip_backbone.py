"""The image tower of an open_clip model as a backbone, by name (``open_clip:ViT-B-32/laion2b_s34b_b79k``: the
model, then its pretrained tag), open_clip imported lazily. Its output is the ``(B, D)`` image embedding; its input
convention comes from open_clip's preprocessing settings for the model and tag."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from torch import Tensor, nn

from rankopt.models.backbones.pretrained import (
    HubInput,
    hub_cache,
    hub_unreachable,
    load_state,
    read_state_dict,
)
from rankopt.models.backbones.timm_backbone import not_cuttable

OPEN_CLIP_PREFIX = "open_clip:"
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)  # open_clip's defaults where a model names none (OpenAI CLIP's)
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)
URL_CACHE = "~/.cache/clip"
"""Where open_clip keeps weights it downloads by URL rather than from the Hugging Face hub."""


def import_open_clip(what: str) -> ModuleType:
    """``import open_clip`` or raise an ``ImportError`` saying how to get it."""
    try:
        import open_clip  # optional dependency (the open_clip extra), needed only by open_clip: backbones
    except ImportError as err:
        raise ImportError(f"{what} needs open_clip, which is not importable here ({err}). Install it with "
                          "`pip install 'rankopt[open_clip]'`.") from err
    return open_clip


class OpenClipBackbone(nn.Module):
    """``model.visual`` of ``open_clip.create_model_and_transforms(MODEL, pretrained=TAG)`` for ``spec`` =
    ``MODEL/TAG`` (no download without ``pretrained``; ``pretrained_path``: a weights file instead of the hub)."""

    def __init__(self, spec: str, pretrained: bool = False, pretrained_path: str | Path | None = None,
                 **kwargs: Any) -> None:
        super().__init__()
        model_name, _, tag = spec.partition("/")
        if not model_name or not tag:
            raise ValueError(f"backbone 'open_clip:{spec}' must name the model and its pretrained tag, "
                             "open_clip:MODEL/TAG (e.g. open_clip:ViT-B-32/laion2b_s34b_b79k)")
        open_clip = import_open_clip(f"backbone 'open_clip:{spec}'")
        self.spec = spec
        get_cfg = getattr(open_clip, "get_pretrained_cfg", None)
        self.pretrained_cfg = dict((get_cfg(model_name, tag) if get_cfg else None) or {})
        hub = pretrained and pretrained_path is None
        try:
            model, _, _ = open_clip.create_model_and_transforms(model_name, pretrained=tag if hub else None, **kwargs)
        except Exception as err:
            unreachable = hub_unreachable(f"open_clip:{spec}", err, self._cache()) if hub else None
            if unreachable is not None:
                raise unreachable from err
            raise
        self.visual = model.visual
        self.num_features = int(self.visual.output_dim)
        if pretrained_path is not None:
            self.load_file(pretrained_path)

    def forward(self, x: Tensor) -> Tensor:
        return self.visual(x)

    def load_file(self, path: str | Path) -> None:
        """Weights from a same-architecture state dict file: the whole CLIP model's (its ``visual.`` keys are
        taken) or the image tower's; safetensors or a weights-only torch file, so no pickled code runs."""
        state = read_state_dict(path)
        if any(key.startswith("visual.") for key in state):
            state = {key.removeprefix("visual."): value for key, value in state.items() if key.startswith("visual.")}
        load_state(self.visual, state, str(path))

    def input_convention(self) -> HubInput:
        """The input convention of open_clip's preprocessing settings for the model and tag (``shortest``: the
        shorter side resized and the centre kept, ``squash``: the whole image resized); the licence is the model
        card's."""
        cfg = dict(getattr(self.visual, "preprocess_cfg", None) or {})
        cfg.update({k: v for k, v in self.pretrained_cfg.items()
                    if k in ("mean", "std", "interpolation", "resize_mode") and v is not None})
        size = cfg.get("size") or getattr(self.visual, "image_size", None) or 224
        height, width = (size, size) if isinstance(size, int) else (int(v) for v in size)
        hf_hub = str(self.pretrained_cfg.get("hf_hub") or "").strip("/")
        return HubInput(mean=tuple(float(v) for v in cfg.get("mean") or OPENAI_MEAN),
                        std=tuple(float(v) for v in cfg.get("std") or OPENAI_STD), size=(height, width),
                        crop_pct=1.0, interpolation=str(cfg.get("interpolation") or "bicubic"),
                        licence="see the model card" + (f" (https://huggingface.co/{hf_hub})" if hf_hub else ""),
                        cache=self._cache(), whole=cfg.get("resize_mode") == "squash")

    def stages(self) -> list[nn.Module]:
        """None to cut: a clear ``ValueError`` for ``rankopt fit``."""
        raise not_cuttable(f"open_clip:{self.spec}", "its image tower is one module, not stages run in turn")

    def _cache(self) -> str:
        return hub_cache() if self.pretrained_cfg.get("hf_hub") or not self.pretrained_cfg.get("url") else URL_CACHE
