"""Inference at the runtime's speed: ``rankopt index`` with its defaults against onnxruntime's forward alone.

    python benchmarks/bench_runtimes.py --root $RANKOPT_CALTECH101 --weights $RANKOPT_WEIGHTS_MOBILENETV2
    python benchmarks/bench_runtimes.py --root DIR --weights W --photos 200 --quick    # checks it runs

In one run, on one machine, each measurement alone on it:

(1) the network alone (MobileNetV2, its released weights, 224 px), PyTorch (``keep_allocations()``) and
    onnxruntime (the export :mod:`rankopt.export.runtimes` caches), ``--threads`` each, on batches already decoded
    and transformed: batch 1 (ms) and batch 32 (images/s), rounds alternated, the best of the rounds' medians;
(2) ``rankopt index WEIGHTS --images DIR --out OUT`` on ``--photos`` Caltech-101 photos (the first of each class in
    turn), read warm (the files read once before), as a person runs it: with its defaults, then with
    ``--runtime torch``, three runs each (one with ``--quick``): the fastest run's photos/s and its CPU time in the
    kernel against the process's (GNU ``time``), and the median run's wall time; each run with its defaults is also
    paired with onnxruntime's forward alone over as many images timed just before it (the machine's speed drifts
    within minutes: the pairs' median ratio is the steadier figure);
(3) the embedder from Python, onnxruntime, with and without the threads that read the next photos during the forward
    (``Embedder(read_threads=0)``), the readers at the forward's priority or lowered (``READ_NICENESS``): what the
    overlap gives;
(4) reading alone: each photo read, decoded and transformed (the embedder's dataset) on one thread, CPU seconds per
    photo; with the forward's CPU seconds per photo (``--threads`` / (1)'s rate), the most any pass doing both on the
    machine's cores can embed: ``cores / (forward + reading)`` photos/s.

``--weights`` may be any checkpoint (``rankopt weights fetch NAME``): its test transform sets the size.

Target (issue 42): (2) with its defaults >= 0.7 x onnxruntime's forward alone (1), at most 10 % of the CPU time in
the kernel. Writes ``--out`` (default benchmarks/results/runtimes.md).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rankopt.data import reader
from rankopt.data.transforms import output_size
from rankopt.engine.assembly import inference_preprocessing, model_from_checkpoint
from rankopt.export.runtimes import prepare_network
from rankopt.models.fingerprint import model_fingerprint
from rankopt.runtime import keep_allocations
from rankopt.search import Embedder
from rankopt.search.embedder import as_dataset

REPO = Path(__file__).resolve().parents[1]


def photos(root: Path, count: int) -> list[Path]:
    """``count`` JPEGs of Caltech-101, the first of each class in turn (sorted names), so every class is present."""
    classes = [sorted(c.glob("*.jpg")) for c in sorted(root.iterdir()) if c.is_dir() and c.name != "BACKGROUND_Google"]
    out: list[Path] = []
    for rank in range(max(len(c) for c in classes)):
        out += [c[rank] for c in classes if rank < len(c)]
    return out[:count]


def median_s(run: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def described(weights: Path) -> tuple[str, tuple[int, int]]:
    """The checkpoint's backbone name and its test transform's ``(H, W)``."""
    _, cfg = model_from_checkpoint(weights, "cpu")
    return cfg.model.backbone, output_size(cfg.data.test_transform, cfg.data.image_size)


def _networks(weights: Path, threads: int) -> tuple[torch.nn.Module, torch.nn.Module, tuple[int, int]]:
    """``(PyTorch model, its onnxruntime network, (H, W))`` of the checkpoint, ``threads`` each."""
    torch.set_num_threads(threads)
    model, cfg = model_from_checkpoint(weights, "cpu")
    model.eval()
    preprocessing = inference_preprocessing(cfg)
    onnx, _ = prepare_network(model, preprocessing, model_fingerprint(model, preprocessing), runtime="onnx",
                              threads=threads)
    return model, onnx, output_size(cfg.data.test_transform, cfg.data.image_size)


def onnx_pass(weights: Path, threads: int, images: int) -> Callable[[], float]:
    """A function timing onnxruntime's forward alone over ``images`` images (batches of 32 of one decoded,
    transformed batch), in images/s: the same work as the index command's network, timed right before each of its
    runs so that both see the machine at the same speed."""
    _, onnx, size = _networks(weights, threads)
    batch = torch.randn(32, 3, *size, generator=torch.Generator().manual_seed(0))
    onnx(batch)  # warm-up
    batches = -(-images // 32)

    def timed() -> float:
        began = time.perf_counter()
        for _ in range(batches):
            onnx(batch)
        return 32 * batches / (time.perf_counter() - began)
    return timed


def forward_alone(weights: Path, threads: int, rounds: int, runs: int) -> dict[str, dict[int, float]]:
    """``{runtime: {batch: seconds per batch}}``, the best median of ``rounds`` alternated rounds."""
    model, onnx, size = _networks(weights, threads)
    best: dict[str, dict[int, float]] = {"pytorch": {}, "onnxruntime": {}}
    for batch in (1, 32):
        images = torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(0))
        for name, net in (("pytorch", model), ("onnxruntime", onnx)):
            with torch.inference_mode():
                net(images)  # warm-up
        for _ in range(rounds):
            for name, net in (("pytorch", model), ("onnxruntime", onnx)):
                with torch.inference_mode():
                    value = median_s(lambda: net(images), runs)
                best[name][batch] = min(best[name].get(batch, float("inf")), value)
    return best


def index_command(weights: Path, folder: Path, out: Path, threads: int, extra: list[str], runs: int,
                  before: Callable[[], float] | None = None) -> dict[str, Any]:
    """Wall, user and system seconds of ``rankopt index`` (GNU ``time``), after one untimed run that warms the files
    and the runtime's cache: those of the fastest of ``runs`` runs (as for the network alone: another process on
    the cores slows some runs, never speeds one up), and ``median_wall`` of them all. ``before``: timed right before
    each run (the forward alone, images/s); ``paired`` lists ``(its rate, the run's wall)`` per run."""
    command = [sys.executable, "-m", "rankopt", "index", str(weights), "--images", str(folder), *extra,
               "--threads", str(threads), "--no-progress", "--out", str(out)]
    subprocess.run([*command[:-1], f"{out}-warm-up"], check=True, capture_output=True)
    timed, paired = [], []
    for run in range(runs):
        rate = before() if before is not None else float("nan")
        began = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-f", "TIMES %U %S", *command[:-1], f"{out}-{run}"], check=True,
                              capture_output=True, text=True)
        wall = time.perf_counter() - began
        user, system = (float(v) for v in re.search(r"TIMES (\S+) (\S+)", done.stderr).groups())  # type: ignore[union-attr]
        timed.append({"wall": wall, "user": user, "system": system})
        paired.append((rate, wall))
    return {**min(timed, key=lambda t: t["wall"]), "median_wall": statistics.median(t["wall"] for t in timed),
            "paired": paired}


def reading_alone(embedder: Embedder, paths: list[Path]) -> float:
    """CPU seconds per photo of the embedder's dataset (read, decode, transform) on this thread."""
    dataset = as_dataset([str(p) for p in paths], embedder.transform)
    began = time.thread_time()
    for i in range(len(dataset)):
        dataset[i]
    return (time.thread_time() - began) / len(dataset)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=os.environ.get("RANKOPT_CALTECH101"), required=False)
    parser.add_argument("--weights", type=Path, default=os.environ.get("RANKOPT_WEIGHTS_MOBILENETV2"))
    parser.add_argument("--photos", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="fewer rounds and runs: checks that it runs")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "runtimes.md")
    args = parser.parse_args()
    if args.root is None or args.weights is None:
        parser.error("--root (Caltech-101's 101_ObjectCategories) and --weights (MobileNetV2 release) are needed")
    keep_allocations()
    rounds, runs = (1, 2) if args.quick else (3, 10)
    index_runs = 1 if args.quick else 3
    chosen = photos(args.root, args.photos)
    for path in chosen:
        path.read_bytes()  # read warm
    backbone, size = described(args.weights)
    alone = forward_alone(args.weights, args.threads, rounds, runs)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "photos"
        for i, path in enumerate(chosen):  # one flat folder of links: `rankopt index --images DIR` reads it whole
            target = folder / path.parent.name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(path, target)
        commands = {"defaults": index_command(args.weights, folder, Path(tmp) / "a", args.threads, [], index_runs,
                                              before=onnx_pass(args.weights, args.threads, len(chosen))),
                    "--runtime torch": index_command(args.weights, folder, Path(tmp) / "b", args.threads,
                                                     ["--runtime", "torch"], index_runs)}
        torch.set_num_threads(args.threads)
        overlap: dict[str, float] = {}
        niceness = reader.READ_NICENESS
        for read_threads, nice in ((0, niceness), (2, 0), (2, niceness)):
            reader.READ_NICENESS = nice
            embedder = Embedder.from_checkpoint(args.weights, device="cpu", runtime="onnx", threads=args.threads,
                                                read_threads=read_threads, batch_size=32, progress=False)
            embedder.embed([str(p) for p in chosen[:64]])  # warm-up
            began = time.perf_counter()
            embedder.embed([str(p) for p in chosen])
            shown = "0" if read_threads == 0 else f"{read_threads}, niceness +{nice}"
            shown += " (default)" if read_threads and nice == niceness else ""
            overlap[shown] = len(chosen) / (time.perf_counter() - began)
        reader.READ_NICENESS = niceness
        reading = reading_alone(embedder, chosen)
    onnx_rate = 32 / alone["onnxruntime"][32]
    forward_cpu = args.threads / onnx_rate
    bound = os.cpu_count() / (forward_cpu + reading)
    lines = [
        "# Inference runtimes: `rankopt index` against onnxruntime's forward alone", "",
        f"Generated by `benchmarks/bench_runtimes.py` on {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} "
        "UTC.", "",
        f"    python benchmarks/bench_runtimes.py --root $RANKOPT_CALTECH101 --weights {args.weights.name} "
        f"--photos {args.photos} --threads {args.threads}{' --quick' if args.quick else ''}"
        f"{'' if args.out.name == 'runtimes.md' else ' --out benchmarks/results/' + args.out.name}", "",
        f"Machine: {os.cpu_count()} CPU cores, torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.platform()}; load before the run {os.getloadavg()[0]:.1f}; {args.threads} threads for each "
        f"runtime; {backbone} (released ImageNet weights) at {size[0]}x{size[1]} px.", "",
        "## The network alone (decoded, transformed batches)", "",
        "| runtime | batch 1 (ms) | batch 32 (images/s) |", "|---|---|---|",
        *(f"| {name} | {1000 * alone[name][1]:.1f} | {32 / alone[name][32]:.0f} |" for name in alone),
        f"| ratio onnxruntime / PyTorch | {alone['pytorch'][1] / alone['onnxruntime'][1]:.2f}x | "
        f"{alone['pytorch'][32] / alone['onnxruntime'][32]:.2f}x |", "",
        f"## `rankopt index` on {len(chosen):,} Caltech-101 photos, read warm, the fastest of {index_runs} run(s)", "",
        "| command | wall (s) | photos/s | vs onnxruntime's forward alone | CPU time in the kernel | median wall (s) "
        "| vs the forward alone at the median |", "|---|---|---|---|---|---|---|",
        *(f"| `rankopt index WEIGHTS --images DIR{'' if name == 'defaults' else ' ' + name}` | {t['wall']:.1f} | "
          f"{len(chosen) / t['wall']:.0f} | {len(chosen) / t['wall'] / onnx_rate:.2f}x | "
          f"{100 * t['system'] / max(t['user'] + t['system'], 1e-9):.1f} % | {t['median_wall']:.1f} | "
          f"{len(chosen) / t['median_wall'] / onnx_rate:.2f}x |" for name, t in commands.items()), "",
        f"## Each run of `rankopt index WEIGHTS --images DIR` against onnxruntime's forward alone timed just before "
        f"it ({len(chosen):,} images, batches of 32)", "",
        "| run | forward alone (images/s) | index wall (s) | photos/s | vs the forward alone just before |",
        "|---|---|---|---|---|",
        *(f"| {i + 1} | {rate:.0f} | {wall:.1f} | {len(chosen) / wall:.0f} | {len(chosen) / wall / rate:.2f}x |"
          for i, (rate, wall) in enumerate(commands["defaults"]["paired"])),
        f"| median | | | | {statistics.median(len(chosen) / w / r for r, w in commands['defaults']['paired']):.2f}x |",
        "",
        "## Reading ahead (the embedder on onnxruntime, batches of 32)", "",
        "| threads reading the next photos (their niceness above the forward's) | photos/s |", "|---|---|",
        *(f"| {threads} | {rate:.0f} |" for threads, rate in overlap.items()), "",
        "## What the cores allow (CPU seconds per photo)", "",
        "| forward (onnxruntime, batch 32) | reading (read, decode, transform; one thread) | the most a pass doing "
        f"both on {os.cpu_count()} cores can embed | vs onnxruntime's forward alone |", "|---|---|---|---|",
        f"| {1000 * forward_cpu:.2f} ms | {1000 * reading:.2f} ms | {bound:.0f} photos/s | {bound / onnx_rate:.2f}x |",
        "",
        "The index command's wall time includes starting Python, loading the model and saving the index "
        "(measured with GNU `time`, the files read once before).", ""]
    args.out.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
