"""Speed of the built-in backbones and cost of multistaged backprop on CPU.

1. Forward+backward time of one training step of ``create_model(name)`` (frozen BN,
   train mode, avg pooling) on a batch of random images.
2. Plain large-batch step vs :func:`rankopt.engine.multistage.multistage_step` with
   FastAP (a B^2 loss, so the backbone activations dominate memory) on
   ``convnet_small`` embeddings of 128x128 images: time and peak RSS (each
   configuration in a fresh subprocess; ``ru_maxrss`` minus the RSS after
   building the inputs).

Small run (default) for a busy machine; ``--size full`` for the reference numbers
(< 10 minutes on 2 cores). Writes ``benchmarks/results/models_engine.md``.
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

import torch

from rankopt.engine.multistage import multistage_step
from rankopt.losses import build
from rankopt.models import create_model

from cited import keep_cited

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = {
    # backbone rows: (name, batch, image side); multistage rows: (batch, sub-batch or 0 for plain)
    "small": {"backbones": [("convnet_tiny", 64, 64), ("convnet_small", 64, 64), ("resnet18", 8, 128)],
              "multistage": [(256, 0), (256, 64), (256, 16)], "repeats": 3},
    "full": {"backbones": [("convnet_tiny", 64, 64), ("convnet_small", 64, 64), ("resnet18", 32, 224),
                           ("resnet50", 16, 224), ("deit_small_distilled_patch16_224", 16, 224)],
             "multistage": [(512, 0), (512, 128), (512, 32), (1024, 0), (1024, 128)], "repeats": 5},
}


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def backbone_step(name: str, batch: int, side: int, repeats: int) -> float:
    model = create_model(name).train()
    images = torch.rand(batch, 3, side, side)

    def step() -> None:
        model.zero_grad()
        model(images).sum().backward()

    return _median_time(step, repeats)


def _rss_mib() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def multistage_child(batch: int, sub: int, repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    model = create_model("convnet_small", embedding_dim=64).train()
    images, labels = torch.rand(batch, 3, 128, 128), torch.arange(batch) // 4
    loss_fn = build("fastap")
    base = _rss_mib()

    def step() -> None:
        model.zero_grad()
        if sub:
            multistage_step(model, images, labels, loss_fn, sub)
        else:
            loss_fn(model(images), labels).backward()

    seconds = _median_time(step, repeats)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"seconds": seconds, "peak_mib": peak - base}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(multistage_child(*args.child)))
        return
    cfg = SIZES[args.size]
    lines = [
        "# Backbone speed and multistaged backprop (CPU)",
        "",
        f"Command: `python benchmarks/models_engine.py --size {args.size}`  ",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, load average {os.getloadavg()[0]:.1f} at start  ",
        f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "",
        "## Forward+backward of one training step (median)",
        "",
        "| backbone | batch | image | parameters | time |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, batch, side in cfg["backbones"]:
        seconds = backbone_step(name, batch, side, cfg["repeats"])
        params = sum(p.numel() for p in create_model(name).parameters())
        lines.append(f"| {name} | {batch} | {side}x{side} | {params:,} | {seconds * 1000:.1f} ms |")
        print(lines[-1], flush=True)
    lines += ["", "## FastAP step on convnet_small (128x128 images, 64-d): plain vs multistaged", "",
              "| batch | sub-batch | time | peak RSS above inputs |", "|---:|---:|---:|---:|"]
    for batch, sub in cfg["multistage"]:
        out = subprocess.run([sys.executable, __file__, "--child", str(batch), str(sub), str(cfg["repeats"])],
                             check=True, capture_output=True, text=True)
        res = json.loads(out.stdout.strip().splitlines()[-1])
        lines.append(f"| {batch} | {sub or 'plain'} | {res['seconds']:.2f} s | {res['peak_mib']:.0f} MiB |")
        print(lines[-1], flush=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "models_engine.md"
    out.write_text(keep_cited(out, "\n".join(lines) + "\n"))
    print(f"wrote {RESULTS / 'models_engine.md'}")


if __name__ == "__main__":
    main()
