"""What each step of the landmark-retrieval toolbox adds on a benchmark's test classes (Omniglot, Caltech-101).

    python benchmarks/landmark_toolbox.py --runs benchmarks/runs/omniglot --root ../shared/data/omniglot
    python benchmarks/landmark_toolbox.py --runs RUNS --losses roadmap sup_ap \
        --out benchmarks/results/landmark_toolbox_caltech101           # RUNS: rankopt benchmark caltech101 --out RUNS

Steps (``rankopt.postprocess``): multi-scale descriptors (1, 1/sqrt 2, 1/2), PCA whitening,
supervised whitening, DBA and αQE, alone and all together, on the checkpoints of a benchmark
(``RUNS/<loss>-s<seed>/checkpoints/last.ckpt``, the final model: ``best.ckpt`` is chosen
on the test classes the recipe evaluates; produce them with ``rankopt benchmark NAME --out RUNS``).
The dataset is the checkpoint's (its folder: ``--root``, else the checkpoint config's ``data.root``).
Whitening is fitted on the checkpoint's training classes, never the test classes. Hyper-parameters are
either the papers' values or chosen on a class-disjoint validation split of whole training classes at the
coarsest level (Omniglot: alphabets)
(``rankopt.data.splits.held_out_classes``; the whitening then fitted on the other training
classes), per checkpoint, then refitted on all training classes. Each split is embedded once
per checkpoint and scale setting. ``--roxford DIR`` (Revisited Oxford, when present) adds the
landmark protocol's Medium/Hard mAP with the same steps.

Writes ``benchmarks/results/landmark_toolbox.md`` and ``.csv``.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import io
import itertools
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rankopt.config import EvalConfig
from rankopt.data import build_dataset
from rankopt.data.splits import held_out_classes
from rankopt.engine.assembly import build_transforms, model_from_checkpoint
from rankopt.engine.embed_and_score import EmbeddedSplit, embed_dataset, score
from rankopt.describe import machine_info
from rankopt.files import write_text_atomic
from rankopt.models.multiscale import DEFAULT_SCALES
from rankopt.postprocess import Expansion, PostProcessing, fit_pca_whitening, fit_supervised_whitening
from rankopt.report.stats import paired_difference, summarize
from rankopt.runtime import keep_allocations

RESULTS = Path(__file__).resolve().parent / "results"
DATA = {
    "omniglot": "Omniglot test alphabets (self-retrieval, each query excluded by index), 32 px characters",
    "caltech101": "Caltech-101 test classes (the last 50 categories, 3,063 photos, self-retrieval, each query excluded "
                  "by index), 128 px",
}
"""What the table's data are, per dataset of the checkpoints."""
METRICS = ("map", "map@r", "recall@1")
SELECT_ON = "map"
PCA_GRID = [{"power": p, "shrinkage": b} for p in (0.25, 0.5) for b in (0.0, 0.1, 0.3)]
SUPERVISED_GRID = [{"shrinkage": b} for b in (0.0, 0.1, 0.3)]
EXPANSION_GRID = [Expansion(k, a) for k in (1, 2, 3, 5, 10) for a in (1.0, 2.0, 3.0)]
PAPER_PCA = {"power": 0.25, "shrinkage": 0.0}  # ICCV'19 §5: square-rooted PCA
PAPER_EXPANSION = Expansion(10, 2.0)  # ICCV'19 §5: αQE with α = 2, k = 10


@dataclasses.dataclass
class Embedded:
    """Embeddings of one checkpoint's training and test classes at one scale setting."""

    train: EmbeddedSplit
    test: EmbeddedSplit


class SingleAndMultiScale(torch.nn.Module):
    """``[model(x), multi-scale model(x)]`` side by side, so each split is decoded once for both."""

    def __init__(self, model: torch.nn.Module, scales: tuple[float, ...]) -> None:
        super().__init__()
        self.single, self.multi = model, PostProcessing(scales=scales).wrap_model(model)
        self.embedding_dim = 2 * model.embedding_dim

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.single(images), self.multi(images)], dim=1)


def embed(model: torch.nn.Module, datasets: dict[str, Any], transform: Any) -> tuple[Embedded, Embedded]:
    """(single-scale, multi-scale) embeddings of the ``train`` and ``test`` datasets."""
    both = {name: embed_dataset(SingleAndMultiScale(model, DEFAULT_SCALES), ds, batch_size=512, show_progress=False,
                                batch_transform=transform) for name, ds in datasets.items()}
    halves = []
    for half in (0, 1):
        parts = {name: dataclasses.replace(split, embeddings=split.embeddings.chunk(2, dim=1)[half].contiguous())
                 for name, split in both.items()}
        halves.append(Embedded(parts["train"], parts["test"]))
    return halves[0], halves[1]


def rows_of(split: EmbeddedSplit, mask: np.ndarray) -> EmbeddedSplit:
    index = torch.from_numpy(np.flatnonzero(mask))
    return EmbeddedSplit(split.embeddings[index], split.labels[index], [split.paths[i] for i in index.tolist()])


def metrics_of(split: EmbeddedSplit, post: PostProcessing) -> dict[str, float]:
    return dict(score([split], EvalConfig(metrics=list(METRICS)), postprocessing=post).metrics)


def fit_whitening(kind: str, split: EmbeddedSplit, params: dict[str, float], name: str) -> Any:
    if kind == "pca":
        return fit_pca_whitening(split.embeddings, fitted_on=name, **params)
    return fit_supervised_whitening(split.embeddings, split.labels, fitted_on=name, **params)


def choose(candidates: list[Any], evaluate: Any) -> tuple[Any, float]:
    """The candidate with the best validation ``SELECT_ON`` (first on ties) and its value."""
    values = [evaluate(c)[SELECT_ON] for c in candidates]
    best = int(np.argmax(values))
    return candidates[best], values[best]


def checkpoint_rows(path: Path, root: Path | None, val_fraction: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every table row's metrics for one checkpoint, and the chosen hyper-parameters."""
    model, cfg = model_from_checkpoint(path)
    root = root or cfg.data.root
    transform = build_transforms(cfg)[1] if cfg.data.batch_transform else None
    test_tf = None if transform is not None else build_transforms(cfg)[1]
    datasets = {s: build_dataset(cfg.data.name, root, s, transform=test_tf, **cfg.data.kwargs) for s in ("train", "test")}
    single, multi = embed(model, datasets, transform)

    # class-disjoint validation: whole training classes of the coarsest level held out (Omniglot: alphabets)
    labels = single.train.labels.numpy()
    held = np.isin(labels[:, -1], held_out_classes(labels, val_fraction, level=-1, seed=0))
    fit_part, val = rows_of(single.train, ~held), rows_of(single.train, held)

    def val_metrics_whitened(kind: str) -> Any:
        return lambda params: metrics_of(val, PostProcessing(whitening=fit_whitening(kind, fit_part, params, "fit")))

    pca, _ = choose(PCA_GRID, val_metrics_whitened("pca"))
    supervised, _ = choose(SUPERVISED_GRID, val_metrics_whitened("supervised"))
    dba, _ = choose(EXPANSION_GRID, lambda e: metrics_of(val, PostProcessing(dba=e)))
    qe, _ = choose(EXPANSION_GRID, lambda e: metrics_of(val, PostProcessing(qe=e)))
    def better_whitening(embedded: Embedded) -> tuple[str, dict[str, float]]:
        """PCA or supervised (as chosen above), whichever gives the better validation score with DBA and αQE."""
        fit, held_out = rows_of(embedded.train, ~held), rows_of(embedded.train, held)
        return choose([("pca", pca), ("supervised", supervised)], lambda kp: metrics_of(
            held_out, PostProcessing(whitening=fit_whitening(kp[0], fit, kp[1], "fit"), dba=dba, qe=qe)))[0]

    kind_single, kind_all = better_whitening(single), better_whitening(multi)

    name = f"{cfg.data.name}/train"
    full_pca = fit_whitening("pca", single.train, pca, name)
    rows = [
        ("baseline", single.test, PostProcessing()),
        ("+ multi-scale (1, 1/√2, 1/2)", multi.test, PostProcessing()),
        ("+ PCA whitening, paper: power 0.25", single.test,
         PostProcessing(whitening=fit_whitening("pca", single.train, PAPER_PCA, name))),
        ("+ PCA whitening, validated", single.test, PostProcessing(whitening=full_pca)),
        ("+ supervised whitening, validated", single.test,
         PostProcessing(whitening=fit_whitening("supervised", single.train, supervised, name))),
        ("+ DBA, validated", single.test, PostProcessing(dba=dba)),
        ("+ αQE, paper: k 10, α 2", single.test, PostProcessing(qe=PAPER_EXPANSION)),
        ("+ αQE, validated", single.test, PostProcessing(qe=qe)),
        ("+ whitening, DBA, αQE (single scale), validated", single.test,
         PostProcessing(whitening=fit_whitening(kind_single[0], single.train, kind_single[1], name), dba=dba, qe=qe)),
        ("+ all (multi-scale, whitening, DBA, αQE), validated", multi.test,
         PostProcessing(whitening=fit_whitening(kind_all[0], multi.train, kind_all[1], name), dba=dba, qe=qe)),
    ]
    chosen = {"pca": pca, "supervised": supervised, "dba": (dba.k, dba.alpha), "qe": (qe.k, qe.alpha),
              "whitening_single": kind_single[0], "whitening_all": kind_all[0]}
    return [{"row": label, **metrics_of(split, post)} for label, split, post in rows], chosen


def roxford_rows(path: Path, roxford: Path) -> list[dict[str, Any]]:
    """Medium/Hard mAP on Revisited Oxford (query vs gallery) with the steps that need no training split."""
    model, cfg = model_from_checkpoint(path)
    _, test_tf = build_transforms(cfg)
    splits = {s: build_dataset("revisited_oxford", roxford, s, transform=test_tf) for s in ("query", "gallery")}
    out = []
    for label, scales, post in [("baseline", None, PostProcessing()),
                                ("+ multi-scale", DEFAULT_SCALES, PostProcessing()),
                                ("+ αQE, paper: k 10, α 2", None, PostProcessing(qe=PAPER_EXPANSION))]:
        embedder = PostProcessing(scales=scales).wrap_model(model)
        embedded = [embed_dataset(embedder, ds, batch_size=1, show_progress=False) for ds in splits.values()]
        result = score(embedded, EvalConfig(), postprocessing=post)
        out.append({"row": label, **{k: v for k, v in result.metrics.items() if k.endswith("/map")}})
    return out


def table(results: dict[str, list[dict[str, Any]]]) -> tuple[str, list[list[Any]]]:
    """Markdown rows (mean ± sd over seeds; paired difference to the baseline) and CSV rows."""
    labels = [r["row"] for r in next(iter(results.values()))]
    head = "| step | " + " | ".join(f"{m} (mean ± sd) | Δ {m} vs baseline" for m in METRICS) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(METRICS))]
    csv_rows: list[list[Any]] = [["row", "checkpoint", *METRICS]]
    for i, label in enumerate(labels):
        cells = [label]
        for metric in METRICS:
            values = [rows[i][metric] for rows in results.values()]
            base = [rows[0][metric] for rows in results.values()]
            s = summarize(values)
            cells.append(f"{100 * s.mean:.2f} ± {100 * s.std:.2f}")
            if i == 0:
                cells.append("—")
            else:
                d = paired_difference(values, base)
                cells.append(f"{100 * d.mean:+.2f} ± {100 * d.std:.2f}" + (" *" if d.significant() else ""))
        lines.append("| " + " | ".join(cells) + " |")
        for ckpt, rows in results.items():
            csv_rows.append([label, ckpt, *(f"{rows[i][m]:.6f}" for m in METRICS)])
    return "\n".join(lines), csv_rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=Path("benchmarks/runs/omniglot"),
                        help="a benchmark's output folder (rankopt benchmark NAME --out RUNS)")
    parser.add_argument("--root", type=Path, help="the dataset's folder (default: each checkpoint's data.root)")
    parser.add_argument("--losses", nargs="+", default=["roadmap", "smooth_ap"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--val-fraction", type=float, default=0.2, help="training classes (coarsest level) held out for validation")
    parser.add_argument("--roxford", type=Path, help="Revisited Oxford folder (rankopt dataset roxford5k), if present")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=RESULTS / "landmark_toolbox")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    keep_allocations()  # as every rankopt command does (rankopt.runtime)
    start = time.perf_counter()

    sections = []
    csv_rows: list[list[Any]] = []
    for loss in args.losses:
        results, chosen = {}, {}
        for seed in args.seeds:
            path = args.runs / f"{loss}-s{seed}" / "checkpoints" / "last.ckpt"
            if not path.is_file():
                raise FileNotFoundError(f"{path} is missing: run `rankopt benchmark NAME --out {args.runs}` first")
            results[f"{loss}-s{seed}"], chosen[f"{loss}-s{seed}"] = checkpoint_rows(path, args.root, args.val_fraction)
            print(f"{loss}-s{seed} done at {time.perf_counter() - start:.0f} s", file=sys.stderr)
        md, rows = table(results)
        csv_rows += rows if not csv_rows else rows[1:]
        picks = "\n".join(f"- {ckpt}: PCA {c['pca']}, supervised {c['supervised']}, DBA (k, α) {c['dba']}, "
                          f"αQE (k, α) {c['qe']}, whitening with DBA+αQE: {c['whitening_single']} "
                          f"(single scale), {c['whitening_all']} (multi-scale)" for ckpt, c in chosen.items())
        sections.append(f"### {loss} ({len(args.seeds)} seeds)\n\n{md}\n\nValidated choices:\n{picks}\n")

    if args.roxford is not None and args.roxford.exists():
        rox = {f"{loss}-s{seed}": roxford_rows(args.runs / f"{loss}-s{seed}" / "checkpoints" / "last.ckpt", args.roxford)
               for loss, seed in itertools.product(args.losses, args.seeds)}
        rox_lines = ["| checkpoint | step | medium/map | hard/map |", "|---|---|---|---|"]
        rox_lines += [f"| {c} | {r['row']} | {100 * r.get('medium/map', float('nan')):.2f} | "
                      f"{100 * r.get('hard/map', float('nan')):.2f} |" for c, rows in rox.items() for r in rows]
        roxford = "\n".join(rox_lines)
    else:
        roxford = ("Revisited Oxford/Paris are not on this machine (no `--roxford DIR`): no landmark rows. With "
                   "`--roxford DIR` the script adds Medium/Hard mAP for the baseline, multi-scale and αQE.")

    seconds = time.perf_counter() - start
    body = "\n".join(sections)
    command = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    dataset = model_from_checkpoint(args.runs / f"{args.losses[0]}-s{args.seeds[0]}" / "checkpoints" / "last.ckpt")[1].data.name
    classes = "alphabets" if dataset == "omniglot" else "classes"
    doc = f"""# Landmark toolbox on {dataset}: what each post-processing step adds

Generated by `benchmarks/landmark_toolbox.py` on {datetime.date.today().isoformat()} in {seconds / 60:.1f} min.

    {command}

Machine: {machine_info("cpu")}

Data: {DATA.get(dataset, dataset + " test split")}, the benchmark's final model (`last.ckpt`) per loss and
seed. Metrics in %, mean ± sample sd over the seeds;
Δ = paired difference to the baseline of the same checkpoint (mean ± sd; `*`: paired t-test p < 0.05).

Hyper-parameters: "paper" rows use fixed values (ICCV'19 §5: square-rooted PCA, power 0.25; αQE with
α = 2, k = 10). "validated" rows choose, per checkpoint, by {SELECT_ON} on a class-disjoint validation split of
{args.val_fraction:.0%} of the *training* {classes} (whitening fitted on the other training {classes}), then refit
on all training {classes}: PCA power {{0.25, 0.5}} × shrinkage {{0, 0.1, 0.3}} (full dim); supervised whitening
shrinkage {{0, 0.1, 0.3}} (all same-class pairs, ≤ 1000 per class); DBA/αQE k {{1, 2, 3, 5, 10}} × α {{1, 2, 3}}.
The test {classes} are never used to fit or choose anything.

{body}
## Revisited Oxford / Paris

{roxford}
"""
    write_text_atomic(args.out.with_suffix(".md"), doc)
    buffer = io.StringIO()
    csv.writer(buffer).writerows(csv_rows)
    write_text_atomic(args.out.with_suffix(".csv"), buffer.getvalue())
    print(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
