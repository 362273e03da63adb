"""Loader throughput: images/s decoded (and augmented) with 0, 1, 2 DataLoader workers,
on the SYNTHETIC default and on Omniglot (read straight from its zip archive).

    python benchmarks/bench_loader.py            # full run (< 10 min)
    python benchmarks/bench_loader.py --quick    # a few hundred images, to check it works

Prints a markdown table and writes it to benchmarks/results/loader.md.
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
from torch.utils.data import DataLoader, Subset

from rankopt.data import build_dataset
from rankopt.data.transforms import build_transform

REPO = Path(__file__).resolve().parents[1]
OMNIGLOT = Path(os.environ.get("RANKOPT_OMNIGLOT", REPO.parent / "shared" / "data" / "omniglot"))


def throughput(dataset, num_images: int, workers: int, batch_size: int, batch_transform=None) -> tuple[float, float]:
    """(images/s over the whole pass including worker start-up, seconds to the first batch);
    ``batch_transform`` is applied to each collated batch in the main process."""
    rng = np.random.default_rng(0)
    subset = Subset(dataset, rng.permutation(len(dataset))[:num_images].tolist())
    loader = DataLoader(subset, batch_size=batch_size, num_workers=workers, shuffle=False)
    start = time.perf_counter()
    first = None
    seen = 0
    for batch in loader:
        images = batch_transform(batch["image"]) if batch_transform is not None else batch["image"]
        seen += images.shape[0]
        first = first if first is not None else time.perf_counter() - start
    return seen / (time.perf_counter() - start), float(first or 0.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="256 images per measurement")
    parser.add_argument("--num-images", type=int, default=None, help="images per measurement (default 1536, quick 256)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "loader.md")
    args = parser.parse_args()
    num = args.num_images or (256 if args.quick else 1536)

    setups = [("synthetic", None, "synthetic_train")]
    if (OMNIGLOT / "images_background.zip").exists() or (OMNIGLOT / "images_background").is_dir():
        setups.append(("omniglot", OMNIGLOT, "train"))
    else:
        print(f"Omniglot not found at {OMNIGLOT}; skipping it", file=sys.stderr)

    rows = []
    for name, root, preset in setups:
        pipelines = [("decode only", None, None), (f"decode + `{preset}` per image", build_transform(preset), None)]
        if name == "synthetic":  # same-size images: augment whole batches
            pipelines.append((f"decode, `{preset}` per batch", None, build_transform(preset)))
        for label, transform, batch_transform in pipelines:
            ds = build_dataset(name, root, "train", transform=transform)
            for workers in args.workers:
                rate, first = throughput(ds, num, workers, args.batch_size, batch_transform)
                rows.append((name, label, workers, rate, first))
                print(f"{name:10s} {label:32s} workers={workers}: {rate:8.1f} images/s (first batch {first:.2f} s)", flush=True)

    command = "python benchmarks/bench_loader.py" + (" --quick" if args.quick else "") + (
        f" --num-images {args.num_images}" if args.num_images else ""
    )
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
        f"torch threads {torch.get_num_threads()}, Python {platform.python_version()}"
    )
    lines = [
        "# Loader throughput",
        "",
        f"- command: `{command}`",
        f"- machine: {machine}",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"- {num} images per measurement, batch size {args.batch_size}; images/s include DataLoader worker start-up.",
        "- synthetic: 56 px PNGs from rankopt's cache; omniglot: 105 px 1-bit PNGs read from `images_background.zip`.",
        "- with 0 workers the transform runs in the main process with torch's intra-op threads (slow when the machine is busy).",
        "",
        "| dataset | pipeline | workers | images/s | first batch (s) |",
        "|---|---|---:|---:|---:|",
        *[f"| {n} | {lab} | {w} | {r:.1f} | {f:.2f} |" for n, lab, w, r, f in rows],
        "",
    ]
    text = "\n".join(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
