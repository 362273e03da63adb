"""Loading released weights (timm/torchvision, the face releases) into the built-in backbones; the lazy timm import.

Weights come from a local file (``pretrained_path=``: safetensors, or a torch
file read with ``weights_only=True`` so no pickled code runs) or, when timm is
installed, from ``timm.create_model(name, pretrained=True)``. Classifier keys
(``fc.``, ``head.``, ``head_dist.``, ``classifier.``) are dropped unless the model
has that key itself (IResNet's ``fc`` is its embedding layer); a distilled DeiT
checkpoint loses its distillation token and that token's position embedding
(anchors §5), so it loads into a plain DeiT. Every other key must match the
model's keys and shapes exactly.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor, nn

from rankopt.models.backbones.vit import VisionTransformer, resize_pos_embed

_CLASSIFIER_PREFIXES = ("fc.", "head.", "head_dist.", "classifier.")
_WRAPPER_KEYS = ("state_dict", "model", "model_state_dict")


def import_timm(what: str) -> ModuleType:
    """``import timm`` or raise an ``ImportError`` saying how to get it."""
    try:
        import timm
    except ImportError as err:  # timm missing or broken (it needs torchvision)
        raise ImportError(
            f"{what} needs timm, which is not importable here ({err}). Install it with "
            "`pip install 'rankopt[timm]'`, or pass pretrained_path=FILE with timm/torchvision "
            "weights (safetensors or a weights-only torch file)."
        ) from err
    return timm


def read_state_dict(path: str | Path) -> dict[str, Tensor]:
    """A ``state_dict`` from a safetensors file or a weights-only torch file (unwrapping ``{"state_dict": ...}``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"pretrained_path {str(path)!r} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    for key in _WRAPPER_KEYS:
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise ValueError(f"pretrained_path {str(path)!r} holds a {type(state).__name__}, not a state_dict")
    return state


def adapt_state_dict(state: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Drop classifier keys the model lacks; ViTs lose the distillation token and get ``pos_embed`` fit to their grid."""
    own = model.state_dict().keys()
    state = {k: v for k, v in state.items() if k in own or not k.startswith(_CLASSIFIER_PREFIXES)}
    if isinstance(model, VisionTransformer) and "pos_embed" in state:
        pos = state["pos_embed"]
        if state.pop("dist_token", None) is not None:
            pos = torch.cat([pos[:, :1], pos[:, 2:]], dim=1)
        side = int(round((model.pos_embed.shape[1] - 1) ** 0.5))
        state["pos_embed"] = resize_pos_embed(pos, (side, side))
    return state


def load_pretrained(model: nn.Module, timm_name: str | None, pretrained_path: str | Path | None) -> None:
    """Load weights into ``model`` from ``pretrained_path`` or, failing that, from timm's ``timm_name``."""
    if pretrained_path is not None:
        state = read_state_dict(pretrained_path)
        source = str(pretrained_path)
    elif timm_name is not None:
        timm = import_timm(f"pretrained weights for {timm_name!r}")
        state = timm.create_model(timm_name, pretrained=True).state_dict()
        source = f"timm:{timm_name}"
    else:
        raise ValueError("no timm weights for this backbone; pass pretrained_path=FILE or pretrained=False")
    state = adapt_state_dict(state, model)
    own = model.state_dict()
    reshaped = [f"{k} {tuple(v.shape)}, model {tuple(own[k].shape)}" for k, v in state.items()
                if k in own and v.shape != own[k].shape]
    if reshaped:
        raise ValueError(f"weights from {source} do not match the model's shapes: {reshaped[:5]}")
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"weights from {source} do not match the model: missing {result.missing_keys[:5]}, "
            f"unexpected {result.unexpected_keys[:5]}"
        )
