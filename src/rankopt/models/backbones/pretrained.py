"""Loading released weights (timm/torchvision, face and mobile releases) into the built-in backbones; lazy timm import;
what a hub backbone (``timm:``, ``open_clip:``) reports: its input convention, the hub's cache, an unreachable hub.

Weights come from a local file (``pretrained_path=``: safetensors, or a torch
file read with ``weights_only=True`` so no pickled code runs; a file holding
other pickled objects is refused) or, when timm is installed, from
``timm.create_model(name, pretrained=True)``. A backbone whose released file
names its tensors otherwise registers that file's :class:`ReleaseLayout`: the
layout is recognised by a key only it has and its keys are renamed to the
model's (timm's) names before loading. Classifier keys (``fc.``, ``head.``,
``head_dist.``, ``classifier.``) are dropped unless the model has that key
itself (IResNet's ``fc`` is its embedding layer); a distilled DeiT checkpoint
loses its distillation token and that token's position embedding (anchors §5),
so it loads into a plain DeiT. Every other key must match the model's keys and
shapes exactly.
"""

from __future__ import annotations

import os
import pickle
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor, nn

from rankopt.models.backbones.vit import VisionTransformer, resize_pos_embed

_CLASSIFIER_PREFIXES = ("fc.", "head.", "head_dist.", "classifier.")
_WRAPPER_KEYS = ("state_dict", "model", "model_state_dict", "net_state_dict")


@dataclass(frozen=True)
class ReleaseLayout:
    """A released file's own key names: ``marker`` is a key only that layout has; ``rename`` maps its keys to
    the model's (a key it does not know is returned unchanged, and then reported as unexpected)."""

    name: str
    marker: str
    rename: Callable[[str], str]


@dataclass(frozen=True)
class HubInput:
    """A hub model's input convention: RGB in [0, 1] normalised by ``mean``/``std`` at ``size`` (H, W), the
    centre crop keeping ``crop_pct`` of the resized shorter side (``whole``: the whole image resized to ``size``);
    its resampling ``interpolation``, ``licence`` and the folder its hub weights are cached in (``cache``)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    size: tuple[int, int]
    crop_pct: float
    interpolation: str
    licence: str
    cache: str
    whole: bool = False


class HubUnreachableError(ValueError):
    """A model hub that could not be reached for a model's weights."""


_UNREACHABLE = {"ConnectionError", "ConnectError", "ConnectTimeout", "Timeout", "TimeoutException",
                "OfflineModeIsEnabled", "LocalEntryNotFoundError"}


def hub_unreachable(model: str, err: BaseException, cache: str) -> HubUnreachableError | None:
    """The clear error for ``err``, raised while timm or open_clip fetched ``model``'s weights, when it means the
    hub could not be reached (an ``OSError`` but a permission error, or a connection or offline error of
    ``requests``, ``httpx`` or ``huggingface_hub``); ``None`` for any other error."""
    network = isinstance(err, OSError) and not isinstance(err, PermissionError)
    if not (network or any(cls.__name__ in _UNREACHABLE for cls in type(err).__mro__)):
        return None
    said = (str(err).strip().splitlines() or [""])[0][:200]
    return HubUnreachableError(
        f"the model hub could not be reached for the weights of {model} ({type(err).__name__}: {said}); run this on "
        f"a machine that reaches it (the weights are then cached in {cache}), or give a same-architecture weights "
        f"file (its state dict, .pth or .safetensors) with --weights FILE (rankopt weights fetch: --file FILE)")


def hub_cache(url: bool = False) -> str:
    """The folder hub weights are cached in: the Hugging Face hub's (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``,
    default ``~/.cache/huggingface/hub``), or with ``url`` torch.hub's (``$TORCH_HOME/hub/checkpoints``)."""
    if url:
        return str(Path(torch.hub.get_dir()) / "checkpoints")
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    home = os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache") / "huggingface"
    return str(Path(home).expanduser() / "hub")


def import_timm(what: str, weights_file: bool = True) -> ModuleType:
    """``import timm`` or raise an ``ImportError`` saying how to get it (``weights_file``: and that a weights file
    does without it)."""
    try:
        import timm  # optional dependency (the timm extra), needed only for timm's weights and timm: backbones
    except ImportError as err:  # timm missing or broken (it needs torchvision)
        alternative = (", or pass pretrained_path=FILE with timm/torchvision weights (safetensors or a weights-only "
                       "torch file)") if weights_file else ""
        raise ImportError(
            f"{what} needs timm, which is not importable here ({err}). Install it with "
            f"`pip install 'rankopt[timm]'`{alternative}."
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
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"GLOBAL ([\w.]+)", str(err))
        raise ValueError(
            f"pretrained_path {str(path)!r} holds pickled Python objects beyond tensors and plain containers"
            f"{f' ({found.group(1)})' if found else ''}; rankopt loads weights without unpickling code. If you "
            "trust the file, save its state_dict alone: torch.save(torch.load(FILE, weights_only=False)[KEY], OUT)"
        ) from None
    for key in _WRAPPER_KEYS:
        if isinstance(state, dict) and isinstance(state.get(key), dict):
            state = state[key]
    if not isinstance(state, dict):
        raise ValueError(f"pretrained_path {str(path)!r} holds a {type(state).__name__}, not a state_dict")
    return state


def convert_layout(
    state: dict[str, Tensor], layouts: Sequence[ReleaseLayout]
) -> tuple[dict[str, Tensor], dict[str, str], str | None]:
    """``state`` renamed by the first layout whose marker it holds: (renamed state, {new key: file key}, layout name);
    ``state`` unchanged (no layout) when it holds no marker."""
    layout = next((lay for lay in layouts if lay.marker in state), None)
    if layout is None:
        return state, {}, None
    new_names = {key: layout.rename(key) for key in state}
    counts = Counter(new_names.values())
    clashes = [key for key, new in new_names.items() if counts[new] > 1]
    if clashes:
        raise ValueError(f"keys {clashes[:5]} map to the same name in the {layout.name} layout")
    file_keys = {new: key for key, new in new_names.items() if new != key}
    return {new_names[key]: value for key, value in state.items()}, file_keys, layout.name


def adapt_state_dict(state: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Drop classifier keys the model lacks; ViTs lose the distillation token and get ``pos_embed`` fit to their
    grid."""
    own = model.state_dict().keys()
    state = {k: v for k, v in state.items() if k in own or not k.startswith(_CLASSIFIER_PREFIXES)}
    if isinstance(model, VisionTransformer) and "pos_embed" in state:
        pos = state["pos_embed"]
        if state.pop("dist_token", None) is not None:
            pos = torch.cat([pos[:, :1], pos[:, 2:]], dim=1)
        side = int(round((model.pos_embed.shape[1] - 1) ** 0.5))
        state["pos_embed"] = resize_pos_embed(pos, (side, side))
    return state


def load_pretrained(
    model: nn.Module,
    timm_name: str | None,
    pretrained_path: str | Path | None,
    layouts: Sequence[ReleaseLayout] = (),
) -> None:
    """Load weights into ``model`` from ``pretrained_path`` (its own names or one of ``layouts``) or timm's
    ``timm_name``."""
    if pretrained_path is not None:
        state = read_state_dict(pretrained_path)
        source = str(pretrained_path)
    elif timm_name is not None:
        timm = import_timm(f"pretrained weights for {timm_name!r}")
        state = timm.create_model(timm_name, pretrained=True).state_dict()
        source = f"timm:{timm_name}"
    else:
        raise ValueError("no timm weights for this backbone; pass pretrained_path=FILE or pretrained=False")
    state, file_keys, layout = convert_layout(state, layouts)
    if layout is not None:
        source += f" (read as the {layout} layout)"
    load_state(model, state, source, file_keys)


def load_state(model: nn.Module, state: dict[str, Tensor], source: str, file_keys: dict[str, str] | None = None
               ) -> None:
    """Load ``state`` (weights from ``source``; ``file_keys``: {model key: file key} of renamed keys) into ``model``
    after :func:`adapt_state_dict`; a ``ValueError`` naming the keys and shapes that do not match."""
    file_keys = file_keys or {}
    state = adapt_state_dict(state, model)
    own = model.state_dict()

    def named(key: str) -> str:
        return f"{key} (file: {file_keys[key]})" if key in file_keys else key

    reshaped = [f"{named(k)} {tuple(v.shape)}, model {tuple(own[k].shape)}" for k, v in state.items()
                if k in own and v.shape != own[k].shape]
    if reshaped:
        raise ValueError(f"weights from {source} do not match the model's shapes: {reshaped[:5]}")
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f"weights from {source} do not match the model: missing {result.missing_keys[:5]}, "
            f"unexpected {[named(k) for k in result.unexpected_keys[:5]]}"
        )
