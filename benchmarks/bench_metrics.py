"""Benchmark rankopt.metrics.evaluate against pytorch-metric-learning's AccuracyCalculator (faiss).

Synthetic data: random 512-d Gaussian embeddings, about 5 items per class, query set = gallery.
Each measurement runs in a fresh subprocess; peak memory = that process's peak RSS minus its
RSS after loading the data. Values of the metrics both libraries compute (R@1 = PML
precision_at_1, mAP@R) are checked to agree.

    python benchmarks/bench_metrics.py                    # N = 10k, 30k, 60k (about 5 minutes)
    python benchmarks/bench_metrics.py --sizes 2000 5000  # quick check
    python benchmarks/bench_metrics.py --large            # 1M gallery x 10k queries x 128-d, rankopt only
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
import tempfile
import time
from pathlib import Path

import numpy as np

SHARED = ["recall@1", "map@r"]
FULL = ["recall@1", "recall@10", "recall@100", "map@r", "map"]
RESULTS = Path(__file__).resolve().parent / "results" / "metrics.md"
STANDARD_SECTION = "## rankopt vs pytorch-metric-learning AccuracyCalculator"
LARGE_SECTION = "## Large gallery: 1M x 10k queries x 128-d"


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_data(n: int, dim: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """L2-normalised Gaussian embeddings (PML's L2 kNN then ranks like rankopt's cosine), 5 per class."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim), dtype=np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True), rng.permutation(np.arange(n) // 5)


def worker(kind: str, data: str, out: str, large: bool) -> None:
    import torch

    if large:
        x, y = make_data(1_000_000, 128)
        gallery, g_labels = torch.from_numpy(x), torch.from_numpy(y)
        q, _ = make_data(10_000, 128, seed=1)  # new vectors, labels of gallery classes (5 positives each)
        query, q_labels = torch.from_numpy(q), g_labels[:10_000].clone()
    else:
        arrays = np.load(data)
        query, q_labels = torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"])
    base = _rss_mib()
    start = time.perf_counter()
    if kind == "pml":
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

        calc = AccuracyCalculator(include=("precision_at_1", "mean_average_precision_at_r"), k="max_bin_count")
        res = calc.get_accuracy(query, q_labels, query, q_labels, ref_includes_query=True)
        values = {"recall@1": res["precision_at_1"], "map@r": res["mean_average_precision_at_r"]}
    else:
        from rankopt.metrics import evaluate

        metrics = SHARED if kind == "rankopt-shared" else FULL
        if large:
            result = evaluate(query, q_labels, gallery, g_labels, metrics=metrics)
        else:
            result = evaluate(query, q_labels, metrics=metrics)
        values = result.metrics
    seconds = time.perf_counter() - start
    Path(out).write_text(json.dumps({"values": values, "seconds": seconds, "peak_mib": _peak_mib() - base, "total_peak_mib": _peak_mib()}))


def run_worker(kind: str, data: str, large: bool = False) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = fh.name
    cmd = [sys.executable, __file__, "--worker", kind, "--data", data, "--out", out] + (["--large"] if large else [])
    subprocess.run(cmd, check=True)
    result = json.loads(Path(out).read_text())
    os.unlink(out)
    return result


def machine() -> str:
    import torch

    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), Python {platform.python_version()}; load average at start {load}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000, 60_000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--large", action="store_true", help="1M gallery x 10k queries x 128-d (rankopt only)")
    parser.add_argument("--no-write", action="store_true", help="print only, do not write benchmarks/results/metrics.md")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.data, args.out, args.large)
        return

    command = "python benchmarks/bench_metrics.py " + " ".join(sys.argv[1:])
    section = LARGE_SECTION if args.large else STANDARD_SECTION
    lines = [
        section,
        "",
        f"Command: `{command.strip()}`  ",
        f"Machine: {machine()}  ",
        f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}  ",
        "Data: synthetic random Gaussian embeddings (L2-normalised), ~5 items per class"
        + ("." if args.large else ", query set = gallery (self excluded by index).")
        + " Each run in a fresh subprocess; memory = peak RSS above the RSS after loading the data.",
        "",
    ]
    if args.large:
        res = run_worker("rankopt-full", "", large=True)
        lines += [
            "Gallery: 1M L2-normalised Gaussian vectors, 5 per class; queries: 10k new vectors labelled with gallery classes "
            "(separate gallery, 5 positives each).",
            "",
            "| setting | metrics | rankopt time | peak memory above data | peak RSS of the process |",
            "|---|---|---:|---:|---:|",
            f"| 1M gallery x 10k queries x 128-d | {', '.join(FULL)} | {res['seconds']:.1f} s | {res['peak_mib'] / 1024:.2f} GiB "
            f"| {res['total_peak_mib'] / 1024:.2f} GiB |",
            "",
            "Values: " + ", ".join(f"{k} = {v:.4f}" for k, v in res["values"].items()),
        ]
    else:
        lines += [
            f"| N | PML AccuracyCalculator (R@1, mAP@R) | rankopt same metrics | speed-up | memory ratio | rankopt {', '.join(FULL)} | values agree |",
            "|---:|---:|---:|---:|---:|---:|---|",
        ]
        with tempfile.TemporaryDirectory() as tmp:
            for n in args.sizes:
                x, y = make_data(n, args.dim)
                data = os.path.join(tmp, f"data_{n}.npz")
                np.savez(data, x=x, y=y)
                pml, shared, full = (run_worker(kind, data) for kind in ("pml", "rankopt-shared", "rankopt-full"))
                agree = all(abs(pml["values"][k] - shared["values"][k]) < 1e-6 and abs(full["values"][k] - shared["values"][k]) < 1e-12 for k in SHARED)
                lines.append(
                    f"| {n:,} | {pml['seconds']:.2f} s / {pml['peak_mib']:.0f} MiB | {shared['seconds']:.2f} s / {shared['peak_mib']:.0f} MiB "
                    f"| {pml['seconds'] / shared['seconds']:.2f}x | {shared['peak_mib'] / max(pml['peak_mib'], 1):.2f} "
                    f"| {full['seconds']:.2f} s / {full['peak_mib']:.0f} MiB | {'yes' if agree else 'NO'} "
                    f"(R@1 {shared['values']['recall@1']:.4f}, mAP@R {shared['values']['map@r']:.4f}) |"
                )
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        write_section(section, text)


def write_section(section: str, text: str) -> None:
    """Replace one section of the results file, keeping the other mode's section."""
    sections = {STANDARD_SECTION: "", LARGE_SECTION: ""}
    if RESULTS.exists():
        current = None
        for line in RESULTS.read_text().splitlines(keepends=True):
            if line.rstrip() in sections:
                current = line.rstrip()
            if current is not None:
                sections[current] += line
    sections[section] = text
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("# rankopt.metrics benchmark\n\n" + "\n".join(t for t in sections.values() if t))


if __name__ == "__main__":
    main()
