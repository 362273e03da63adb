"""Every shipped recipe loads and builds everything that does not need images:
config, dataset spec and splits, transforms, model (pretrained=False), loss, sampler,
optimizers and schedules, memory. Labels are SYNTHETIC, shaped like the dataset's levels."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from rankopt.config import list_recipes, load_recipe
from rankopt.data import dataset_spec
from rankopt.data.transforms import build_transform
from rankopt.engine.optim import build_optimizer, build_scheduler, model_param_groups
from rankopt.engine.assembly import build_loss, build_model, build_sampler

PAPER_RECIPES = {
    "roadmap_sop_resnet50", "roadmap_cub_resnet50", "roadmap_inat_resnet50", "roadmap_sop_deit", "roadmap_cub_deit",
    "roadmap_inat_deit", "smooth_ap_sop", "smooth_ap_inat", "fastap_sop", "softbin_ap_sop", "rod_recall_sop",
    "happier_sop", "happier_inat_base", "happier_inat_full", "happier_dyml", "softbin_ap_landmarks",
    "smooth_ap_vggface2_senet50", "smooth_ap_vggface2_arcface",
}


def fake_labels(num_levels: int, batch_size: int, m: int) -> np.ndarray:
    """A consistent hierarchy: 4 images per class, enough classes for two super-classes per batch."""
    num_classes = max(2 * batch_size // m, 64)
    fine = np.repeat(np.arange(num_classes), 4)
    levels = [fine]
    for level in range(1, num_levels):
        levels.append(fine // (num_classes // 4 ** (num_levels - level)) if level == num_levels - 1 else fine // 2 ** level)
    return np.stack(levels, axis=1).astype(np.int64)


def test_paper_settings_are_all_shipped():
    assert PAPER_RECIPES | {"default"} <= set(list_recipes())


_MODELS: dict = {}


@pytest.mark.parametrize("name", list_recipes())
def test_recipe_builds(name):
    cfg = load_recipe(name)
    spec = dataset_spec(cfg.data.name)
    assert cfg.data.train_split in spec.splits
    eval_spec = dataset_spec(cfg.data.eval_name or cfg.data.name)
    assert set(cfg.data.eval_splits or eval_spec.evaluation_splits) <= set(eval_spec.splits)
    for preset in (cfg.data.train_transform, cfg.data.test_transform):
        build_transform(preset, cfg.data.image_size)
    model_cfg = dataclasses.replace(cfg.model, pretrained=False)
    key = repr(model_cfg)
    if key not in _MODELS:
        _MODELS[key] = build_model(dataclasses.replace(cfg, model=model_cfg))
    model = _MODELS[key]
    labels = fake_labels(len(spec.level_names), cfg.train.batch_size, cfg.train.m)
    sampler = build_sampler(cfg, labels)
    batch = next(iter(sampler))
    assert len(batch) <= cfg.train.batch_size
    loss = build_loss(cfg, class_counts=(labels.max(axis=0) + 1).tolist(), embedding_dim=model.embedding_dim)
    emb = torch.nn.functional.normalize(torch.randn(len(batch), model.embedding_dim, generator=torch.Generator().manual_seed(0)), dim=1)
    value = loss(emb.requires_grad_(), torch.from_numpy(labels[batch]))
    assert torch.isfinite(value)
    opt = build_optimizer(model_param_groups(model.backbone_parameters(), model.head_parameters(), cfg.optim), cfg.optim)
    build_scheduler(opt, cfg.schedule, epochs=cfg.train.epochs, steps_per_epoch=len(sampler))
    proxies = list(loss.parameters())
    if proxies:
        build_optimizer(proxies, cfg.optim.loss_params)
    if cfg.train.memory.enabled:
        assert getattr(loss, "accepts_reference", False)
    assert cfg.train.best_metric in cfg.eval.metrics


@pytest.mark.parametrize("recipe", ["smooth_ap_vggface2_senet50", "smooth_ap_vggface2_arcface"])
@pytest.mark.parametrize("loss", ["contrastive", "triplet", "sup_ap", "roadmap"])
def test_face_recipes_take_the_papers_baselines_by_override(recipe, loss):
    """Smooth-AP Table 4's baselines (pairwise contrastive, triplet) and other rankopt losses: the same
    recipe with ``loss.name=<loss> loss.kwargs={}``, as the recipe's comment says."""
    from rankopt.config import load_config

    cfg = load_config(recipe, [f"loss.name={loss}", "loss.kwargs={}"])
    assert (cfg.train.batch_size, cfg.train.m, cfg.optim.lr, cfg.optim.weight_decay) == (224, 4, 1e-5, 4e-5)
    labels = torch.arange(56).repeat_interleave(4)
    emb = torch.nn.functional.normalize(torch.randn(224, 8, generator=torch.Generator().manual_seed(1)), dim=1)
    value = build_loss(cfg, class_counts=[56], embedding_dim=8)(emb.requires_grad_(), labels)
    assert torch.isfinite(value) and value.requires_grad
    assert "loss.name=contrastive" in open(Path(__file__).resolve().parents[1] / "src/rankopt/recipes/smooth_ap_vggface2_senet50.yaml").read()
