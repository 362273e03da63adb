"""The benchmarks: losses (and reference rows) trained and evaluated under identical settings, over seeds,
then compared (``rankopt.report.compare``).

- ``omniglot``: every rank loss of the four papers and the classic baselines, from scratch (recipe ``omniglot``).
- ``caltech101``: an ImageNet-pretrained MobileNetV2 fine-tuned on Caltech-101's training classes (recipe
  ``caltech101``) by ten losses, with two reference rows: the pretrained features without fine-tuning, and
  ROADMAP from random weights.
- ``yaleb``: the released MobileFaceNet zero-shot on Yale B's test identities, and fine-tuned by Smooth-AP,
  ROADMAP, contrastive and triplet (Smooth-AP §6.3 / Table 4 in miniature; recipe ``yaleb_mobilefacenet``).

Each loss keeps its paper's hyper-parameters. ``quick`` shrinks everything so the whole grid runs in
minutes, for CI. The learning rate of a recipe is chosen by :func:`tuning_specs` runs, which train on the
training classes minus 20 % held out and evaluate on those held-out classes (never on the test classes).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from rankopt.experiments.runner import RUN_THREADS, RunOutcome, RunSpec, run_grid
from rankopt.layout import REPORT_JSON
from rankopt.report import compare_runs, write_comparison

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
    "proxy_anchor": ("loss.name=proxy_anchor",),  # Proxy-Anchor (CVPR'20), proxies at 100x the learning rate
    "arcface": ("loss.name=arcface",),  # ArcFace, margin 28.6 degrees, scale 64 (PML's defaults)
    "hap": ("loss.name=hap",),
    "happier": ("loss.name=happier",),
    "rod_ndcg": ("loss.name=rod_ndcg",),
}
"""The Omniglot benchmark's losses: run name -> overrides (the group key of the comparison is ``loss.name``)."""

PHOTO_LOSSES = ("smooth_ap", "sup_ap", "roadmap", "fastap", "softbin_ap", "rod_ap", "triplet", "contrastive",
                "multi_similarity", "normalized_softmax", "proxy_anchor", "arcface", "supcon")
FACE_LOSSES = ("smooth_ap", "roadmap", "contrastive", "triplet", "arcface")  # Smooth-AP Table 4's rows
CLASS_MEAN_INIT = ("rod_ap", "normalized_softmax", "arcface")
"""Losses whose class weights start, from a pretrained backbone, at the class means of its training embeddings
(``loss.init=class_means``), not at random directions that pull good features apart. Chosen on Caltech-101's
validation classes (10 of the 50 training classes, seed 0; zero-shot mAP@R 0.8684): class means against random,
ArcFace 0.8659 / 0.8398, normalized softmax 0.8599 / 0.6779; Proxy-Anchor is better from random proxies (0.8482 /
0.8702: its proxies learn at 100 × the rate), so it keeps its paper's init (docs/baselines.md)."""
CALTECH_LRS = {"arcface": 1e-5, "supcon": 1.11e-6, "proxy_anchor": 1e-4}
"""Caltech-101 rows with a learning rate of their own, each chosen like the recipe's 3e-5 (SupAP, Smooth-AP): by
``rankopt benchmark caltech101 --tune --losses NAME`` on 10 of the 50 training classes, the grid extended beyond a
winning end (validation mAP@R; zero-shot 0.8684). ArcFace: 3.33e-6 0.8692, 1e-5 0.8712, 3e-5 0.8659, 1e-4 0.8383.
SupCon: 3.7e-7 0.8687, 1.11e-6 0.8691, 3.33e-6 0.8684, 1e-5 0.8610, 3e-5 0.8594, 1e-4 0.8372. Proxy-Anchor (random
proxies): 1e-5 0.8625, 3e-5 0.8702, 1e-4 0.8774, 3.33e-4 0.8363."""
GRID_EXTENSIONS = 3
"""At most this many learning rates are added beyond a tuning grid's end while its best value sits on that end."""
WEIGHTS = "{weights}"
"""Stands, in a row's overrides, for the pretrained weights file given to the benchmark (``--weights``)."""


@dataclass(frozen=True)
class Benchmark:
    """A benchmark: a recipe, the rows it compares (row name -> overrides) and how they are grouped.

    ``group_by``: the config key(s) the comparison groups runs by; with ``("name",)`` every run gets
    ``name=<row>``, so rows may share a loss (reference rows). ``weights_env``: the environment variable
    naming the pretrained weights file that replaces :data:`WEIGHTS` in overrides (or ``--weights``);
    ``root_env``: the one naming the dataset folder (or ``--root``).
    """

    recipe: str
    quick: tuple[str, ...]
    rows: dict[str, tuple[str, ...]]
    baseline: str = "smooth_ap"
    group_by: tuple[str, ...] = ("loss.name",)
    tuning_rows: tuple[str, ...] = ("roadmap", "smooth_ap", "triplet")
    lrs: tuple[float, ...] = (3e-4, 1e-3, 3e-3)
    weights_env: str | None = None
    root_env: str | None = None  # the environment variable naming the dataset folder when --root is not given


_PRETRAINED = ("model.pretrained=true", f"model.kwargs.pretrained_path={WEIGHTS}")
_RELEASED = ("train.epochs=0",)  # the released weights evaluated as they are: every seed gives the same values


def _init(loss: str) -> tuple[str, ...]:
    """``loss.init=class_means`` for the losses of :data:`CLASS_MEAN_INIT`."""
    return ("loss.init=class_means",) if loss in CLASS_MEAN_INIT else ()


BENCHMARKS: dict[str, Benchmark] = {
    "omniglot": Benchmark("omniglot", ("data.kwargs.alphabets=4", "train.batch_size=64",
                                       "train.sampler_kwargs.super_classes_per_batch=2",
                                       "train.sampler_kwargs.batches_per_super_tuple=2",
                                       # 12 steps as 3 epochs of 4: learning curves of 4 evaluations
                                       "train.epochs=3", "train.max_steps_per_epoch=4", "output.map_points=300"),
                          LOSSES),
    # ImageNet-pretrained MobileNetV2 fine-tuned on Caltech-101's first 50 classes (recipe caltech101), every loss
    # under identical settings; reference rows: the pretrained features as they are, and ROADMAP from random weights
    # (every stage trained, BatchNorm statistics updated: frozen statistics of random weights normalise nothing)
    "caltech101": Benchmark(
        "caltech101", ("train.epochs=3", "train.max_steps_per_epoch=1", "data.image_size=64", "output.map_points=300"),
        {"pretrained": (*_PRETRAINED, *_RELEASED),
         **{loss: (f"loss.name={loss}", *_PRETRAINED, *_init(loss),
                   *((f"optim.lr={CALTECH_LRS[loss]}",) if loss in CALTECH_LRS else ())) for loss in PHOTO_LOSSES},
         "roadmap_random_init": ("loss.name=roadmap", "model.pretrained=false", "model.freeze=[]",
                                 "model.freeze_bn=false")},
        group_by=("name",), weights_env="RANKOPT_WEIGHTS_MOBILENETV2", root_env="RANKOPT_CALTECH101",
        tuning_rows=("roadmap", "smooth_ap"), lrs=(1e-5, 3e-5, 1e-4)),
    # Smooth-AP §6.3 in miniature: the released MobileFaceNet (CASIA-WebFace) zero-shot on the test identities of
    # Extended Yale B, then fine-tuned on its training identities with Table 4's losses
    "yaleb": Benchmark(
        "yaleb_mobilefacenet", ("train.epochs=3", "train.max_steps_per_epoch=1"),
        {"released": (*_PRETRAINED, *_RELEASED),
         **{loss: (f"loss.name={loss}", *_PRETRAINED, *_init(loss)) for loss in FACE_LOSSES},
         # Smooth-AP's own recipe for faces (§6.3, Table 4): its loss appended to a classification loss
         "arcface_smooth_ap": ("loss.name=arcface+smooth_ap", "loss.kwargs.smooth_ap.tau=0.01", *_PRETRAINED,
                               *_init("arcface"))},
        baseline="released", group_by=("name",), tuning_rows=("smooth_ap", "contrastive"),
        weights_env="RANKOPT_WEIGHTS_MOBILEFACENET", root_env="RANKOPT_YALEB", lrs=(1e-5, 1e-4, 1e-3)),
    "sop": Benchmark("roadmap_sop_resnet50", ("train.epochs=1", "train.max_steps_per_epoch=20"), LOSSES),
    "cub": Benchmark("roadmap_cub_resnet50", ("train.epochs=1", "train.max_steps_per_epoch=20"), LOSSES),
    "inat": Benchmark("roadmap_inat_resnet50", ("train.epochs=1", "train.max_steps_per_epoch=20"), LOSSES),
}
"""Benchmark name -> definition. Omniglot, Caltech-101 and Yale B run on this machine; SOP, CUB and iNaturalist
use the papers' recipes (ResNet-50, 224 px: a GPU machine) with the same command."""

BASELINE = "smooth_ap"
VALIDATION = ("data.validation_fraction=0.2",)


@dataclass(frozen=True)
class BenchmarkResult:
    outcomes: list[RunOutcome]
    out_dir: Path
    wall_seconds: float
    comparison: dict[str, Path]


def get_benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


def _common(benchmark: Benchmark, name: str, root: str | None, quick: bool, extra: Sequence[str]) -> tuple[str, ...]:
    """The overrides every run of the benchmark shares."""
    root = root or (os.environ.get(benchmark.root_env) if benchmark.root_env else None)
    if root is not None and not Path(root).expanduser().exists():
        raise FileNotFoundError(f"benchmark {name!r}: dataset folder {root!r} does not exist")
    return ((f"data.root={root}",) if root else ()) + (benchmark.quick if quick else ()) + tuple(extra)


def _rows(benchmark: Benchmark, name: str, rows: Sequence[str] | None,
          weights: str | None) -> dict[str, tuple[str, ...]]:
    """The chosen rows' overrides with the weights file in place (``name=<row>`` when rows are grouped by name)."""
    chosen = list(rows or benchmark.rows)
    unknown = [r for r in chosen if r not in benchmark.rows]
    if unknown:
        raise ValueError(f"unknown benchmark loss(es)/row(s) {unknown} for {name!r}; known: "
                         f"{', '.join(benchmark.rows)}")
    if any(WEIGHTS in o for r in chosen for o in benchmark.rows[r]):
        weights = weights or (os.environ.get(benchmark.weights_env) if benchmark.weights_env else None)
        if not weights:
            raise ValueError(f"benchmark {name!r} starts from pretrained weights: pass --weights FILE"
                             + (f" or set {benchmark.weights_env}" if benchmark.weights_env else ""))
        if not Path(weights).is_file():
            raise FileNotFoundError(f"benchmark {name!r}: weights file {weights!r} does not exist")
    named = benchmark.group_by == ("name",)
    return {r: ((f"name={r}",) if named else ()) + tuple(o.replace(WEIGHTS, str(weights)) for o in benchmark.rows[r])
            for r in chosen}


def benchmark_specs(
    benchmark: str = "omniglot", *, root: str | None = None, losses: Sequence[str] | None = None,
    seeds: Sequence[int] = (0, 1, 2), quick: bool = False, extra: Sequence[str] = (), weights: str | None = None,
) -> list[RunSpec]:
    """One run per (row, seed): ``<row>-s<seed>``, the benchmark's recipe plus the row's overrides; the
    figures drawn from the final embeddings (grid, PR curves, t-SNE map) only for the first seed."""
    if not seeds:
        raise ValueError("need at least one seed")
    bench = get_benchmark(benchmark)
    rows = _rows(bench, benchmark, losses, weights)
    common = _common(bench, benchmark, root, quick, extra)
    figures = lambda seed: () if seed == seeds[0] else ("output.embedding_figures=false",)  # noqa: E731
    return [RunSpec(f"{name}-s{seed}", bench.recipe, (*overrides, f"train.seed={seed}", *common, *figures(seed)),
                    tags={"loss": name, "seed": str(seed)})
            for name, overrides in rows.items() for seed in seeds]


def tuning_specs(
    benchmark: str = "omniglot", *, root: str | None = None, quick: bool = False, extra: Sequence[str] = (),
    lrs: Sequence[float] | None = None, losses: Sequence[str] | None = None, weights: str | None = None,
) -> list[RunSpec]:
    """The learning-rate grid on the validation split carved from the training classes (seed 0)."""
    bench = get_benchmark(benchmark)
    rows = _rows(bench, benchmark, losses or bench.tuning_rows, weights)
    common = _common(bench, benchmark, root, quick, (*VALIDATION, *extra))
    return [RunSpec(f"{name}-lr{lr:g}", bench.recipe, (*overrides, f"optim.lr={lr}", "train.seed=0", *common),
                    tags={"loss": name, "lr": f"{lr:g}"})
            for name, overrides in rows.items() for lr in (lrs or bench.lrs)]


def select_learning_rate(outcomes: Sequence[RunOutcome],
                         metric: str = "map@r") -> tuple[float, dict[str, dict[str, float]]]:
    """The learning rate with the best mean validation ``metric`` over the tuning losses, and the
    table ``{lr: {loss: value}}`` it was chosen from (failed runs are left out)."""
    table: dict[str, dict[str, float]] = {}
    for o in outcomes:
        if o.status == "failed":
            continue
        trained = json.loads((o.run_dir / REPORT_JSON).read_text())["trained"]
        table.setdefault(o.spec.tags["lr"], {})[o.spec.tags["loss"]] = float(trained[metric])
    if not table:
        raise ValueError("no tuning run finished: nothing to choose from")
    best = max(table, key=lambda lr: sum(table[lr].values()) / len(table[lr]))
    return float(best), table


def run_benchmark(
    specs: Sequence[RunSpec], out_dir: str | Path, *, jobs: int = 1, threads: int = RUN_THREADS,
    baseline: str | None = BASELINE, by: Sequence[str] = ("loss.name",), log=print,
) -> BenchmarkResult:
    """Run the grid (resumable; each run on ``threads`` torch threads whatever ``jobs`` is), then write the
    comparison into ``out_dir`` (``compare.{md,csv,html}``, each run's values with its threads and commit) and
    ``benchmark.json`` (runs, status, seconds, total wall time)."""
    out = Path(out_dir)
    start = time.perf_counter()
    total = len(specs)
    finished = [0]

    def report(outcome: RunOutcome) -> None:
        finished[0] += 1
        log(f"[{finished[0]}/{total}] {outcome.spec.name}: {outcome.status}"
            + (f" in {outcome.seconds:.0f} s" if outcome.status == "done" else "")
            + (f" (see {outcome.log})" if outcome.status == "failed" else ""))

    outcomes = run_grid(specs, out, jobs=jobs, threads=threads, on_outcome=report)
    wall = time.perf_counter() - start
    runs = [o.run_dir for o in outcomes if o.status != "failed"]
    comparison: dict[str, Path] = {}
    if runs:
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
