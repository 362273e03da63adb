"""Decomposability gap of AP vs batch size on real Omniglot embeddings (ROADMAP Eq. 6, Fig. 5).

    DG(B) = (1/K) sum_b mAP(batch b) - mAP(whole set)

Each batch of a seeded random partition is its own retrieval set (every batch item is a
query, itself excluded), as in training. Embeddings (no network training involved):

* ``pixels-PCA``: 28x28 ink pixels, PCA to 64 dimensions fitted on the evaluated set.
* ``pixels-LDA (disjoint alphabets)``: PCA + linear discriminant analysis fitted on
  characters of *other* alphabets (a "trained" linear embedding, open-set as in retrieval).
* ``synthetic clusters (same labels)``: a labelled-synthetic control with the real labels
  (alphabet centre + character centre + noise): an embedding of controlled quality.

Small run (default): evaluate ``images_background_small1`` (2,720 images, 136 characters),
fit LDA on the 3 alphabets of ``images_background_small2`` absent from small1; AP and H-AP,
B = 16 ... 1024.
Full run (``--size full``): evaluate ``images_evaluation`` (13,180 images, 659 characters),
fit LDA on ``images_background`` (30 other alphabets); AP only (a whole-set H-AP of 13k
items takes about a minute), B = 16, 64, 256, 1024, 4096.

Writes ``benchmarks/results/decomposability.md`` and ``decomposability.png``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.decomposition import PCA
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

from rankopt.data import build_dataset
from rankopt.metrics import decomposability_gap
from rankopt.viz import plot_decomposability_gap

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data" / "omniglot"
SIDE = 28
DIM = 64
LABEL_LEVELS = {"ap": lambda labels: labels[:, 0], "h-ap": lambda labels: labels}  # metric -> labels it is computed on
SETS = {  # size -> (evaluated set, LDA training set, alphabets of the training set to drop)
    "small": (("train", "background_small1"), ("train", "background_small2"), ("Greek", "Latin")),
    "full": (("test", "background"), ("train", "background"), ()),
}


def ink_pixels(root: Path, split: str, train_set: str, drop_alphabets: tuple[str, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """``(N, 28*28)`` ink intensities in [0, 1] and ``(N, 2)`` (character, alphabet) labels."""
    ds = build_dataset("omniglot", root, split, train_set=train_set)
    keep = [i for i, p in enumerate(ds.paths) if p.split("/")[-3] not in drop_alphabets]
    x = np.stack([1.0 - np.asarray(ds.load(i).convert("L").resize((SIDE, SIDE), 2), dtype=np.float32).ravel() / 255.0 for i in keep])
    return x, ds.labels[keep]


def synthetic_clusters(labels: torch.Tensor, noise: float = 1.5, seed: int = 0) -> torch.Tensor:
    """Labelled-synthetic control with the real label structure: ``alphabet centre + character
    centre + noise`` (Gaussian centres of norm ~1; noise 1.5 gives a whole-set mAP of about 0.6)."""
    gen = torch.Generator().manual_seed(seed)
    alphabet = torch.randn(int(labels[:, 1].max()) + 1, DIM, generator=gen) / DIM**0.5
    character = torch.randn(int(labels[:, 0].max()) + 1, DIM, generator=gen) / DIM**0.5
    return alphabet[labels[:, 1]] + character[labels[:, 0]] + noise * torch.randn(len(labels), DIM, generator=gen) / DIM**0.5


def embeddings(root: Path, size: str) -> tuple[dict[str, torch.Tensor], torch.Tensor, str]:
    (split, train_set), (fit_split, fit_set), drop = SETS[size]
    x, labels = ink_pixels(root, split, train_set)
    fit_x, fit_labels = ink_pixels(root, fit_split, fit_set, drop)
    pca = PCA(n_components=DIM, random_state=0).fit(x)
    fit_pca = PCA(n_components=DIM, random_state=0).fit(fit_x)
    lda = LinearDiscriminantAnalysis(n_components=DIM).fit(fit_pca.transform(fit_x), fit_labels[:, 0])
    embs = {
        "pixels-PCA": torch.from_numpy(pca.transform(x)).float(),
        "pixels-LDA (disjoint alphabets)": torch.from_numpy(lda.transform(fit_pca.transform(x))).float(),
        "synthetic clusters (same labels)": synthetic_clusters(torch.from_numpy(labels)),
    }
    note = (f"Omniglot images_{train_set if split == 'train' else 'evaluation'}: {len(x)} images, "
            f"{len(np.unique(labels[:, 0]))} characters, {len(np.unique(labels[:, 1]))} alphabets; "
            f"LDA fitted on {len(fit_x)} images of {len(np.unique(fit_labels[:, 1]))} other alphabets")
    return embs, torch.from_numpy(labels), note


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SETS), default="small")
    parser.add_argument("--root", type=Path, default=Path(os.environ.get("RANKOPT_OMNIGLOT", DEFAULT_ROOT)))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=None,
                        help="default: 16 32 ... 1024 for --size small, 16 64 256 1024 4096 for --size full")
    parser.add_argument("--repeats", type=int, default=1, help="random partitions per batch size")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--metrics", nargs="+", choices=sorted(LABEL_LEVELS), default=None,
                        help="default: ap and h-ap for --size small, ap for --size full (whole-set H-AP of 13k items is slow)")
    args = parser.parse_args(argv)
    metrics = args.metrics or (["ap", "h-ap"] if args.size == "small" else ["ap"])
    batch_sizes = args.batch_sizes or ([16, 32, 64, 128, 256, 512, 1024] if args.size == "small" else [16, 64, 256, 1024, 4096])

    # Thousands of tiny per-batch evaluations: intra-op threads only add overhead (6x slower
    # measured on 2 loaded cores), so the benchmark runs torch on one thread.
    torch.set_num_threads(1)
    start = time.perf_counter()
    embs, labels, note = embeddings(args.root, args.size)
    rows, series = [], {}
    for name, emb in embs.items():
        series[name] = []
        for b in batch_sizes:
            cells = [name, str(b)]
            for metric in metrics:
                dg = decomposability_gap(emb, LABEL_LEVELS[metric](labels), b, metric=metric, seed=0, num_repeats=args.repeats)
                cells += [str(dg.num_batches), f"{dg.batch_mean:.4f}", f"{dg.whole:.4f}", f"{dg.gap:+.4f}"]
                if metric == "ap":
                    series[name].append(dg.gap)
            rows.append("| " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    png = plot_decomposability_gap(batch_sizes, series, args.out / "decomposability.png", metric="AP", title_note=f"Omniglot, {args.size}")
    elapsed = time.perf_counter() - start
    machine = f"{platform.platform()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}, torch {torch.__version__} (CPU, 1 thread)"
    header = ["embedding", "batch size"] + [f"{c} {m.upper()}" for m in metrics for c in ("batches used", "batch", "whole", "DG")]
    table = "\n".join([
        "# Decomposability gap of AP vs batch size (ROADMAP Eq. 6)",
        "",
        f"- Command: `{' '.join(['python', 'benchmarks/analysis_decomposability.py', *(argv if argv is not None else sys.argv[1:])])}`",
        f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; machine: {machine}; total {elapsed:.0f} s",
        f"- Data: {note}. The first two embeddings are real Omniglot pixels; the third is labelled-synthetic.",
        f"- DG = mean over batches of M(batch) - M(whole set), M = mAP over queries; batches = seeded random partitions "
        f"(repeats: {args.repeats}), each batch its own retrieval set, self excluded; batches where no query has a positive "
        "are skipped (`rankopt.metrics.decomposability_gap`). AP at the character level; H-AP with (character, alphabet) labels.",
        "",
        "| " + " | ".join(header) + " |",
        "|---|" + "---:|" * (len(header) - 1),
        *rows,
        "",
        f"![DG vs batch size]({png.name})",
        "",
    ])
    (args.out / "decomposability.md").write_text(table)
    print(f"wrote {args.out / 'decomposability.md'} and {png} in {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
