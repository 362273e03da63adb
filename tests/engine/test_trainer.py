"""The training loop (rankopt.engine.trainer) on a tiny in-memory dataset (labelled SYNTHETIC).

The dataset draws random noise from torch's global RNG on every item, standing in
for random augmentations, so the resume tests also check that RNG states are restored.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

from rankopt.config import load_config
from rankopt.engine import trainer as trainer_mod
from rankopt.engine.checkpoint import load_checkpoint
from rankopt.engine.trainer import Trainer


class TinySynthetic(Dataset):
    """SYNTHETIC: 16x16 images, one fixed random pattern per class plus fresh noise per access."""

    def __init__(self, num_classes: int, per_class: int, seed: int, split: str):
        gen = torch.Generator().manual_seed(seed)
        self.patterns = torch.randn(num_classes, 3, 16, 16, generator=gen)
        fine = np.repeat(np.arange(num_classes), per_class)
        self.labels = np.stack([fine, fine // 2], axis=1).astype(np.int64)
        self.paths = [f"/synthetic/{split}/class{c:03d}/img{i:04d}.png" for i, c in enumerate(fine)]
        self.level_names = ("synthetic_fine", "synthetic_coarse")

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict:
        image = self.patterns[self.labels[i, 0]] + 0.8 * torch.randn(3, 16, 16)
        return {"image": image, "label": torch.from_numpy(self.labels[i]), "index": i, "path": self.paths[i]}


@pytest.fixture
def tiny_data(monkeypatch):
    def fake_build_datasets(cfg, *, train=True):
        return (TinySynthetic(16, 6, 0, "train") if train else None), {"test": TinySynthetic(8, 4, 1, "test")}

    monkeypatch.setattr(trainer_mod, "build_datasets", fake_build_datasets)


def tiny_config(out: Path, *extra: str):
    return load_config(None, [
        "model.backbone=convnet_tiny", "model.embedding_dim=16", "model.freeze_bn=true", "data.batch_transform=false",
        "loss.name=sup_ap", "train.batch_size=16", "train.m=4", "train.epochs=2", "train.max_steps_per_epoch=4",
        "schedule.name=cosine", "schedule.interval=step", "schedule.warmup=2", "optim.lr=0.01",
        "eval.metrics=[map@r,recall@1]", "eval.batch_size=16", "output.progress=false", "output.figures=false",
        "output.tensorboard=false", f"output.dir={out}", *extra,
    ])


def _params(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


class Interrupt(Exception):
    pass


def _interrupt_after_saving(monkeypatch, step: int) -> None:
    """Make ``Trainer.save`` raise right after writing last.ckpt at ``global_step == step`` (a crash)."""
    original = Trainer.save

    def save(self, name):
        path = original(self, name)
        if name == "last.ckpt" and self.global_step == step:
            raise Interrupt
        return path

    monkeypatch.setattr(Trainer, "save", save)


@pytest.mark.parametrize("interrupt_step", [4, 3], ids=["epoch-boundary", "mid-epoch"])
def test_resume_is_bit_for_bit(tmp_path, tiny_data, monkeypatch, interrupt_step):
    extra = ("train.checkpoint_every_steps=3",)
    straight = Trainer(tiny_config(tmp_path / "a", *extra))
    straight.fit()
    expected = _params(straight)

    with monkeypatch.context() as patch:
        _interrupt_after_saving(patch, interrupt_step)
        with pytest.raises(Interrupt):
            Trainer(tiny_config(tmp_path / "b", *extra)).fit()
    state = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.ckpt")
    assert state["global_step"] == interrupt_step
    resumed = Trainer(tiny_config(tmp_path / "b", *extra, "train.resume=auto"))
    assert resumed.global_step == interrupt_step
    resumed.fit()
    got = _params(resumed)
    assert expected.keys() == got.keys()
    for key in expected:
        assert torch.equal(expected[key], got[key]), f"parameter {key} differs after resuming"
    assert straight.optimizer.state_dict()["state"].keys() == resumed.optimizer.state_dict()["state"].keys()
    hist_a = straight.logger.history
    hist_b = resumed.logger.history
    assert [r["map@r"] for r in hist_a] == [r["map@r"] for r in hist_b]


def test_run_folder_and_report(tmp_path, tiny_data):
    trainer = Trainer(tiny_config(tmp_path / "run", "train.eval_every=2"))
    report = trainer.fit()
    run = tmp_path / "run"
    for name in ("config.yaml", "metrics.csv", "metrics.json", "report.json", "checkpoints/last.ckpt",
                 "checkpoints/best.ckpt"):
        assert (run / name).is_file(), name
    assert [r["epoch"] for r in trainer.logger.history] == [0, 2]  # untrained, then every 2 epochs
    assert math.isnan(trainer.logger.history[0]["loss"])
    assert report["untrained"]["map@r"] == trainer.logger.history[0]["map@r"]
    assert report["trained"]["map@r"] == trainer.logger.history[-1]["map@r"]
    assert report["best"]["epoch"] == 2 and report["steps"] == 8
    last = load_checkpoint(run / "checkpoints" / "last.ckpt")
    for key in ("model", "optimizer", "scheduler", "scaler", "sampler", "rng", "config", "history"):
        assert last[key] is not None, key
    assert last["config"]["train"]["epochs"] == 2 and last["sampler"]["seed"] == 0


class NaNAtStep(torch.nn.Module):
    """A rank loss that returns NaN on its ``bad_call``-th call."""

    accepts_reference = True

    def __init__(self, inner: torch.nn.Module, bad_call: int):
        super().__init__()
        self.inner, self.bad_call, self.calls = inner, bad_call, 0

    def forward(self, embeddings, labels, ref_embeddings=None, ref_labels=None):
        self.calls += 1
        loss = self.inner(embeddings, labels, ref_embeddings, ref_labels)
        return loss * math.nan if self.calls == self.bad_call else loss


def test_nan_loss_stops_with_step_paths_and_checkpoint(tmp_path, tiny_data, monkeypatch):
    original = trainer_mod.build_loss
    monkeypatch.setattr(trainer_mod, "build_loss", lambda cfg, **kw: NaNAtStep(original(cfg, **kw), bad_call=3))
    trainer = Trainer(tiny_config(tmp_path / "run"))
    with pytest.raises(FloatingPointError) as info:
        trainer.fit()
    message = str(info.value)
    assert "step 2" in message and "not finite" in message
    assert "/synthetic/train/class" in message  # the batch's image paths
    listing = tmp_path / "run" / "nan_step2_paths.txt"
    assert len(listing.read_text().split()) == 16
    saved = tmp_path / "run" / "checkpoints" / "nan_step2.ckpt"
    assert str(saved) in message
    state = load_checkpoint(saved)
    assert state["global_step"] == 2
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())


def test_memory_and_multistage_are_wired(tmp_path, tiny_data, monkeypatch):
    from rankopt.engine import multistage

    calls = []
    original = multistage.multistage_step

    def spy(model, images, labels, loss_fn, sub_batch_size, **kw):
        calls.append((images.shape[0], sub_batch_size))
        return original(model, images, labels, loss_fn, sub_batch_size, **kw)

    monkeypatch.setattr(multistage, "multistage_step", spy)
    cfg = tiny_config(tmp_path / "run", "train.epochs=1", "train.memory.enabled=true", "train.memory.size=40",
                      "train.memory.warmup_steps=1", "train.sub_batch_size=8")
    trainer = Trainer(cfg)
    trainer.fit()
    assert calls == [(16, 8)] * 4
    memory = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.ckpt")["memory"]
    assert int(memory["filled"]) == 40 and memory["embeddings"].shape == (40, 16)
    # the ring holds the last 40 training items seen, in order, with their labels
    assert torch.equal(memory["labels"][:, 0], torch.as_tensor(trainer.train_ds.labels[memory["indices"], 0]))


def test_amp_clip_frozen_backbone_and_loss_optimizer(tmp_path, tiny_data):
    cfg = tiny_config(tmp_path / "run", "train.epochs=1", "train.amp=bf16", "train.grad_clip=0.5",
                      "optim.backbone_frozen_epochs=1", "loss.name=rod_ap", "optim.loss_params.lr=0.5",
                      "optim.head_lr_mult=3")
    trainer = Trainer(cfg)
    backbone0 = [p.detach().clone() for p in trainer.model.backbone_parameters()]
    head0 = [p.detach().clone() for p in trainer.model.head_parameters()]
    proxies0 = [p.detach().clone() for p in trainer.loss_fn.parameters()]
    assert trainer.loss_optimizer is not None and trainer.loss_optimizer.param_groups[0]["lr"] == 0.5  # own schedule, no warm-up
    assert [g["lr"] for g in trainer.optimizer.param_groups] == pytest.approx([0.005, 0.015])  # warm-up 1/2
    trainer.fit()
    assert all(torch.equal(a, b) for a, b in zip(backbone0, trainer.model.backbone_parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(head0, trainer.model.head_parameters()))
    assert any(not torch.equal(a, b) for a, b in zip(proxies0, trainer.loss_fn.parameters()))


def test_bad_best_metric_is_rejected_before_training(tmp_path, tiny_data):
    with pytest.raises(ValueError, match="best_metric='ndcg' is not in eval.metrics"):
        Trainer(tiny_config(tmp_path / "run", "train.best_metric=ndcg"))


def test_pca_initialisation_of_the_projection(tmp_path):
    """model.pca_init_images: the projection equals the PCA (numpy SVD) of the training descriptors."""
    cfg = load_config(None, ["train.epochs=1", "model.pca_init_images=40", "model.embedding_dim=8",
                             "data.kwargs.images_per_class=4", "output.progress=false"])
    trainer = Trainer(cfg, run_dir=tmp_path / "run")
    ds = trainer.train_ds
    picked = sorted(set(np.linspace(0, len(ds) - 1, 40).round().astype(int).tolist()))
    images = torch.stack([ds[i]["image"] for i in picked])
    if trainer.batch_transforms[1] is not None:
        images = trainer.batch_transforms[1](images)
    with torch.no_grad():
        trainer.model.eval()
        feats = trainer.model.descriptors(images).double().numpy()
    centred = feats - feats.mean(0)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    weight = trainer.model.projection.weight.detach().double().numpy()
    # same subspace and same directions up to sign
    for k in range(8):
        assert abs(abs(float(weight[k] @ vt[k])) - 1.0) < 1e-3


@pytest.mark.parametrize("name", __import__("rankopt.losses", fromlist=["LOSSES"]).LOSSES.names())
def test_every_registered_loss_builds_from_a_config_and_trains(name):
    """build_loss fills the data arguments of proxy losses (finest count, or one count per level
    for the Σ losses) and the loss gives a finite value and a gradient on 3-level labels."""
    from rankopt import losses
    from rankopt.engine.assembly import build_loss

    cfg = load_config(None, [f"loss.name={name}"])
    fine = torch.arange(12).repeat_interleave(4)
    labels = torch.stack([fine, fine // 3, fine // 6], dim=1)
    counts = (labels.max(dim=0).values + 1).tolist()
    loss_fn = build_loss(cfg, class_counts=counts, embedding_dim=16)
    args = losses.data_arguments(name)
    if args.get("num_classes") == "classes_per_level":
        assert sum(p.numel() for p in loss_fn.parameters()) == sum(counts) * 16  # a proxy per class of every level
    elif "num_classes" in args:
        per_class = 3 if name == "subcenter_arcface" else 1  # its sub-centres
        assert sum(p.numel() for p in loss_fn.parameters()) == counts[0] * 16 * per_class
    else:
        assert not list(loss_fn.parameters())
    emb = torch.nn.functional.normalize(torch.randn(48, 16), dim=1).requires_grad_()
    value = loss_fn(emb, labels)
    value.backward()
    assert torch.isfinite(value) and emb.grad is not None and torch.isfinite(emb.grad).all()


def test_step_log_terms_retrieval_and_run_info(tmp_path, tiny_data):
    """steps.csv has one row per step with every loss term, the learning rates and the score-difference
    quantiles; retrieval.npz holds the exact top-k (no pickle); run.json says how the run was asked for."""
    import csv
    import json

    run = tmp_path / "run"
    trainer = Trainer(tiny_config(run, "loss.name=roadmap", "train.memory.enabled=true"),
                      run_info={"recipe": "default", "overrides": ["loss.name=roadmap"], "command": "rankopt train"})
    trainer.fit()
    rows = list(csv.DictReader(open(run / "steps.csv")))
    assert [int(r["step"]) for r in rows] == list(range(1, 9))
    seconds = [float(r["seconds"]) for r in rows]
    assert all(b > a for a, b in zip(seconds, seconds[1:]))
    for column in ("term/batch", "term/batch/sup_ap", "term/batch/calibration", "term/memory",
                   "term/memory/sup_ap", "lr/backbone", "diff/q01", "diff/q99"):
        assert column in rows[0], column
    for r in rows:  # the logged loss is the batch term plus the memory term (weight 1)
        total = float(r["term/batch"]) + (float(r["term/memory"]) if r["term/memory"] else 0.0)
        assert float(r["loss"]) == pytest.approx(total, rel=1e-5)
        batch = 0.5 * float(r["term/batch/sup_ap"]) + 0.5 * float(r["term/batch/calibration"])
        assert float(r["term/batch"]) == pytest.approx(batch, rel=1e-5)  # ROADMAP Eq. 2, lambda = 0.5
        assert float(r["diff/min"]) <= float(r["diff/q50"]) <= float(r["diff/max"])
    info = json.loads((run / "run.json").read_text())
    assert info["recipe"] == "default" and info["overrides"] == ["loss.name=roadmap"] and "machine" in info
    report = json.loads((run / "report.json").read_text())
    assert report["kind"] == "train" and report["images_per_second"] > 0
    assert report["data"]["train"] == {"images": 96, "classes": {"synthetic_fine": 16, "synthetic_coarse": 8}}
    assert report["loss"]["name"] == "roadmap" and report["model"]["parameters"] > 0

    saved = np.load(run / "retrieval.npz", allow_pickle=False)
    split = trainer.last_splits[0]
    scores = split.embeddings @ split.embeddings.T
    scores.fill_diagonal_(-math.inf)
    expected = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, : saved["neighbours"].shape[1]]
    assert np.array_equal(saved["neighbours"], expected.numpy())
    assert bool(saved["self_retrieval"]) and list(saved["query_paths"]) == split.paths
    assert np.array_equal(saved["query_labels"], split.labels.numpy())


def test_resumed_step_log_equals_the_uninterrupted_one(tmp_path, tiny_data, monkeypatch):
    import csv

    extra = ("train.checkpoint_every_steps=3",)
    Trainer(tiny_config(tmp_path / "a", *extra)).fit()
    with monkeypatch.context() as patch:
        _interrupt_after_saving(patch, 3)
        with pytest.raises(Interrupt):
            Trainer(tiny_config(tmp_path / "b", *extra)).fit()
    Trainer(tiny_config(tmp_path / "b", *extra, "train.resume=auto")).fit()
    drop_time = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    a, b = (drop_time(csv.DictReader(open(tmp_path / run / "steps.csv"))) for run in ("a", "b"))
    assert a == b and len(a) == 8


def test_validation_split_replaces_the_evaluation_splits(omniglot):
    """data.validation_fraction carves held-out alphabets from the training split: class-disjoint from
    the training part, and the test alphabets are not evaluated."""
    from rankopt.engine.assembly import build_datasets

    cfg = load_config("omniglot", [f"data.root={omniglot}", "data.validation_fraction=0.2"])
    train, evals = build_datasets(cfg)
    assert list(evals) == ["validation"]
    val = evals["validation"]
    alphabet = lambda ds: {p.split("/")[-3] for p in ds.paths}  # noqa: E731
    assert not alphabet(train) & alphabet(val)
    assert len(alphabet(val)) == 6 and len(alphabet(train)) == 24
    assert len(train) + len(val) == 19280
    assert all("images_background" in p for p in val.paths)


def test_diagnostics_are_logged_every_n_steps_and_unknown_ones_rejected(tmp_path, tiny_data):
    import csv

    run = tmp_path / "run"
    Trainer(tiny_config(run, "train.diagnostics=[surrogate_ap]", "train.diagnostics_every=3")).fit()
    rows = list(csv.DictReader(open(run / "steps.csv")))
    logged = [int(r["step"]) for r in rows if r.get("diag/ap/true")]
    assert logged == [1, 4, 7]  # global steps 0, 3, 6 before the update
    assert all(0.0 <= float(r["diag/error/sup_ap"]) <= 1.0 for r in rows if r["diag/ap/true"])
    with pytest.raises(ValueError, match="unknown"):
        Trainer(tiny_config(tmp_path / "bad", "train.diagnostics=[nope]"))
