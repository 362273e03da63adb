"""How the engine sets a loss up: the config's two spellings of a sum, ``pml:`` names, where the loss's parameters
are optimised (``optim.loss_params``) and the trainer's class-means hook (``loss.init=class_means``). Tiny
SYNTHETIC data: one fixed random pattern per class, no noise, so the embeddings can be recomputed exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from rankopt.config import load_config
from rankopt.engine import trainer as trainer_mod
from rankopt.engine.assembly import build_loss
from rankopt.engine.optim import loss_param_groups
from rankopt.engine.trainer import Trainer
from rankopt.losses import LossSum, terms
from rankopt.losses.baselines import PMLLoss

SUM_BY_NAME = ["loss.name=arcface+smooth_ap", "loss.kwargs.arcface.margin=20.0", "loss.kwargs.smooth_ap.tau=0.02"]
SUM_LISTED = ["loss.name=arcface+smooth_ap", "loss.terms=[{name: arcface, kwargs: {margin: 20.0}}, "
                                            "{name: smooth_ap, weight: 0.5, kwargs: {tau: 0.02}}]"]


@pytest.mark.parametrize("overrides, weights", [(SUM_BY_NAME, [1.0, 1.0]), (SUM_LISTED, [1.0, 0.5])])
def test_config_spellings_of_a_sum_build_it(overrides, weights):
    cfg = load_config(None, overrides)
    loss = build_loss(cfg, class_counts=[10, 5], embedding_dim=8)
    assert isinstance(loss, LossSum) and loss.names == ["arcface", "smooth_ap"] and loss.weights == weights
    arcface, smooth_ap = loss.terms
    assert arcface.losses[0].W.shape == (8, 10) and arcface.losses[0].margin == pytest.approx(np.radians(20.0))
    assert smooth_ap.tau == 0.02
    with terms.recording() as recorded:
        loss(torch.randn(20, 8), torch.arange(20) % 10)
    assert set(recorded) == {"arcface", "smooth_ap"}


def test_a_new_loss_name_drops_the_terms_and_kwargs_of_the_recipe():
    from rankopt.config import apply_overrides, config_to_dict

    cfg = apply_overrides(config_to_dict(load_config(None, SUM_LISTED)), ["loss.name=smooth_ap"])
    assert (cfg.loss.name, cfg.loss.kwargs, cfg.loss.terms) == ("smooth_ap", {}, [])
    with pytest.raises(ValueError, match="loss.name must be their sum 'arcface\\+smooth_ap'"):
        build_loss(load_config(None, SUM_LISTED[1:]), class_counts=[10], embedding_dim=8)
    with pytest.raises(ValueError, match="'loss.init'"):
        load_config(None, ["loss.init=kmeans"])


def test_pml_names_take_their_kwargs_and_data_arguments_from_the_config():
    circle = build_loss(load_config(None, ["loss.name=pml:CircleLoss", "loss.kwargs.m=0.25"]), class_counts=[10],
                        embedding_dim=8)
    assert circle.losses[0].m == 0.25
    soft = build_loss(load_config(None, ["loss.name=pml:SoftTripleLoss"]), class_counts=[10], embedding_dim=8)
    assert soft.losses[0].fc.shape == (8, 100) and soft.num_classes == [10]
    with pytest.raises(ValueError, match="pml:CircleLoss: keyword arguments"):
        build_loss(load_config(None, ["loss.name=pml:CircleLoss", "loss.kwargs.margin=0.25"]), class_counts=[10],
                   embedding_dim=8)


def _groups(*overrides: str) -> tuple[dict[str, float], int]:
    cfg = load_config(None, ["optim.lr=0.001", *overrides])
    loss = build_loss(cfg, class_counts=[10], embedding_dim=8)
    groups, own = loss_param_groups(loss, cfg.optim)
    assert sum(len(g["params"]) for g in groups) + len(own) == len(list(loss.parameters()))
    return {g["name"]: g["lr"] for g in groups}, len(own)


def test_class_weights_train_as_their_papers_unless_told_otherwise():
    assert _groups("loss.name=arcface") == ({"loss_weights": 0.001}, 0)  # ArcFace: the last layer, same lr
    assert _groups("loss.name=proxy_anchor") == ({"loss_weights": pytest.approx(0.1)}, 0)  # proxies at 100x
    assert _groups("loss.name=rod_ap") == ({}, 1)  # TPAMI's proxies: their own optimizer (Adam, lr 10)
    assert _groups("loss.name=arcface+proxy_anchor") == (
        {"loss_weights_x1": 0.001, "loss_weights_x100": pytest.approx(0.1)}, 0)
    assert _groups("loss.name=arcface", "optim.loss_params.with_model=false") == ({}, 1)
    assert _groups("loss.name=rod_ap", "optim.loss_params.with_model=true",
                   "optim.loss_params.lr_mult=5") == ({"loss_weights": pytest.approx(0.005)}, 0)
    assert _groups("loss.name=proxy_anchor", "optim.loss_params.lr_mult=10") == (
        {"loss_weights": pytest.approx(0.01)}, 0)


class Patterns(Dataset):
    """SYNTHETIC: 16x16 images, one fixed random pattern per class (no noise: embeddings are reproducible)."""

    def __init__(self, num_classes: int, per_class: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.images = torch.randn(num_classes * per_class, 3, 16, 16, generator=gen)
        self.labels = np.repeat(np.arange(num_classes), per_class)[:, None].astype(np.int64)
        self.paths = [f"/synthetic/img{i:04d}.png" for i in range(len(self.labels))]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict:
        return {"image": self.images[i], "label": torch.from_numpy(self.labels[i]), "index": i, "path": self.paths[i]}


@pytest.fixture
def patterns(monkeypatch):
    monkeypatch.setattr(trainer_mod, "build_datasets", lambda cfg, *, train=True: (Patterns(8, 4, 0),
                                                                                 {"test": Patterns(4, 4, 1)}))


def _config(out, *extra: str):
    return load_config(None, [
        "model.backbone=convnet_tiny", "model.embedding_dim=16", "data.batch_transform=false", "train.batch_size=16",
        "train.m=4", "train.epochs=1", "train.max_steps_per_epoch=2", "eval.metrics=[map@r]", "eval.batch_size=16",
        "output.progress=false", "output.figures=false", "output.tensorboard=false", f"output.dir={out}", *extra])


@pytest.mark.parametrize("name", ["arcface", "proxy_anchor"])
def test_trainer_sets_class_weights_to_the_class_means_of_the_untrained_model(tmp_path, patterns, name):
    trainer = Trainer(_config(tmp_path, f"loss.name={name}", "loss.init=class_means"))
    data = Patterns(8, 4, 0)
    model = trainer.model.eval()
    with torch.no_grad():
        x = F.normalize(model(data.images).double(), dim=1)
    inner = trainer.loss_fn.losses[0]
    weights = inner.W.T if name == "arcface" else inner.proxies
    for c in range(8):
        mean = x[data.labels[:, 0] == c].mean(dim=0)
        torch.testing.assert_close(weights[c].detach().double(), mean / mean.norm(), rtol=1e-4, atol=1e-5)
    assert trainer.loss_optimizer is None and trainer.optimizer.param_groups[-1]["name"] == "loss_weights"
    random = Trainer(_config(tmp_path / "random", f"loss.name={name}")).loss_fn.losses[0]
    assert not torch.allclose((random.W.T if name == "arcface" else random.proxies).detach(), weights.detach())


def test_class_means_need_class_weights(tmp_path, patterns):
    with pytest.raises(ValueError, match="SmoothAPLoss has no class weights"):
        Trainer(_config(tmp_path, "loss.name=smooth_ap", "loss.init=class_means"))


def test_a_sum_trains_and_logs_each_term(tmp_path, patterns):
    trainer = Trainer(_config(tmp_path, *SUM_LISTED, "loss.init=class_means"))
    report = trainer.fit()
    assert isinstance(trainer.loss_fn.terms[0], PMLLoss)
    assert report["loss"]["terms"][1] == {"name": "smooth_ap", "weight": 0.5, "kwargs": {"tau": 0.02}}
    for row in trainer.step_log:
        assert row["loss"] == pytest.approx(row["term/arcface"] + 0.5 * row["term/smooth_ap"], rel=1e-5)
        assert row["lr/loss_weights"] > 0
