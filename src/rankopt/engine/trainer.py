"""The training loop: data, model, loss, optimizers, AMP, memory, multistage, DDP, evaluation, checkpoints.

``Trainer(cfg).fit()`` trains an :class:`~rankopt.config.ExperimentConfig` and
writes the run folder::

    run_dir/config.yaml             the fully resolved config
    run_dir/run.json                recipe, overrides, command, machine
    run_dir/classes/{train,test}.txt  the class split of a user's image folder (image_folder)
    run_dir/metrics.{csv,json}      one record per evaluation (epoch 0 = untrained model)
    run_dir/steps.csv               one row per step: loss, each loss term, learning rates, score differences
    run_dir/report.json             untrained vs trained metrics, best epoch, data/model/loss, throughput
    run_dir/retrieval.npz           the final model's top-k neighbours on the evaluation split
    run_dir/checkpoints/{last,best}.ckpt
    run_dir/figures/*.png           rankopt.viz.write_figures
    run_dir/report.html             rankopt.report.write_run_report (the page a person reads)

Resuming (``train.resume=path|auto``) restores model, optimizers, schedulers,
grad scaler, memory, sampler and every RNG, so an interrupted run ends with the
same weights as an uninterrupted one. The position inside an epoch is the count of
completed steps: the epoch's batches are re-planned from ``(seed, epoch)`` and the
done ones skipped without loading their images (the sampler's own saved position
can run ahead of the training step when a DataLoader prefetches). This is exact on CPU with
``data.num_workers=0``; with workers, resuming at an epoch boundary is exact
(each epoch's loader is seeded from ``(seed, epoch)``) but resuming mid-epoch
re-seeds the workers' augmentations.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from rankopt.checks import check_finite_scalar
from rankopt.config import ExperimentConfig, config_to_dict, save_config
from rankopt.console import echo, format_table, progress
from rankopt.data.fast_transform import collate
from rankopt.describe import machine_info, model_info
from rankopt.engine import checkpoint as ckpt, multistage, relevance_batches, run_writer, trackers
from rankopt.engine.assembly import (adopt_init_model, build_datasets, build_loss, build_model, build_sampler,
                                     build_transforms, resolve_device, seed_everything)
from rankopt.engine.diagnostics import DIAGNOSTICS
from rankopt.engine.distributed import DistributedLoss, average_gradients, init_distributed
from rankopt.engine.embed_and_score import (EmbeddedSplit, autocast_context, check_eval_metrics, embed_dataset,
                                            evaluate_model)
from rankopt.engine.metrics_log import RunLogger, write_csv_atomic
from rankopt.engine.memory import CrossBatchMemory
from rankopt.engine.optim import build_training_optimizers
from rankopt.engine.warm_start import init_loss_class_means, init_projection_pca
from rankopt.layout import BEST_CKPT, CHECKPOINTS_DIR, CONFIG_YAML, LAST_CKPT, STEPS_CSV
from rankopt.losses import terms
from rankopt.rank.differences import difference_summary, score_differences
from rankopt.runtime import resolve_auto, settle_heap

_MAX_PATHS_SHOWN = 8


RANDOM_PHOTO_HINT = ("hint: this model starts from random weights; on photos, start from ImageNet weights instead: "
                     "`rankopt convert mobilenet_v2 WEIGHTS.pt --out start.ckpt` then model.init=start.ckpt "
                     "(or model.pretrained=true model.kwargs.pretrained_path=WEIGHTS) — see the README")
PHOTO_DATASETS = ("image_folder", "csv")  # a user's own images


def _random_photo_start(cfg: ExperimentConfig) -> bool:
    """A user's own images trained from random weights (no pretrained weights, no ``model.init``)."""
    return cfg.data.name in PHOTO_DATASETS and not cfg.model.pretrained and cfg.model.init is None


def _scores(record: dict[str, Any]) -> dict[str, float]:
    """The metric values of an evaluation record (without the query counts and per-category tables)."""
    return {k: v for k, v in record.items() if not k.startswith("num_") and k != "by_category"}


class _SkipBatches:
    """A batch sampler without its first ``skip`` batches (resuming mid-epoch; no image is loaded for them)."""

    def __init__(self, sampler: Any, skip: int):
        self.sampler, self.skip = sampler, skip

    def __iter__(self) -> Iterator[list[int]]:
        return itertools.islice(iter(self.sampler), self.skip, None)

    def __len__(self) -> int:
        return max(len(self.sampler) - self.skip, 0)


class Trainer:
    """Trains one experiment; see the module docstring for the run folder."""

    def __init__(self, cfg: ExperimentConfig, run_dir: str | Path | None = None,
                 run_info: dict[str, Any] | None = None):
        """``run_info``: how the run was asked for (``recipe``, ``overrides``, ``command``), kept in ``run.json``."""
        if cfg.train.best_metric not in cfg.eval.metrics:
            raise ValueError(f"train.best_metric={cfg.train.best_metric!r} is not in eval.metrics {cfg.eval.metrics}")
        if cfg.train.diagnostics:
            unknown = [d for d in cfg.train.diagnostics if d not in DIAGNOSTICS]
            if unknown:
                raise ValueError(f"train.diagnostics: unknown {unknown}; known: {', '.join(DIAGNOSTICS)}")
        cfg, init_notes = adopt_init_model(cfg)
        self.cfg = cfg
        self.run_info = dict(run_info or {})
        info = init_distributed()  # one process unless launched by torchrun
        self.rank, self.world_size, self.is_main = info.rank, info.world_size, info.is_main
        self.device = resolve_device(cfg.train.device, info.local_rank)
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        self.run_dir = Path(run_dir or cfg.output.dir or Path("runs") / f"{cfg.name}-{stamp}")
        resume_path = ckpt.resolve_resume(cfg.train.resume, self.run_dir) if cfg.train.resume else None
        self.trackers = trackers.ExperimentLoggers(cfg.output, resumed=resume_path is not None, enabled=self.is_main)
        seed_everything(cfg.train.seed + self.rank)
        self.show = cfg.output.progress and self.is_main
        for note in init_notes if self.is_main else ():
            echo(f"model.init {cfg.model.init}: {note}")
        if self.is_main and _random_photo_start(cfg):
            echo(RANDOM_PHOTO_HINT)

        self.train_ds, self.eval_ds = build_datasets(cfg)
        check_eval_metrics(self.eval_ds, cfg.eval.metrics)  # before any image is read
        self.batch_transforms = build_transforms(cfg) if cfg.data.batch_transform else (None, None)
        labels = np.asarray(self.train_ds.labels)
        self.sampler = build_sampler(cfg, labels, rank=self.rank, world_size=self.world_size)
        self.steps_per_epoch = len(self.sampler)
        if cfg.train.max_steps_per_epoch is not None:
            self.steps_per_epoch = min(self.steps_per_epoch, cfg.train.max_steps_per_epoch)
        if self.steps_per_epoch < 1:
            raise ValueError(f"the training split of {cfg.data.name!r} yields no batch of {cfg.train.batch_size} "
                             f"with sampler {cfg.train.sampler!r}")

        self.model = build_model(cfg).to(self.device)
        note = resolve_auto(cfg, self.model, self.device, self._training_sample)  # data.num_workers=auto, ...
        if note and self.is_main:
            echo(note)
        if cfg.model.pca_init_images > 0 and not cfg.train.resume:
            init_projection_pca(self.model, cfg, cfg.model.pca_init_images, self._test_transform(),
                                self._embed_with_rank0_model, self.device)
        embedding_dim = int(self.model.embedding_dim)
        self.loss_fn = build_loss(cfg, class_counts=(labels.max(axis=0) + 1).tolist(), embedding_dim=embedding_dim)
        self.loss_fn.to(self.device)
        self.batch_labels = relevance_batches.batch_labels(cfg, self.train_ds, self.loss_fn, world_size=self.world_size,
                                                           eval_ds=self.eval_ds)  # and what the evaluations need
        if cfg.loss.init == "class_means" and not resume_path:
            # under DDP the loss state is broadcast from rank 0 below
            init_loss_class_means(self.model, self.loss_fn, self.train_ds, self._test_transform(),
                                  self._embed_with_rank0_model, self.device)
        self.train_model: nn.Module = self.model
        self.train_loss: nn.Module = self.loss_fn
        if self.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.train_model = nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
            self.train_loss = DistributedLoss(self.loss_fn)
            for tensor in self.loss_fn.state_dict().values():  # proxies start equal on every rank
                torch.distributed.broadcast(tensor, src=0)

        optimizers = build_training_optimizers(cfg, self.model, self.loss_fn, self.steps_per_epoch)
        self.optimizer, self.scheduler, self.loss_optimizer, self.loss_scheduler = optimizers
        self.loss_params = [p for p in self.loss_fn.parameters() if p.requires_grad]
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.train.amp == "fp16")

        self.memory = None
        mem = cfg.train.memory
        if mem.enabled:
            self.memory = CrossBatchMemory(mem.size or len(self.train_ds), embedding_dim, num_levels=labels.shape[1],
                                           warmup_steps=mem.warmup_steps, weight=mem.weight).to(self.device)
        sub = cfg.train.sub_batch_size
        self.sub_batch_size = sub if sub is not None and sub < cfg.train.batch_size else None

        self.epoch = 0  # completed epochs
        self.step_in_epoch = 0  # completed batches of the current epoch
        self.global_step = 0
        self.loss_sum, self.loss_count = 0.0, 0
        self.step_log: list[dict[str, float]] = []  # steps.csv rows
        self.train_seconds, self.images_seen = 0.0, 0
        self._diff_generator = torch.Generator().manual_seed(cfg.train.seed)
        self.best: dict[str, Any] = {"metric": cfg.train.best_metric, "value": None, "epoch": None}
        self.logger = RunLogger(self.run_dir, tensorboard=self.trackers.tensorboard) if self.is_main else None
        self.last_splits: list[EmbeddedSplit] = []
        self.last_by_category: dict[str, Any] = {}
        self._backbone_params = list(self.model.backbone_parameters())
        if resume_path is not None:
            self.load_state(ckpt.load_checkpoint(resume_path, map_location=self.device))
            if self.is_main:
                echo(f"resumed from {resume_path} (epoch {self.epoch}, step {self.global_step})")

    def _training_sample(self) -> torch.Tensor:
        """Two training images as a batch on the device, augmented as in training (sizing ``auto`` values)."""
        batch = collate([self.train_ds[i] for i in range(min(2, len(self.train_ds)))])["image"].to(self.device)
        return batch if self.batch_transforms[0] is None else self.batch_transforms[0](batch)

    def _test_transform(self) -> Any:
        """The per-image test transform (``None`` with ``data.batch_transform``: batches are transformed)."""
        return None if self.cfg.data.batch_transform else build_transforms(self.cfg)[1]

    def _embed_with_rank0_model(self, module: nn.Module, dataset: Any, desc: str) -> EmbeddedSplit:
        """``module``'s outputs on ``dataset`` (test batch transform), every rank starting from rank 0's weights."""
        if self.world_size > 1:
            for tensor in self.model.state_dict().values():
                torch.distributed.broadcast(tensor, src=0)
        return embed_dataset(module, dataset, device=self.device, num_workers=self.cfg.data.num_workers,
                             show_progress=self.show, desc=desc, batch_transform=self.batch_transforms[1])

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the run exactly (plain containers and tensors only)."""
        optional = lambda obj: None if obj is None else obj.state_dict()  # noqa: E731
        return {
            "format": "rankopt-checkpoint", "version": 1,
            "epoch": self.epoch, "step_in_epoch": self.step_in_epoch, "global_step": self.global_step,
            "loss_sum": self.loss_sum, "loss_count": self.loss_count,
            "model": self.model.state_dict(), "loss": self.loss_fn.state_dict(),
            "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "loss_optimizer": optional(self.loss_optimizer), "loss_scheduler": optional(self.loss_scheduler),
            "scaler": self.scaler.state_dict(), "memory": optional(self.memory),
            "sampler": self.sampler.state_dict() if hasattr(self.sampler, "state_dict") else None,
            "rng": ckpt.rng_state(), "config": config_to_dict(self.cfg),
            "history": self.logger.history if self.logger else [], "best": dict(self.best),
            "step_log": self.step_log, "train_seconds": self.train_seconds, "images_seen": self.images_seen,
            "diff_generator": self._diff_generator.get_state(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.loss_fn.load_state_dict(state["loss"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        for obj, key in ((self.loss_optimizer, "loss_optimizer"), (self.loss_scheduler, "loss_scheduler"),
                         (self.memory, "memory")):
            if obj is not None and state.get(key) is not None:
                obj.load_state_dict(state[key])
        self.scaler.load_state_dict(state["scaler"])
        if state.get("sampler") is not None and hasattr(self.sampler, "load_state_dict"):
            self.sampler.load_state_dict(state["sampler"])
        self.epoch, self.step_in_epoch = int(state["epoch"]), int(state["step_in_epoch"])
        self.global_step = int(state["global_step"])
        self.loss_sum, self.loss_count = float(state["loss_sum"]), int(state["loss_count"])
        self.best = dict(state["best"])
        self.step_log = list(state.get("step_log", []))
        self.train_seconds, self.images_seen = float(state.get("train_seconds", 0.0)), int(state.get("images_seen", 0))
        if "diff_generator" in state:
            self._diff_generator.set_state(state["diff_generator"])
        if self.logger is not None:
            self.logger.history = list(state["history"])
        ckpt.set_rng_state(state["rng"])

    def save(self, name: str) -> Path:
        """Write ``checkpoints/<name>`` and ``steps.csv`` (main process only)."""
        path = self.run_dir / CHECKPOINTS_DIR / name
        if self.is_main:
            ckpt.save_checkpoint(path, self.state_dict())
            self._write_step_log()
        return path

    def _write_step_log(self) -> None:
        if self.step_log:
            write_csv_atomic(self.run_dir / STEPS_CSV, self.step_log)

    # ---------------------------------------------------------------- training
    def _loss(self, embeddings: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        if self.memory is not None:
            return self.memory.loss_with_memory(self.train_loss, embeddings, labels, indices, self.global_step)
        return self.train_loss(embeddings, self.batch_labels(labels, indices))  # loss.relevance: relevance_batches

    def _train_step(self, batch: dict[str, Any]) -> float:
        """One optimisation step; appends its row (loss, terms, learning rates, score differences) to ``step_log``."""
        lrs = {f"lr/{g.get('name', i)}": g["lr"] for i, g in enumerate(self.optimizer.param_groups)}
        if self.loss_optimizer is not None:
            lrs["lr/loss_params"] = self.loss_optimizer.param_groups[0]["lr"]
        with terms.recording() as loss_terms:
            loss, embeddings, labels = self._forward_backward(batch)
        self.images_seen += int(labels.shape[0]) * self.world_size
        value = float(loss.detach())
        diffs = score_differences(embeddings, labels, similarity=getattr(self.loss_fn, "similarity", "cosine"),
                                  generator=self._diff_generator)
        row = {"epoch": self.epoch + 1, "step": self.global_step + 1, "seconds": None, "images": self.images_seen,
               "loss": value, **{f"term/{k}": v for k, v in loss_terms.items()}, **lrs,
               **{f"diff/{k}": v for k, v in difference_summary(diffs).items()}}
        if self.cfg.train.diagnostics and self.global_step % self.cfg.train.diagnostics_every == 0:
            for name in self.cfg.train.diagnostics:
                row.update({f"diag/{k}": v for k, v in DIAGNOSTICS[name](embeddings, labels).items()})
        self.step_log.append(row)
        return value

    def _forward_backward(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        images = batch["image"].to(self.device, non_blocking=True)
        if self.batch_transforms[0] is not None:
            images = self.batch_transforms[0](images)
        labels = batch["label"].to(self.device)
        indices = batch["index"].to(self.device)
        if self.sub_batch_size is not None:
            dtype = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[self.cfg.train.amp]
            loss, embeddings = multistage.multistage_step(
                self.train_model, images, labels, lambda emb, lab: self._loss(emb, lab, indices),
                self.sub_batch_size, autocast_dtype=dtype, scaler=self.scaler if self.scaler.is_enabled() else None)
        else:
            with autocast_context(self.device, self.cfg.train.amp):
                embeddings = self.train_model(images)
            loss = self._loss(embeddings.float(), labels, indices)
        self._check_finite(loss, batch)
        if self.sub_batch_size is None:
            self.scaler.scale(loss).backward()
        if self.memory is not None:
            self.memory.enqueue(embeddings.detach().float(), labels, indices)
        self._optimizer_step()
        return loss, embeddings.detach(), labels

    def _check_finite(self, loss: torch.Tensor, batch: dict[str, Any]) -> None:
        try:
            check_finite_scalar(loss, f"training loss at step {self.global_step} (epoch {self.epoch + 1}, "
                                      f"batch {self.step_in_epoch})")
        except FloatingPointError as err:
            path = self.save(f"nan_step{self.global_step}.ckpt")
            paths = list(batch["path"])
            listing = self.run_dir / f"nan_step{self.global_step}_paths.txt"
            if self.is_main:
                listing.write_text("\n".join(paths) + "\n")
            shown = ", ".join(paths[:_MAX_PATHS_SHOWN])
            more = (f" and {len(paths) - _MAX_PATHS_SHOWN} more (all in {listing})" if len(paths) > _MAX_PATHS_SHOWN
                    else "")
            raise FloatingPointError(f"{err}; the batch's images: {shown}{more}; "
                                     f"checkpoint before the update saved to {path}") from None

    def _optimizer_step(self) -> None:
        optimizers = [self.optimizer] + ([self.loss_optimizer] if self.loss_optimizer is not None else [])
        if self.world_size > 1:  # DDP averages the model's gradients; average the loss parameters' too
            average_gradients(self.loss_params)
        for opt in optimizers:
            self.scaler.unscale_(opt)
        if self.cfg.train.grad_clip is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.train.grad_clip)
        if self.epoch < self.cfg.optim.backbone_frozen_epochs:
            for p in self._backbone_params:
                p.grad = None
        for opt in optimizers:
            self.scaler.step(opt)
            opt.zero_grad(set_to_none=True)
        self.scaler.update()
        self._step_schedulers("step")

    def _step_schedulers(self, interval: str) -> None:
        pairs = ((self.scheduler, self.cfg.schedule), (self.loss_scheduler, self.cfg.optim.loss_params.schedule))
        for scheduler, sched_cfg in pairs:
            if scheduler is not None and sched_cfg.interval == interval:
                scheduler.step()

    def _epoch_loader(self) -> DataLoader:
        self.sampler.set_epoch(self.epoch)
        generator = torch.Generator().manual_seed(self.cfg.train.seed * 1_000_003 + self.epoch)
        return DataLoader(self.train_ds, batch_sampler=_SkipBatches(self.sampler, self.step_in_epoch),
                          num_workers=self.cfg.data.num_workers, generator=generator,
                          pin_memory=self.device.type == "cuda", collate_fn=collate)

    def train_epoch(self) -> float:
        """One epoch (or its remainder after a mid-epoch resume); returns the mean training loss."""
        self.train_model.train()
        remaining = self.steps_per_epoch - self.step_in_epoch
        bar = progress(itertools.islice(self._epoch_loader(), remaining), total=remaining,
                       desc=f"epoch {self.epoch + 1}/{self.cfg.train.epochs}", enabled=self.show,
                       count=lambda batch: len(batch["image"]) * self.world_size)
        every = self.cfg.train.checkpoint_every_steps
        tick = time.perf_counter()
        for batch in bar:
            value = self._train_step(batch)
            now = time.perf_counter()  # training time includes loading the batch, not evaluation
            self.train_seconds += now - tick
            self.step_log[-1]["seconds"] = round(self.train_seconds, 4)
            self.trackers.log_step(self.step_log[-1])
            tick = now
            self.loss_sum += value
            self.loss_count += 1
            self.step_in_epoch += 1
            self.global_step += 1
            if hasattr(bar, "set_postfix"):
                bar.set_postfix(loss=f"{value:.4f}")
            if every and self.global_step % every == 0 and self.step_in_epoch < self.steps_per_epoch:
                self.save(LAST_CKPT)
        mean = self.loss_sum / max(self.loss_count, 1)
        self._step_schedulers("epoch")
        self.epoch += 1
        self.step_in_epoch, self.loss_sum, self.loss_count = 0, 0.0, 0
        return mean

    # ---------------------------------------------------------------- evaluation
    def evaluate(self) -> dict[str, float]:
        """Metrics of the current model on the evaluation splits (all ranks take part)."""
        result, self.last_splits = evaluate_model(
            self.model, self.eval_ds, self.cfg.eval, device=self.device, num_workers=self.cfg.data.num_workers,
            amp=self.cfg.train.amp, show_progress=self.show, batch_transform=self.batch_transforms[1],
            relevance=relevance_batches.evaluation_mode(self.cfg))  # eval.relevance: the loss's, labels or items
        metrics = {**result.metrics, "num_queries": result.num_queries,
                   "num_queries_without_positive": result.num_queries_without_positive}
        self.last_by_category = result.to_record().get("by_category", {})  # OML categories (csv): report.json only
        return metrics

    def _record(self, metrics: dict[str, float], loss: float) -> None:
        lrs = {f"lr_{g.get('name', i)}": g["lr"] for i, g in enumerate(self.optimizer.param_groups)}
        record = {"epoch": self.epoch, "step": self.global_step, "loss": loss, **lrs, **metrics}
        if self.logger is not None:
            self.logger.log(record)
            self.trackers.log_evaluation(record)
        key = self.cfg.train.best_metric
        if key not in metrics:
            raise ValueError(f"train.best_metric={key!r} was not computed on "
                             f"{self.cfg.data.eval_name or self.cfg.data.name}"
                             f"; available: {', '.join(_scores(metrics))}")
        if self.epoch > 0 and (self.best["value"] is None or metrics[key] > self.best["value"]):
            self.best = {"metric": key, "value": metrics[key], "epoch": self.epoch}
            self.save(BEST_CKPT)

    def fit(self) -> dict[str, Any]:
        """Train to ``train.epochs``; returns the final report (also written to ``report.json``)."""
        settle_heap()
        cfg = self.cfg
        start = time.perf_counter()
        if self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_config(cfg, self.run_dir / CONFIG_YAML)
            run_writer.write_run_info(self.run_dir, self.run_info, self.device)
            self.trackers.start(self.run_dir, config_to_dict(cfg), self.run_info)
            run_writer.write_class_split(self.run_dir, self.train_ds)
            echo(f"run folder: {self.run_dir}")
        if self.global_step == 0 and not (self.logger and self.logger.history):
            untrained = self.evaluate()
            self._record(untrained, math.nan)
            if self.is_main:
                echo(format_table({"untrained": _scores(untrained)}, "metrics of the untrained model:"))
        while self.epoch < cfg.train.epochs:
            loss = self.train_epoch()
            if self.epoch % cfg.train.eval_every == 0 or self.epoch == cfg.train.epochs:
                metrics = self.evaluate()
                self._record(metrics, loss)
                if self.is_main:
                    shown = ", ".join(f"{k}={metrics[k]:.4f}" for k in cfg.eval.metrics if k in metrics)
                    echo(f"epoch {self.epoch}: loss={loss:.4f} {shown}")
            self.save(LAST_CKPT)
        report = self._report(time.perf_counter() - start)
        self.trackers.finish()
        if self.logger is not None:
            self.logger.close()
        return report

    def _report(self, seconds: float) -> dict[str, Any]:
        history = self.logger.history if self.logger else []
        evaluated = [r for r in history if r["epoch"] > 0]
        if not self.last_splits:  # resumed after the last evaluation: embed once more for the figures
            self.evaluate()
        metric_keys = list(self.cfg.eval.metrics)
        cfg_epochs = self.cfg.train.epochs
        pick = lambda rec: {k: rec[k] for k in rec if k in metric_keys or k.startswith("num_")}  # noqa: E731
        d = self.cfg.data
        first = next(iter(self.eval_ds.values()))
        report = {
            "kind": "train", "name": self.cfg.name, "run_dir": str(self.run_dir), "dataset": d.name,
            "epochs": self.epoch, "steps": self.global_step, "train_seconds": round(self.train_seconds, 1),
            "wall_seconds": round(seconds, 1),
            "images_per_second": round(self.images_seen / self.train_seconds, 1) if self.train_seconds else None,
            "untrained": pick(history[0]) if history else {},
            # train.epochs=0 (a reference row: the initial model, e.g. released weights): trained = untrained
            "trained": pick(evaluated[-1]) if evaluated else pick(history[0]) if history and not cfg_epochs else {},
            "best": self.best,
            "data": {"name": d.name, "root": d.root, "eval_name": d.eval_name or d.name,
                     "level_names": list(getattr(first, "level_names", [])),
                     "train": run_writer.dataset_counts({"train": self.train_ds})["train"],
                     "eval": run_writer.dataset_counts(self.eval_ds)},
            "model": model_info(self.model, self.cfg.model.backbone),
            "loss": {"name": self.cfg.loss.name, "kwargs": dict(self.cfg.loss.kwargs), "repr": repr(self.loss_fn),
                     "terms": [vars(t) for t in self.cfg.loss.terms], "init": self.cfg.loss.init},
            "machine": machine_info(self.device),
        }
        if self.last_by_category and report["trained"]:
            report["trained"]["by_category"] = self.last_by_category
        if self.is_main:
            trained = report["trained"]
            echo(format_table({"untrained": _scores(report["untrained"]), "trained": _scores(trained)},
                              f"final report ({self.cfg.data.name}, {self.epoch} epochs, "
                              f"{trained.get('num_queries', '?')} queries):"))
            self._write_step_log()
            out = self.cfg.output
            page = run_writer.finish_run_folder(self.run_dir, report, self.last_splits, self.cfg,
                                                figures=out.figures and out.embedding_figures, html=out.figures,
                                                history=history, level_names=getattr(first, "level_names", None))
            echo(f"run folder: {self.run_dir} (config.yaml, metrics.csv, steps.csv, report.json, checkpoints/"
                 f"{', figures/' if self.cfg.output.figures else ''})")
            if page is not None:
                echo(f"report: {page}")
        return report
