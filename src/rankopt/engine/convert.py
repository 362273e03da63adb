"""Released weights -> a rankopt model checkpoint, usable without training (``rankopt convert``).

A converted checkpoint is ``RetrievalNet(backbone with the released weights, pooling[, projection])``
plus a config whose test transform is the backbone's native input convention (size, mean/std,
colour order of the release), written by :func:`rankopt.engine.checkpoint.save_model_checkpoint`
(safetensors, weights-only). Every command that takes a checkpoint (``evaluate``, ``embed``,
``index``, ``search``, ``whiten``) reads it unchanged, and ``rankopt train ... model.init=MODEL.ckpt``
starts a new run from it. A hub backbone (``timm:NAME``, ``open_clip:MODEL/TAG``) is converted with its hub weights
or a same-architecture file, and the model's own input convention in its transform presets
(:func:`convert_hub_backbone`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from torch import nn

from rankopt.checks import canonical_image_size
from rankopt.config import ExperimentConfig, config_to_dict, load_config
from rankopt.data.transforms import PRESETS, build_transform, convention_preset
from rankopt.engine.assembly import build_model
from rankopt.engine.checkpoint import save_model_checkpoint
from rankopt.models.backbones import is_hub_backbone

NATIVE_PRESETS: dict[str, str] = {
    "mobilefacenet": "mobilefacenet",  # RGB, 112 x 96, (255 x - 127.5) / 128
    "efficientnet_lite0": "tf_lite",  # RGB, 224, (255 x - 127) / 128
    "efficientnet_lite2": "tf_lite",  # RGB, 260 (NATIVE_IMAGE_SIZES), (255 x - 127) / 128
    "iresnet50": "arcface", "iresnet100": "arcface",  # RGB, 112 x 112, (x - 0.5) / 0.5
    "senet50_256": "vggface2", "senet50_2048": "vggface2",  # RGB minus the VGGFace2 mean face, 224
}
"""Backbone -> the transform-preset family (``<family>_train``/``<family>_test``) of its released weights;
any other backbone: ImageNet's (``train``/``test``: 224 px, ImageNet mean/std, RGB)."""

NATIVE_IMAGE_SIZES: dict[str, int] = {
    "efficientnet_lite2": 260,  # efficientnet_lite_builder: (width, depth, resolution) = (1.1, 1.2, 260)
}
"""Backbone -> the image side its released weights were trained at, where it is not its preset's size; a converted
checkpoint's default ``image_size``."""


@dataclass(frozen=True)
class Converted:
    model: nn.Module
    config: ExperimentConfig
    source: dict[str, Any]


def native_presets(backbone: str) -> tuple[str, str]:
    """The (train, test) transform presets of ``backbone``'s released weights."""
    family = NATIVE_PRESETS.get(backbone)
    return (f"{family}_train", f"{family}_test") if family else ("train", "test")


def _train_preset(test_preset: str) -> str:
    """The training counterpart of a test preset (``X_test`` -> ``X_train``, ``test`` -> ``train``)."""
    candidate = "train" if test_preset == "test" else test_preset.removesuffix("test") + "train"
    return candidate if candidate in PRESETS else test_preset


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def convert_released_weights(
    backbone: str, weights: str | Path, *, transform: str | None = None, image_size: Any = None,
    embedding_dim: int | None = None, pooling: str = "avg",
) -> Converted:
    """Build ``backbone`` with the released ``weights`` (its own key layout; ``pretrained_path`` loading) and the
    config of a checkpoint that embeds with it: ``transform`` (a test preset; default the release's own),
    ``image_size`` (S or "HxW"; default the release's in :data:`NATIVE_IMAGE_SIZES`, else the preset's),
    ``embedding_dim`` (an untrained linear projection; default none: the backbone's pooled features)."""
    path = Path(weights)
    if not path.is_file():
        raise FileNotFoundError(f"weights file {str(path)!r} does not exist")
    train_preset, test_preset = native_presets(backbone)
    image_size = NATIVE_IMAGE_SIZES.get(backbone) if image_size is None else image_size
    if transform is not None:
        test_preset, train_preset = transform, _train_preset(transform)
    build_transform(test_preset, image_size)  # an unknown preset or a bad size fails here, before the model
    cfg = load_config(None, [f"name=converted-{backbone}", "data.name=image_folder", "data.batch_transform=false",
                             f"data.train_transform={train_preset}", f"data.test_transform={test_preset}",
                             f"model.backbone={backbone}", f"model.pooling={pooling}", "model.pretrained=false"])
    cfg.data.image_size = canonical_image_size(image_size)
    cfg.model.embedding_dim = embedding_dim
    cfg.description = (f"released weights {path.name} of {backbone}, converted by rankopt convert (not trained by "
                       "rankopt)")
    loading = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, pretrained=True, kwargs={**cfg.model.kwargs, "pretrained_path": str(path)}))
    model = build_model(loading).eval()
    source = {"backbone": backbone, "weights": path.name, "sha256": sha256_of(path),
              "converted_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")}
    return Converted(model, cfg, source)


def convert_hub_backbone(backbone: str, weights: str | Path | None = None, *, pooling: str = "avg") -> Converted:
    """``backbone`` (``timm:NAME``, ``open_clip:MODEL/TAG``) with its hub weights (timm or open_clip fetch them
    into their own cache) or, with ``weights``, a same-architecture state dict file (no hub contact), and the config
    of a checkpoint that embeds with the model's own input convention: its mean/std, input size and centre crop
    (bilinear resizing where the model's is another); its source names the licence and the hub's cache."""
    if not is_hub_backbone(backbone):
        raise ValueError(f"{backbone!r} is not a hub backbone (timm:NAME or open_clip:MODEL/TAG)")
    path = None if weights is None else Path(weights)
    if path is not None and not path.is_file():
        raise FileNotFoundError(f"weights file {str(path)!r} does not exist")
    cfg = load_config(None, [f"name=converted-{backbone.replace(':', '-').replace('/', '-')}",
                             "data.name=image_folder", "data.batch_transform=false", f"model.pooling={pooling}",
                             "model.pretrained=false"])
    cfg.model.backbone, cfg.model.embedding_dim = backbone, None
    model = build_model(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, pretrained=path is None)))
    if path is not None:
        model.backbone.load_file(path)  # type: ignore[operator]
    given = model.backbone.input_convention()  # type: ignore[operator]
    family = ("landmark_train", "landmark_test") if given.whole else ("train", "test")
    cfg.data.train_transform, cfg.data.test_transform = (
        convention_preset(base, mean=given.mean, std=given.std, crop_pct=given.crop_pct) for base in family)
    height, width = given.size
    cfg.data.image_size = canonical_image_size(height if height == width else f"{height}x{width}")
    build_transform(cfg.data.test_transform, cfg.data.image_size)
    cfg.description = (f"{backbone} with {'its hub weights' if path is None else f'the weights of {path.name}'}, "
                       "converted by rankopt (not trained by rankopt)")
    source = {"backbone": backbone, "weights": "the model hub" if path is None else path.name,
              **({"sha256": sha256_of(path)} if path is not None else {"hub_cache": given.cache}),
              "licence": given.licence, "interpolation": f"{given.interpolation} (rankopt resizes bilinearly)",
              "converted_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")}
    return Converted(model.eval(), cfg, source)


def write_converted(converted: Converted, out: str | Path) -> Path:
    """Write ``converted`` as a model checkpoint (atomic safetensors)."""
    return save_model_checkpoint(out, converted.model.state_dict(), config_to_dict(converted.config), converted.source)
