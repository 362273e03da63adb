"""Optimizers, parameter groups and learning-rate schedules (rankopt.engine.optim)."""

from __future__ import annotations

import math

import pytest
import torch

from rankopt.config import OptimConfig, OptimizerConfig, ScheduleConfig
from rankopt.engine.optim import build_optimizer, build_scheduler, lr_factor, model_param_groups


def _reference_factor(name, t, total, warmup=0, milestones=(), gamma=0.1, floor=0.0):
    """Written from the definitions: linear warm-up, then multistep / cosine / linear decay."""
    if t < warmup:
        return (t + 1) / warmup
    if name == "constant":
        return 1.0
    if name == "multistep":
        factor = 1.0
        for m in milestones:
            if t >= m:
                factor *= gamma
        return factor
    p = min((t - warmup) / (total - warmup), 1.0)
    if name == "cosine":
        return floor + (1 - floor) * (1 + math.cos(math.pi * p)) / 2
    return 1 - (1 - floor) * p


@pytest.mark.parametrize("name", ["constant", "multistep", "cosine", "linear"])
@pytest.mark.parametrize("warmup", [0, 3])
def test_lr_factor_matches_definition(name, warmup):
    cfg = ScheduleConfig(name=name, warmup=warmup, milestones=[5, 8], gamma=0.3, min_lr_ratio=0.1)
    for t in range(13):
        assert lr_factor(cfg, t, 12) == pytest.approx(_reference_factor(name, t, 12, warmup, (5, 8), 0.3, 0.1))


def test_scheduler_drives_optimizer_lr_per_step():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = build_optimizer([p], OptimizerConfig(name="sgd", lr=1.0, momentum=0.0))
    sched = build_scheduler(opt, ScheduleConfig(name="cosine", interval="step", warmup=2), epochs=2, steps_per_epoch=5)
    lrs = []
    for _ in range(10):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([_reference_factor("cosine", t, 10, warmup=2) for t in range(10)])


def test_param_groups_and_optimizer_kinds():
    backbone, head = torch.nn.Linear(3, 3), torch.nn.Linear(3, 2)
    backbone.bias.requires_grad_(False)
    cfg = OptimConfig(name="adamw", lr=0.01, weight_decay=0.05, head_lr_mult=2.0, betas=[0.8, 0.9])
    groups = model_param_groups(backbone.parameters(), head.parameters(), cfg)
    opt = build_optimizer(groups, cfg)
    assert isinstance(opt, torch.optim.AdamW)
    assert [g["name"] for g in opt.param_groups] == ["backbone", "head"]
    assert [g["lr"] for g in opt.param_groups] == [0.01, 0.02]
    assert len(opt.param_groups[0]["params"]) == 1  # the frozen bias is left out
    assert opt.param_groups[0]["betas"] == (0.8, 0.9) and opt.param_groups[0]["weight_decay"] == 0.05
    sgd = build_optimizer(head.parameters(), OptimizerConfig(name="sgd", lr=0.1, momentum=0.9, nesterov=True))
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["nesterov"]
    assert isinstance(build_optimizer(head.parameters(), OptimizerConfig(name="adam")), torch.optim.Adam)
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'"):
        build_optimizer(head.parameters(), OptimizerConfig(name="lamb"))


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_adam_on_cpu_takes_the_fused_kernel_with_the_same_updates(name):
    """The fused CPU kernel gives Adam's updates (float32 rounding) over parameter groups with their own rates."""
    shapes = [(7, 5), (5,), (3, 4, 2)]
    cfg = OptimizerConfig(name=name, lr=0.01, weight_decay=0.1)
    runs = []
    for fused in (True, False):
        params = [torch.nn.Parameter(torch.randn(*s, generator=torch.Generator().manual_seed(i))) for i, s in enumerate(shapes)]
        groups = [{"params": params[:2], "lr": 0.01}, {"params": params[2:], "lr": 0.003}]
        opt = build_optimizer(groups, cfg)
        assert opt.defaults["fused"] is True
        if not fused:  # the reference: the same optimizer, one tensor at a time
            opt = type(opt)(groups, lr=0.01, weight_decay=0.1, foreach=False)
        for step in range(5):
            for i, p in enumerate(params):
                p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(100 * step + i))
            opt.step()
        runs.append([p.detach().clone() for p in params])
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert not torch.equal(runs[0][0], torch.randn(7, 5, generator=torch.Generator().manual_seed(0)))  # they moved
    assert build_optimizer([torch.nn.Parameter(torch.zeros(2))], OptimizerConfig(name="sgd", lr=0.1)).defaults.get("fused") in (None, False)
