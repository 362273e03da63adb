"""From a config to objects: device, model, loss, transforms, datasets, sampler.

The training loop, inference (``rankopt evaluate`` / ``embed``), search and the
experiments all assemble their objects here, so none of them depends on
:mod:`rankopt.engine.trainer`.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from rankopt.config import ExperimentConfig, apply_overrides
from rankopt.data import build_batch_sampler, build_dataset, evaluation_splits
from rankopt.data.splits import carve_validation
from rankopt.data.transforms import build_transform
from rankopt.engine import checkpoint as ckpt
from rankopt.models import create_model


def resolve_device(spec: str, local_rank: int = 0) -> torch.device:
    """``"auto"``: this rank's CUDA device when available, else the CPU."""
    if spec == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(spec)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"train.device={spec!r} but CUDA is not available")
    return device


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


ARCHITECTURE_KEYS = ("backbone", "pooling", "gem_p", "gem_learnable", "layer_norm", "embedding_dim", "kwargs")
"""The ``model`` settings that shape its weights: taken from the checkpoint named by ``model.init``."""


def build_model(cfg: ExperimentConfig) -> nn.Module:
    """``rankopt.models.create_model`` from ``cfg.model``; with ``model.init`` the checkpoint's weights are loaded
    (the architecture must already be the checkpoint's: :func:`adopt_init_model`)."""
    m = cfg.model
    model = create_model(m.backbone, pretrained=m.pretrained, pooling=m.pooling, gem_p=m.gem_p,
                         gem_learnable=m.gem_learnable, layer_norm=m.layer_norm, embedding_dim=m.embedding_dim,
                         freeze_bn=m.freeze_bn, freeze=m.freeze, **m.kwargs)
    if m.init is not None:
        state = _model_state(m.init)
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as err:
            raise ValueError(f"model.init={m.init!r}: its weights do not fit model {m.backbone!r} "
                             f"({str(err).splitlines()[0]}); run the config through adopt_init_model") from None
    return model


def _model_state(path: str | Path, device: torch.device | str = "cpu") -> dict[str, Any]:
    state = ckpt.load_checkpoint(path, map_location=device)
    if "model" not in state or "config" not in state:
        raise ValueError(f"{str(path)!r} is not a rankopt checkpoint (no 'model'/'config' entry): released weights "
                         "become one with `rankopt convert BACKBONE WEIGHTS --out MODEL.ckpt`")
    return state


def adopt_init_model(cfg: ExperimentConfig) -> tuple[ExperimentConfig, list[str]]:
    """``cfg`` with the model architecture (:data:`ARCHITECTURE_KEYS`) of the ``model.init`` checkpoint, and notes
    on what changed (the run's other model settings, e.g. ``freeze``/``freeze_bn``, are kept; weights are loaded
    by :func:`build_model`). Without ``model.init``: ``cfg`` unchanged."""
    if cfg.model.init is None:
        return cfg, []
    source = apply_overrides(_model_state(cfg.model.init)["config"])
    kept = {k: getattr(source.model, k) for k in ARCHITECTURE_KEYS}
    kept["kwargs"] = {k: v for k, v in source.model.kwargs.items() if k != "pretrained_path"}
    notes = [f"model.{k}: {getattr(cfg.model, k)!r} -> {v!r}" for k, v in kept.items() if getattr(cfg.model, k) != v]
    test_inputs = (source.data.test_transform, source.data.image_size)
    if (cfg.data.test_transform, cfg.data.image_size) != test_inputs:
        notes.append(f"note: this run's test transform {cfg.data.test_transform!r} (image_size "
                     f"{cfg.data.image_size}) differs from the init checkpoint's {test_inputs[0]!r} (image_size "
                     f"{test_inputs[1]}); its weights expect that preset's input convention")
    model = dataclasses.replace(cfg.model, pretrained=False, **kept)
    return dataclasses.replace(cfg, model=model), notes


def model_from_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> tuple[nn.Module, ExperimentConfig]:
    """The model of a rankopt checkpoint (training or ``rankopt convert``; weights-only loading, no download) in
    eval mode, and its config."""
    state = _model_state(path, device)
    cfg = apply_overrides(state["config"])
    kwargs = {k: v for k, v in cfg.model.kwargs.items() if k != "pretrained_path"}  # the weights are here
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, pretrained=False, init=None, kwargs=kwargs))
    model = build_model(cfg)
    model.load_state_dict(state["model"])
    return model.to(device).eval(), cfg


def build_loss(cfg: ExperimentConfig, *, class_counts: list[int], embedding_dim: int) -> nn.Module:
    """``rankopt.losses.build(cfg.loss.name, **cfg.loss.kwargs)``, or the sum of ``cfg.loss``'s terms
    (``rankopt.losses.loss_terms``).

    Losses with proxies or class weights (``proxy_dg``, ``rod_*``, ``happier``, ``normalized_softmax``, ``arcface``,
    ``pml:<ClassName>``, ...), each term of a sum alike, get the data arguments they declare
    (``rankopt.losses.data_arguments``) from the data and the model unless given: ``class_counts`` holds the number
    of classes of each label column (finest first).
    """
    from rankopt import losses  # PML etc.: a slow import, spared to search and serve (they import this module alone)

    sources = {"classes": class_counts[0], "classes_per_level": list(class_counts), "embedding_dim": embedding_dim}
    terms = losses.loss_terms(cfg.loss.name, cfg.loss.kwargs, [dataclasses.asdict(t) for t in cfg.loss.terms])
    filled = [dataclasses.replace(t, kwargs={arg: sources[source] for arg, source in
                                             losses.data_arguments(t.name).items()} | dict(t.kwargs))
              for t in terms]
    return losses.build_terms(filled)


def build_transforms(cfg: ExperimentConfig) -> tuple[Any, Any]:
    """The (train, test) transforms of ``cfg.data`` (``rankopt.data.transforms.build_transform``)."""
    d = cfg.data
    return build_transform(d.train_transform, d.image_size), build_transform(d.test_transform, d.image_size)


def build_datasets(cfg: ExperimentConfig, *, train: bool = True) -> tuple[Dataset | None, dict[str, Dataset]]:
    """The training dataset (when ``train``) and the evaluation splits (ordered), with their transforms.

    With ``data.validation_fraction > 0`` the training split is divided class-disjointly
    (``rankopt.data.splits.carve_validation``) and the held-out part is the only evaluation split.

    With ``data.batch_transform`` the datasets decode only; the trainer transforms whole batches.
    ``data.eval_splits``: ``None`` for the evaluation dataset's own splits, ``[]`` for none.
    """
    d = cfg.data
    train_tf, test_tf = (None, None) if d.batch_transform else build_transforms(cfg)
    if d.validation_fraction > 0:
        carve = {"fraction": d.validation_fraction, "level": d.validation_level, "seed": d.validation_seed}
        full = build_dataset(d.name, d.root, d.train_split, **d.kwargs)
        train_part, validation = carve_validation(full, **carve)
        train_part.transform, validation.transform = train_tf, test_tf
        return (train_part if train else None), {"validation": validation}
    train_ds = build_dataset(d.name, d.root, d.train_split, transform=train_tf, **d.kwargs) if train else None
    same = d.eval_name is None or d.eval_name == d.name
    name, root, kwargs = (d.name, d.eval_root or d.root, d.kwargs) if same else (d.eval_name, d.eval_root, {})
    splits = d.eval_splits if d.eval_splits is not None else list(evaluation_splits(name, root, **kwargs))
    evals = {s: build_dataset(name, root, s, transform=test_tf, **kwargs) for s in splits}
    return train_ds, evals


def build_sampler(cfg: ExperimentConfig, labels: np.ndarray, *, rank: int = 0, world_size: int = 1) -> Any:
    """``rankopt.data.build_batch_sampler`` from ``cfg.train`` (the batch size is the global one)."""
    t = cfg.train
    return build_batch_sampler(t.sampler, labels, batch_size=t.batch_size, m=t.m, seed=t.seed,
                               rank=rank, world_size=world_size, **t.sampler_kwargs)


def inference_preprocessing(cfg: ExperimentConfig) -> dict[str, Any]:
    """The settings besides the weights that shape a checkpoint's test embeddings (for
    :func:`rankopt.models.fingerprint.model_fingerprint`): test transform preset and image size."""
    return {"transform": cfg.data.test_transform, "image_size": cfg.data.image_size}
