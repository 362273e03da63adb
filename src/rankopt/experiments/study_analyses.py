"""The studies that measure models and training logs rather than table a sweep: the decomposability gap
of AP on the test split, the surrogates' AP approximation error during training, and the fraction of score
differences in the sigmoid's operating region."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import torch

from rankopt.config import ExperimentConfig
from rankopt.data import build_batch_sampler
from rankopt.engine.assembly import (
    build_datasets,
    build_model,
    build_transforms,
    model_from_checkpoint,
    resolve_device,
    seed_everything,
)
from rankopt.engine.diagnostics import SURROGATES
from rankopt.engine.embed_and_score import embed_dataset
from rankopt.experiments.study_settings import CALIBRATION_LOSSES, TRAINED_CHECKPOINT, StudySettings, seeded_runs
from rankopt.experiments.study_tables import Findings, Table, finite_summary
from rankopt.metrics import decomposability_gap, evaluate
from rankopt.rank import default_delta, operating_fraction, score_differences
from rankopt.report.run_reader import read_run
from rankopt.viz import plot_approximation_error, plot_decomposability_gap, plot_operating_region

GAP_BATCH_SIZES = (32, 64, 128, 256, 512)
DIAGNOSTICS_EVERY, QUICK_DIAGNOSTICS_EVERY = 10, 2
EDGE_FRACTION = 0.2  # approximation_error: the first / last 20 % of the logged steps
OPERATING_BATCH_SIZES = (32, 64, 128, 256, 512)
OPERATING_TAUS = (0.001, 0.005, 0.01, 0.05, 0.1)
OPERATING_BATCHES, QUICK_OPERATING_BATCHES = 20, 4


def measuring_device() -> torch.device:
    """The device the studies embed with (``resolve_device("auto")``)."""
    return resolve_device("auto")


def _untrained(cfg: ExperimentConfig, seed: int) -> torch.nn.Module:
    """The recipe's model as initialised with ``seed`` (eval mode)."""
    seed_everything(seed)
    return build_model(cfg).to(measuring_device()).eval()


def _embed(model: torch.nn.Module, cfg: ExperimentConfig, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings and labels of the training split (``split="train"``: the one the run trained on) or of
    the evaluation split (``"eval"``, self-retrieval only), always with the test transform."""
    train_ds, evals = build_datasets(cfg, train=split == "train")
    if split != "train" and len(evals) != 1:
        raise ValueError(f"{cfg.data.name}: evaluation splits {list(evals)}; this study needs one self-retrieval split")
    dataset = train_ds if split == "train" else next(iter(evals.values()))
    test_tf = build_transforms(cfg)[1]
    batch_tf = test_tf if cfg.data.batch_transform else None
    if batch_tf is None:
        dataset.transform = test_tf
    out = embed_dataset(model, dataset, batch_size=cfg.eval.batch_size, device=measuring_device(), show_progress=False,
                        batch_transform=batch_tf)
    return out.embeddings, out.labels


def decomposability_gap_study(s: StudySettings) -> Findings:
    """``DG_AP = (1/K) sum_b AP(B_b) - AP(whole set)`` (ROADMAP Eq. 6) on the TEST split at batch
    sizes :data:`GAP_BATCH_SIZES` (random batches, ``rankopt.metrics.decomposability_gap``) for SupAP
    and ROADMAP models (last checkpoint) and the untrained model, with the relative decrease
    ``100 (DG_SupAP - DG_ROADMAP) / DG_SupAP`` (ROADMAP Table 10)."""
    sizes = [int(v) for v in s.sweep_values(GAP_BATCH_SIZES)]
    runs = s.train_groups({loss: seeded_runs(s, loss, f"loss.name={loss}") for loss in CALIBRATION_LOSSES})
    gaps: dict[str, list[list[float]]] = {"untrained": [], **{loss: [] for loss in CALIBRATION_LOSSES}}
    whole: dict[str, list[float]] = {name: [] for name in gaps}
    test_size = 0
    for i, seed in enumerate(s.seeds):
        loaded = {loss: model_from_checkpoint(runs[loss][i] / TRAINED_CHECKPOINT, measuring_device())
                  for loss in CALIBRATION_LOSSES}
        cfg = loaded["sup_ap"][1]
        cfg = replace(cfg, data=replace(cfg.data, validation_fraction=0.0))  # the test split, whatever the run used
        models = {"untrained": _untrained(cfg, seed), **{loss: model for loss, (model, _) in loaded.items()}}
        for name, model in models.items():
            emb, labels = _embed(model, cfg, "eval")
            test_size = emb.shape[0]
            whole[name].append(evaluate(emb, labels, metrics=["map"]).metrics["map"])
            gaps[name].append([decomposability_gap(emb, labels, b, seed=seed).gap if b <= test_size else math.nan
                               for b in sizes])
    table = Table(["model", "AP (whole test set)", *[f"DG@{b}" for b in sizes]])
    cells = {name: [finite_summary([g[j] for g in gaps[name]]) for j in range(len(sizes))] for name in gaps}
    for name in gaps:
        table.rows.append([CALIBRATION_LOSSES.get(name, name), finite_summary(whole[name]), *cells[name]])
    sup, road = ([c.mean for c in cells[n]] for n in CALIBRATION_LOSSES)
    table.rows.append(["decrease of DG, SupAP -> ROADMAP (%)", None,
                       *[100.0 * (a - b) / a if a else math.nan for a, b in zip(sup, road, strict=True)]])
    figure = plot_decomposability_gap(sizes, {n: [c.mean for c in cells[n]] for n in gaps},
                                      s.out_dir / "decomposability_gap.png",
                                      errors={n: [c.std for c in cells[n]] for n in gaps},
                                      title_note=f"{s.recipe}, test split")
    notes = [f"batch sizes above the {test_size} test images are left out (–)."] if max(sizes) > test_size else []
    return Findings(
        "Decomposability gap of AP on the test set (ROADMAP Eq. 6, Table 10)",
        f"the TEST split ({test_size} images; no hyper-parameter is chosen here); batches drawn at random "
        f"(rankopt.metrics.decomposability_gap, seed = the run's seed); mean ± std over seeds "
        f"{', '.join(map(str, s.seeds))}",
        table, [figure], notes)


def approximation_error_study(s: StudySettings) -> Findings:
    """``AP_e = |AP_pred - AP|`` (Smooth-AP Eq. 8) of each surrogate on the training batches while one
    model trains (the recipe with ``loss.name=smooth_ap`` unless ``--set loss.name=...``): the
    ``surrogate_ap`` diagnostic (:mod:`rankopt.engine.diagnostics`) logged every
    ``train.diagnostics_every`` steps into ``steps.csv`` (Smooth-AP Fig. 4)."""
    if s.values:
        raise ValueError("approximation_error sweeps nothing: --values does not apply")
    every = QUICK_DIAGNOSTICS_EVERY if s.quick else DIAGNOSTICS_EVERY
    runs = s.train(seeded_runs(s, "diag", "train.diagnostics=[surrogate_ap]",
                               defaults=("loss.name=smooth_ap", f"train.diagnostics_every={every}")))
    folders = [read_run(run) for run in runs]
    per_seed = []
    for run, folder in zip(runs, folders, strict=True):
        steps = folder.steps
        if steps is None or "diag/ap/true" not in steps:
            raise ValueError(f"{run / 'steps.csv'} has no diag/ columns: the trainer did not log the "
                             "surrogate_ap diagnostic")
        logged = np.isfinite(steps["diag/ap/true"])
        per_seed.append({"step": steps["step"][logged], "true": steps["diag/ap/true"][logged],
                         **{n: steps[f"diag/error/{n}"][logged] for n in SURROGATES}})
    count = min(len(p["step"]) for p in per_seed)
    edge = max(1, round(EDGE_FRACTION * count))
    table = Table(["surrogate", f"first {EDGE_FRACTION:.0%} of steps", f"last {EDGE_FRACTION:.0%} of steps"])
    for name in ("true", *SURROGATES):
        first = finite_summary([float(np.mean(p[name][:edge])) for p in per_seed])
        last = finite_summary([float(np.mean(p[name][count - edge : count])) for p in per_seed])
        table.rows.append(["true batch AP (for scale)" if name == "true" else name, first, last])
    loss = folders[0].report.get("loss", {}).get("name", "?")
    mean_errors = {n: np.mean([p[n][:count] for p in per_seed], axis=0).tolist() for n in SURROGATES}
    figure = plot_approximation_error(per_seed[0]["step"][:count], mean_errors, s.out_dir / "approximation_error.png",
                                      title_note=f"{s.recipe}, trained with {loss}")
    return Findings(
        "AP approximation error of the surrogates during training (Smooth-AP Fig. 4, Eq. 8)",
        f"the training batches of a model trained with {loss} (embeddings detached), every "
        f"{folders[0].setting('train.diagnostics_every', '?')} steps ({count} logged steps): the mean of "
        f"|AP_pred - AP| over the first and the last logged steps, AP_pred = 1 - loss value (the first row: the "
        f"true batch AP itself); mean ± std over seeds {', '.join(map(str, s.seeds))}",
        table, [figure])


def operating_fractions(embeddings: torch.Tensor, labels: torch.Tensor, batches: Sequence[Sequence[int]],
                        taus: Sequence[float], *, similarity: str = "cosine") -> np.ndarray:
    """``(len(batches), len(taus))``: per batch, the fraction of its score differences
    ``d = s_k - s_j`` (every query, positive ``j``, other item ``k``) with ``|d| < δ(τ)``,
    ``δ(τ) = τ ln((1 - ε)/ε)``, ``ε = 0.01`` (where ``σ'`` falls below ~ε: ROADMAP supp. A.3).

    Smooth-AP supp. Eq. 1 counts ``|dG/dD| > 0.005`` instead; both measure the sigmoid's operating region."""
    out = np.full((len(batches), len(taus)), math.nan)
    for i, batch in enumerate(batches):
        index = torch.as_tensor(list(batch), dtype=torch.long)
        diffs = score_differences(embeddings[index], labels[index], similarity=similarity, max_queries=len(index))
        out[i] = [operating_fraction(diffs, default_delta(tau)) for tau in taus]
    return out


def _operating_batches(labels: torch.Tensor, batch_size: int, m: int, seed: int, count: int) -> list[np.ndarray]:
    """The first ``count`` m-per-class batches of epoch 0 (none when fewer than ``batch_size / m`` classes
    have ``m`` images)."""
    if batch_size % m:
        raise ValueError(f"batch size {batch_size} is not a multiple of train.m = {m}")
    sizes = np.unique(labels[:, 0].numpy(), return_counts=True)[1]
    if int((sizes >= m).sum()) < batch_size // m:
        return []
    sampler = build_batch_sampler("m_per_class", labels.numpy(), batch_size=batch_size, m=m, seed=seed)
    return sampler.global_batches(0)[:count]


def operating_region_study(s: StudySettings) -> Findings:
    """The fraction of score differences in the sigmoid's operating region ``|d| < δ(τ)`` for
    τ in :data:`OPERATING_TAUS` and batch sizes :data:`OPERATING_BATCH_SIZES` (m-per-class batches of
    the training split, test transform), for the untrained model and a model trained with Smooth-AP
    (one run, or ``from_run``): Smooth-AP supp. Fig. S7a."""
    sizes = [int(v) for v in s.sweep_values(OPERATING_BATCH_SIZES)]
    run = s.from_run or s.train(seeded_runs(replace(s, seeds=s.seeds[:1]), "smooth_ap",
                                            defaults=("loss.name=smooth_ap",)))[0]
    trained, cfg = model_from_checkpoint(run / TRAINED_CHECKPOINT, measuring_device())
    count = QUICK_OPERATING_BATCHES if s.quick else OPERATING_BATCHES
    similarity = str(cfg.loss.kwargs.get("similarity", "cosine"))
    taus = [f"τ={t:g}" for t in OPERATING_TAUS]
    table = Table(["model", "B", "batches", *taus])
    fractions: dict[str, dict[str, list[float]]] = {}
    notes = []
    for name, model in (("untrained", _untrained(cfg, cfg.train.seed)), ("trained", trained)):
        emb, labels = _embed(model, cfg, "train")
        by_tau = fractions.setdefault(name, {t: [] for t in taus})
        for b in sizes:
            batches = _operating_batches(labels, b, cfg.train.m, cfg.train.seed, count)
            if not batches:
                notes.append(f"B={b} needs {b // cfg.train.m} classes with >= {cfg.train.m} images; the training "
                             f"split has fewer: left out (–).")
            values = operating_fractions(emb, labels, batches, OPERATING_TAUS, similarity=similarity)
            cells = [finite_summary(values[:, j]) for j in range(len(taus))]
            table.rows.append([name, b, len(batches), *cells])
            for tau, cell in zip(taus, cells, strict=True):
                by_tau[tau].append(cell.mean)
    figure = plot_operating_region(sizes, fractions, s.out_dir / "operating_region.png", title_note=s.recipe)
    return Findings(
        "Score differences in the sigmoid's operating region vs batch size and τ (Smooth-AP supp. Fig. S7)",
        f"m-per-class batches (m = {cfg.train.m}) of the training split of {run} (test transform), the first "
        f"{count} of an epoch per B; every query of a batch; mean ± std over batches",
        table, [figure], notes=list(dict.fromkeys(notes)))
