"""CPU latency of an exported model: onnxruntime vs PyTorch, batch 1 and 32, the same number of threads.

    python benchmarks/bench_onnx.py               # mobilenet_v2 at 128 and 224 px, mobilefacenet at 112 x 96
    python benchmarks/bench_onnx.py --quick       # fewer runs, to check it works

Each model (random weights: latency does not depend on their values) is exported with
``rankopt.export.export_onnx`` and run by ``rankopt.export.OnnxNet`` (onnxruntime, ``intra_op_num_threads`` =
``--threads``) and by PyTorch (``torch.set_num_threads(--threads)``, ``inference_mode``) on the same random
batches: warm-up runs, then the median of ``--runs`` timed runs per batch. Writes a markdown table to
benchmarks/results/onnx_latency.md (ms per batch, images/s, PyTorch / onnxruntime time ratio, min per-row cosine).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from rankopt.export import OnnxNet, export_onnx, row_cosines
from rankopt.models import create_model
from rankopt.runtime import keep_allocations

REPO = Path(__file__).resolve().parents[1]
SETUPS = (("mobilenet_v2", {"transform": "test", "image_size": 128}),
          ("mobilenet_v2", {"transform": "test", "image_size": 224}),
          ("mobilefacenet", {"transform": "mobilefacenet_test", "image_size": None}))


def median_ms(run: Callable[[], object], warmup: int, runs: int) -> float:
    """The median wall time of ``runs`` calls after ``warmup`` untimed ones, in ms."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="threads of both runtimes (default 2)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--runs", type=int, default=None, help="timed runs per measurement (default 20, quick 3)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--note", default="", help="a line about the machine's load, printed under the table")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "onnx_latency.md")
    args = parser.parse_args()
    runs = args.runs or (3 if args.quick else 20)
    warmup = 1 if args.quick else 3
    torch.set_num_threads(args.threads)
    keep_allocations()  # PyTorch as every rankopt command runs it (rankopt.runtime)
    import onnxruntime

    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, preprocessing in SETUPS:
            torch.manual_seed(0)
            model = create_model(name).eval()
            net = OnnxNet(export_onnx(model, preprocessing, Path(folder) / f"{name}.onnx"), device="cpu",
                          threads=args.threads)
            height, width = net.input_shape[1:]
            for batch in args.batches:
                images = torch.randn(batch, 3, height, width, generator=torch.Generator().manual_seed(batch))
                with torch.inference_mode():
                    cosine = float(row_cosines(model(images), net(images)).min())
                    torch_ms = median_ms(lambda: model(images), warmup, runs)
                onnx_ms = median_ms(lambda: net(images), warmup, runs)
                rows.append((f"{name} {height}x{width}", batch, torch_ms, onnx_ms, cosine))
                print(f"{rows[-1][0]} batch {batch}: PyTorch {torch_ms:.1f} ms, onnxruntime {onnx_ms:.1f} ms, "
                      f"min cosine {cosine:.7f}", flush=True)

    command = "python benchmarks/bench_onnx.py " + " ".join(sys.argv[1:])
    lines = [
        "# Embedding latency on CPU: onnxruntime vs PyTorch",
        "",
        f"Command: `{command.strip()}`  ",
        f"Date: {datetime.date.today().isoformat()}  ",
        f"Machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, {args.threads} threads for both "
        f"(torch.set_num_threads / intra_op_num_threads), median of {runs} runs after {warmup} warm-up  ",
        *([f"Load: {args.note}  "] if args.note else []),
        "",
        "| model (input) | batch | PyTorch ms/batch | onnxruntime ms/batch | PyTorch images/s | onnxruntime images/s "
        "| PyTorch / onnxruntime time | min per-row cosine |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, batch, torch_ms, onnx_ms, cosine in rows:
        lines.append(f"| {label} | {batch} | {torch_ms:.1f} | {onnx_ms:.1f} | {1000 * batch / torch_ms:.1f} | "
                     f"{1000 * batch / onnx_ms:.1f} | {torch_ms / onnx_ms:.2f}x | {cosine:.7f} |")
    lines += ["", "Random weights (latency does not depend on their values); ratio > 1: onnxruntime is faster."]
    table = "\n".join(lines) + "\n"
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
