"""Optimizers with parameter groups, and learning-rate schedules with warm-up."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch
from torch.optim.lr_scheduler import LambdaLR

from rankopt.config import ExperimentConfig, OptimConfig, OptimizerConfig, ScheduleConfig


def build_optimizer(params: Iterable[torch.nn.Parameter] | list[dict], cfg: OptimizerConfig) -> torch.optim.Optimizer:
    """``adam`` / ``adamw`` / ``sgd`` over ``params`` (tensors or parameter groups) with ``cfg``'s hyper-parameters.
    Adam and AdamW over CPU parameters take torch's fused kernel: one pass for all tensors instead of a loop over
    them (measured: benchmarks/results/train.md), the same update up to float rounding."""
    params = list(params)
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                               nesterov=cfg.nesterov)
    optimizers = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}
    if cfg.name not in optimizers:
        raise ValueError(f"unknown optimizer {cfg.name!r}; use adam, adamw or sgd")
    betas = (float(cfg.betas[0]), float(cfg.betas[1]))
    tensors = [t for group in params for t in (group["params"] if isinstance(group, dict) else [group])]
    fused = bool(tensors) and all(t.device.type == "cpu" and t.is_floating_point() for t in tensors)
    return optimizers[cfg.name](params, lr=cfg.lr, betas=betas, weight_decay=cfg.weight_decay, fused=fused or None)


def model_param_groups(backbone: Iterable[torch.nn.Parameter], head: Iterable[torch.nn.Parameter],
                       cfg: OptimConfig) -> list[dict]:
    """Two groups: ``backbone`` at ``cfg.lr`` and ``head`` at ``cfg.lr * cfg.head_lr_mult`` (frozen parameters
    skipped)."""
    groups = [
        {"name": "backbone", "params": [p for p in backbone if p.requires_grad], "lr": cfg.lr},
        {"name": "head", "params": [p for p in head if p.requires_grad], "lr": cfg.lr * cfg.head_lr_mult},
    ]
    return [g for g in groups if g["params"]]


def loss_param_groups(loss: torch.nn.Module, cfg: OptimConfig) -> tuple[list[dict], list[torch.nn.Parameter]]:
    """The loss's trainable parameters split into groups for the model's optimizer (``loss_weights``, at
    ``cfg.lr`` × multiplier; one group per multiplier, ``loss_weights_x<mult>`` when several) and the parameters
    of their own optimizer (``cfg.loss_params``), following ``cfg.loss_params.with_model`` and ``lr_mult``
    (:class:`~rankopt.config.LossParamsOptimConfig`). A module's ``paper_lr_mult`` (the classification losses')
    is its paper's multiplier; its parameters are its own and its sub-modules'."""
    lp = cfg.loss_params
    paper: dict[torch.nn.Parameter, float] = {}
    for module in loss.modules():
        mult = getattr(module, "paper_lr_mult", None)
        if mult is not None:
            paper.update((p, float(mult)) for p in module.parameters())
    by_mult: dict[float, list[torch.nn.Parameter]] = {}
    own = []
    for p in (p for p in loss.parameters() if p.requires_grad):
        if lp.with_model is False or (lp.with_model is None and p not in paper):
            own.append(p)
        else:
            by_mult.setdefault(lp.lr_mult if lp.lr_mult is not None else paper.get(p, 1.0), []).append(p)
    named = len(by_mult) > 1
    groups = [{"name": f"loss_weights_x{mult:g}" if named else "loss_weights", "params": params, "lr": cfg.lr * mult}
              for mult, params in by_mult.items()]
    return groups, own


def lr_factor(cfg: ScheduleConfig, t: int, total: int) -> float:
    """Multiplier of the base learning rate after ``t`` scheduler steps out of ``total``.

    Linear warm-up ``(t + 1) / warmup`` for ``t < warmup``; then ``constant`` (1),
    ``multistep`` (``gamma ** #{milestones <= t}``) or ``cosine`` from 1 down to
    ``min_lr_ratio`` over the remaining ``total - warmup`` steps.
    """
    if t < cfg.warmup:
        return (t + 1) / cfg.warmup
    if cfg.name == "constant":
        return 1.0
    if cfg.name == "multistep":
        return cfg.gamma ** sum(t >= m for m in cfg.milestones)
    progress = min((t - cfg.warmup) / max(total - cfg.warmup, 1), 1.0)
    if cfg.name == "cosine":
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if cfg.name == "linear":
        return 1.0 - (1.0 - cfg.min_lr_ratio) * progress
    raise ValueError(f"unknown schedule {cfg.name!r}; use constant, multistep, cosine or linear")


def lr_beyond(lrs: Sequence[float], best: float) -> float | None:
    """The learning rate to try next when ``best`` is an end of the grid ``lrs``: one grid step beyond it (the
    ratio of the two values nearest that end; ×10 for a grid of one), to 3 significant digits; ``None`` when
    ``best`` lies inside the grid (the choice is bracketed)."""
    grid = sorted(lrs)
    if best not in (grid[0], grid[-1]) or (len(grid) > 1 and grid[0] == grid[-1]):
        return None
    if best == grid[-1]:
        return float(f"{best * (grid[-1] / grid[-2] if len(grid) > 1 else 10.0):.3g}")
    return float(f"{best / (grid[1] / grid[0] if len(grid) > 1 else 10.0):.3g}")


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: ScheduleConfig, *, epochs: int,
                    steps_per_epoch: int) -> LambdaLR:
    """A ``LambdaLR`` following :func:`lr_factor`; step it per batch if ``cfg.interval == "step"``, else per epoch."""
    total = epochs * steps_per_epoch if cfg.interval == "step" else epochs
    return LambdaLR(optimizer, lambda t: lr_factor(cfg, t, total))


class TrainingOptimizers(NamedTuple):
    """What a training run steps: the model's optimizer and schedule, and the loss's own (``None`` without)."""

    optimizer: torch.optim.Optimizer
    scheduler: LambdaLR
    loss_optimizer: torch.optim.Optimizer | None
    loss_scheduler: LambdaLR | None


def build_training_optimizers(cfg: ExperimentConfig, model: torch.nn.Module, loss: torch.nn.Module,
                              steps_per_epoch: int) -> TrainingOptimizers:
    """The optimizers of a run: the model's (backbone and head groups, and the loss's class weights: see
    :func:`loss_param_groups`) and, where the loss has parameters of its own (proxies), theirs, each with its
    schedule over ``cfg.train.epochs`` epochs of ``steps_per_epoch`` steps."""
    o = cfg.optim
    loss_groups, own_loss_params = loss_param_groups(loss, o)
    groups = model_param_groups(model.backbone_parameters(), model.head_parameters(), o) + loss_groups
    optimizer = build_optimizer(groups, o)
    scheduler = build_scheduler(optimizer, cfg.schedule, epochs=cfg.train.epochs, steps_per_epoch=steps_per_epoch)
    if not own_loss_params:
        return TrainingOptimizers(optimizer, scheduler, None, None)
    loss_optimizer = build_optimizer(own_loss_params, o.loss_params)
    return TrainingOptimizers(optimizer, scheduler, loss_optimizer,
                              build_scheduler(loss_optimizer, o.loss_params.schedule, epochs=cfg.train.epochs,
                                              steps_per_epoch=steps_per_epoch))
