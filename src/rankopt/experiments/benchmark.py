"""The Omniglot benchmark: every rank loss of the four papers (and the classic baselines) trained and
evaluated under identical settings, over seeds, then compared (``rankopt.report.compare``).

Settings are the ``omniglot`` recipe (2 CPU cores; see its comments); each loss keeps its paper's
hyper-parameters. ``quick`` shrinks everything (4 alphabets per split, a few steps) so the whole
grid runs in minutes, for CI. The learning rate of the recipe is chosen by :func:`tuning_specs`
runs, which train on the training alphabets minus 20 % held-out alphabets and evaluate on those
held-out alphabets (never on the test alphabets).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rankopt.experiments.runner import RunOutcome, RunSpec, run_grid

BENCHMARKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "omniglot": ("omniglot", ("data.kwargs.alphabets=4", "train.batch_size=64", "train.sampler_kwargs.super_classes_per_batch=2",
                              "train.sampler_kwargs.batches_per_super_tuple=2", "train.epochs=1",
                              "train.max_steps_per_epoch=12", "train.eval_every=1", "output.map_points=300")),
    "sop": ("roadmap_sop_resnet50", ("train.epochs=1", "train.max_steps_per_epoch=20")),
    "cub": ("roadmap_cub_resnet50", ("train.epochs=1", "train.max_steps_per_epoch=20")),
    "inat": ("roadmap_inat_resnet50", ("train.epochs=1", "train.max_steps_per_epoch=20")),
}
"""Benchmark name -> (recipe, its ``--quick`` overrides). Omniglot runs on this machine; SOP, CUB and
iNaturalist use the papers' recipes (ResNet-50, 224 px: a GPU machine) with the same command."""

LOSSES: dict[str, tuple[str, ...]] = {
    "smooth_ap": ("loss.name=smooth_ap",),  # Smooth-AP, tau = 0.01 (ECCV'20)
    "sup_ap": ("loss.name=sup_ap",),  # SupAP alone (ROADMAP without the calibration term)
    "roadmap": ("loss.name=roadmap",),  # ROADMAP: SupAP + pair calibration, lambda = 0.5 (NeurIPS'21 Eq. 2)
    "rod_ap": ("loss.name=rod_ap",),  # ROADMAP with the proxy decomposability loss, lambda = 0.1 (TPAMI Eq. 12)
    "fastap": ("loss.name=fastap",),
    "softbin_ap": ("loss.name=softbin_ap",),
    "blackbox_ap": ("loss.name=blackbox_ap",),
    "sup_recall": ("loss.name=sup_recall",),
    "rod_recall": ("loss.name=rod_recall",),
    "triplet": ("loss.name=triplet",),  # semi-hard mining, margin 0.2
    "normalized_softmax": ("loss.name=normalized_softmax",),
    "hap": ("loss.name=hap",),
    "happier": ("loss.name=happier",),
    "rod_ndcg": ("loss.name=rod_ndcg",),
}
"""The default losses: run name -> overrides (the group key of the comparison is ``loss.name``)."""

BASELINE = "smooth_ap"
TUNING_LOSSES = ("roadmap", "smooth_ap", "triplet")
TUNING_LRS = (3e-4, 1e-3, 3e-3)
VALIDATION = ("data.validation_fraction=0.2",)


@dataclass(frozen=True)
class BenchmarkResult:
    outcomes: list[RunOutcome]
    out_dir: Path
    wall_seconds: float
    comparison: dict[str, Path]


def _common(benchmark: str, root: str | None, quick: bool, extra: Sequence[str]) -> tuple[str, tuple[str, ...]]:
    """The benchmark's recipe and the overrides every one of its runs shares."""
    if benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; known: {', '.join(BENCHMARKS)}")
    if root is not None and not Path(root).expanduser().exists():
        raise FileNotFoundError(f"benchmark {benchmark!r}: dataset folder {root!r} does not exist")
    recipe, quick_overrides = BENCHMARKS[benchmark]
    return recipe, ((f"data.root={root}",) if root else ()) + (quick_overrides if quick else ()) + tuple(extra)


def _check_losses(losses: Sequence[str]) -> list[str]:
    unknown = [n for n in losses if n not in LOSSES]
    if unknown:
        raise ValueError(f"unknown benchmark loss(es) {unknown}; known: {', '.join(LOSSES)}")
    return list(losses)


def benchmark_specs(
    benchmark: str = "omniglot", *, root: str | None = None, losses: Sequence[str] | None = None,
    seeds: Sequence[int] = (0, 1, 2), quick: bool = False, extra: Sequence[str] = (),
) -> list[RunSpec]:
    """One run per (loss, seed): ``<loss>-s<seed>``, the benchmark's recipe plus the loss's overrides; the
    figures drawn from the final embeddings (grid, PR curves, t-SNE map) only for the first seed."""
    names = _check_losses(losses or list(LOSSES))
    if not seeds:
        raise ValueError("need at least one seed")
    recipe, common = _common(benchmark, root, quick, extra)
    figures = lambda seed: () if seed == seeds[0] else ("output.embedding_figures=false",)  # noqa: E731
    return [RunSpec(f"{name}-s{seed}", recipe, (*LOSSES[name], f"train.seed={seed}", *common, *figures(seed)),
                    tags={"loss": name, "seed": str(seed)})
            for name in names for seed in seeds]


def tuning_specs(
    benchmark: str = "omniglot", *, root: str | None = None, quick: bool = False, extra: Sequence[str] = (),
    lrs: Sequence[float] = TUNING_LRS, losses: Sequence[str] = TUNING_LOSSES,
) -> list[RunSpec]:
    """The learning-rate grid on the validation split carved from the training classes (seed 0)."""
    recipe, common = _common(benchmark, root, quick, (*VALIDATION, *extra))
    return [RunSpec(f"{name}-lr{lr:g}", recipe, (*LOSSES[name], f"optim.lr={lr}", "train.seed=0", *common),
                    tags={"loss": name, "lr": f"{lr:g}"})
            for name in _check_losses(losses) for lr in lrs]


def select_learning_rate(outcomes: Sequence[RunOutcome], metric: str = "map@r") -> tuple[float, dict[str, dict[str, float]]]:
    """The learning rate with the best mean validation ``metric`` over the tuning losses, and the
    table ``{lr: {loss: value}}`` it was chosen from (failed runs are left out)."""
    table: dict[str, dict[str, float]] = {}
    for o in outcomes:
        if o.status == "failed":
            continue
        trained = json.loads((o.run_dir / "report.json").read_text())["trained"]
        table.setdefault(o.spec.tags["lr"], {})[o.spec.tags["loss"]] = float(trained[metric])
    if not table:
        raise ValueError("no tuning run finished: nothing to choose from")
    best = max(table, key=lambda lr: sum(table[lr].values()) / len(table[lr]))
    return float(best), table


def run_benchmark(
    specs: Sequence[RunSpec], out_dir: str | Path, *, jobs: int = 1, baseline: str | None = BASELINE,
    by: Sequence[str] = ("loss.name",), log=print,
) -> BenchmarkResult:
    """Run the grid (resumable), then write the comparison into ``out_dir`` (``compare.{md,csv,html}``)
    and ``benchmark.json`` (runs, status, seconds, total wall time)."""
    out = Path(out_dir)
    start = time.perf_counter()
    total = len(specs)
    finished = [0]

    def report(outcome: RunOutcome) -> None:
        finished[0] += 1
        log(f"[{finished[0]}/{total}] {outcome.spec.name}: {outcome.status}"
            + (f" in {outcome.seconds:.0f} s" if outcome.status == "done" else "")
            + (f" (see {outcome.log})" if outcome.status == "failed" else ""))

    outcomes = run_grid(specs, out, jobs=jobs, on_outcome=report)
    wall = time.perf_counter() - start
    runs = [o.run_dir for o in outcomes if o.status != "failed"]
    comparison: dict[str, Path] = {}
    if runs:
        from rankopt.report.compare import compare_runs, write_comparison

        groups = {o.spec.tags.get("loss") for o in outcomes}
        comparison = write_comparison(
            compare_runs(runs, by=list(by), baseline=baseline if baseline in groups else None), out)
    _write_summary(out, outcomes, wall)
    return BenchmarkResult(outcomes, out, wall, comparison)


def _write_summary(out: Path, outcomes: Sequence[RunOutcome], wall: float) -> None:
    record = {
        "finished_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "wall_seconds_this_invocation": round(wall, 1),
        "runs": [{"name": o.spec.name, "recipe": o.spec.recipe, "overrides": list(o.spec.overrides),
                  "status": o.status, "seconds": round(o.seconds, 1), "run_dir": str(o.run_dir)} for o in outcomes],
    }
    (out / "benchmark.json").write_text(json.dumps(record, indent=2))
