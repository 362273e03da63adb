"""Benchmark rankopt.metrics.evaluate against the matrix-product floor and pytorch-metric-learning.

Synthetic data: random 512-d Gaussian embeddings, about 5 items per class, query set = gallery.
Each measurement runs in a fresh subprocess; peak memory = that process's peak RSS minus its
RSS after loading the data. The floor is the products alone, tile by tile as the tiled method
computes them (the upper triangle of the symmetric matrix; every query block against every
gallery tile for a separate gallery), two-threaded torch, timed for tiles of 1024, 2048 and 4096:
the fastest of the three is the floor. rankopt runs both methods: ``tiled`` (compiled one-pass
kernels, the default on CPU for large sets) and ``chunked`` (torch per query chunk, the previous
path); the compiled kernels are loaded before the clock starts (their one-off load time is
reported apart). Values of the metrics both libraries compute (R@1 = PML precision_at_1,
mAP@R) are checked to agree, and the two rankopt methods to be equal (to 1e-12: the per-query values are
summed in a different order).

    python benchmarks/bench_metrics.py                    # N = 10k, 30k, 60k (about 5 minutes)
    python benchmarks/bench_metrics.py --sizes 2000 5000  # quick check
    python benchmarks/bench_metrics.py --large            # 1M gallery x 10k queries x 128-d: floor, tiled, chunked
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHARED = ["recall@1", "map@r"]
BINARY = ["recall@1", "recall@10", "recall@100", "precision@10", "true_recall@10", "map@r", "map@100", "map", "mrr"]
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


FLOOR_TILES = (1024, 2048, 4096)


def product_floor(query, gallery, tile: int) -> None:
    """The products alone, in tiles of ``tile`` as the tiled method computes them, into one reused buffer."""
    import torch
    import torch.nn.functional as F

    q = F.normalize(query, dim=1)
    g = q if gallery is None else F.normalize(gallery, dim=1)
    buffer = torch.empty(tile * tile)
    for a in range(0, q.shape[0], tile):
        for b in range(a if gallery is None else 0, g.shape[0], tile):
            rows, cols = q[a : a + tile], g[b : b + tile]
            torch.matmul(rows, cols.T, out=buffer[: rows.shape[0] * cols.shape[0]].view(rows.shape[0], cols.shape[0]))


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
        gallery = g_labels = None
    load_seconds = 0.0
    if kind.startswith("tiled"):  # load numba and every cached kernel (small tiles) before the clock starts
        from rankopt.metrics.tiled import tiled_search

        start = time.perf_counter()
        q, y = query[:600], q_labels[:600]
        tiled_search(q, y, None if gallery is None else gallery[:600], y if gallery is None else g_labels[:600],
                     torch.arange(600) if gallery is None else None, k=101, count_positives=True, tile=128, candidate_capacity=10**5)
        load_seconds = time.perf_counter() - start
    base = _rss_mib()
    start = time.perf_counter()
    values = {}
    if kind.startswith("floor-"):
        product_floor(query, gallery, int(kind.split("-")[1]))
    elif kind == "pml":
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

        calc = AccuracyCalculator(include=("precision_at_1", "mean_average_precision_at_r"), k="max_bin_count")
        res = calc.get_accuracy(query, q_labels, query, q_labels, ref_includes_query=True)
        values = {"recall@1": res["precision_at_1"], "map@r": res["mean_average_precision_at_r"]}
    else:
        from rankopt.metrics import evaluate

        method, metrics = kind.split("-")
        result = evaluate(query, q_labels, gallery, g_labels, metrics=SHARED if metrics == "shared" else BINARY, method=method)
        values = result.metrics
    seconds = time.perf_counter() - start
    Path(out).write_text(json.dumps({"values": values, "seconds": seconds, "load_seconds": load_seconds,
                                     "peak_mib": _peak_mib() - base, "total_peak_mib": _peak_mib()}))


def best_floor(data: str, large: bool = False) -> dict:
    """The fastest of the products-only runs over :data:`FLOOR_TILES`, with its ``tile``."""
    runs = {tile: run_worker(f"floor-{tile}", data, large) for tile in FLOOR_TILES}
    tile = min(runs, key=lambda t: runs[t]["seconds"])
    return runs[tile] | {"tile": tile}


def run_worker(kind: str, data: str, large: bool = False) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = fh.name
    cmd = [sys.executable, __file__, "--worker", kind, "--data", data, "--out", out] + (["--large"] if large else [])
    subprocess.run(cmd, check=True)
    result = json.loads(Path(out).read_text())
    os.unlink(out)
    return result


def _equal(a: dict[str, float], b: dict[str, float]) -> bool:
    """Same metrics, equal up to the order in which the per-query values were summed (1e-12)."""
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) <= 1e-12 for k in a)


def machine() -> str:
    """:func:`rankopt.describe.machine_info` on one line (the workers run with this process's threads), and the load."""
    from rankopt.describe import machine_info

    info = machine_info("cpu")
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    return (f"{info['platform']}, {info['cpu_count']} CPU cores, torch {info['torch']} ({info['torch_threads']} threads), "
            f"Python {info['python']}; load average at start {load}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000, 60_000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--large", action="store_true", help="1M gallery x 10k queries x 128-d")
    parser.add_argument("--no-write", action="store_true", help="print only, do not write benchmarks/results/metrics.md")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.data, args.out, args.large)
        return

    from rankopt.metrics.tiled import SELF_COUNT_TILE, TILE

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
        floor = best_floor("", large=True)
        tiled, chunked = (run_worker(kind, "", large=True) for kind in ("tiled-binary", "chunked-binary"))
        same = _equal(tiled["values"], chunked["values"])
        lines += [
            "Gallery: 1M L2-normalised Gaussian vectors, 5 per class; queries: 10k new vectors labelled with gallery classes "
            "(separate gallery, 5 positives each).",
            "",
            f"Metrics: {', '.join(BINARY)}.",
            "",
            f"Product floor: the fastest tiling of {', '.join(map(str, FLOOR_TILES))}; rankopt tiles by {TILE}.",
            "",
            "| setting | product floor | rankopt tiled | ÷ floor | peak memory above data | peak RSS | rankopt chunked (previous path) | values equal |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
            f"| 1M gallery x 10k queries x 128-d | {floor['seconds']:.1f} s (tiles of {floor['tile']}) | {tiled['seconds']:.1f} s | "
            f"{tiled['seconds'] / floor['seconds']:.2f}x | {tiled['peak_mib'] / 1024:.2f} GiB | {tiled['total_peak_mib'] / 1024:.2f} GiB | "
            f"{chunked['seconds']:.1f} s / {chunked['peak_mib'] / 1024:.2f} GiB | {'yes' if same else 'NO'} |",
            "",
            "Values: " + ", ".join(f"{k} = {v:.4f}" for k, v in tiled["values"].items())
            + f". One-off load of numba and the cached kernels: {tiled['load_seconds']:.1f} s.",
        ]
    else:
        lines += [
            f"Binary metrics: {', '.join(BINARY)}. `÷ floor`: time over the product floor of the same N, measured in this run "
            f"(the fastest tiling of {', '.join(map(str, FLOOR_TILES))}, in brackets; rankopt counts the positives' ranks "
            f"(classes this small) in tiles of {SELF_COUNT_TILE}).",
            "",
            "| N | product floor | PML (R@1, mAP@R) | rankopt chunked (R@1, mAP@R) | rankopt tiled (R@1, mAP@R) | ÷ floor "
            "| rankopt chunked, binary metrics | rankopt tiled, binary metrics | ÷ floor | PML ÷ rankopt tiled | values agree |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        kinds = ("pml", "chunked-shared", "tiled-shared", "chunked-binary", "tiled-binary")
        with tempfile.TemporaryDirectory() as tmp:
            for n in args.sizes:
                x, y = make_data(n, args.dim)
                data = os.path.join(tmp, f"data_{n}.npz")
                np.savez(data, x=x, y=y)
                r = {"floor": best_floor(data)} | {kind: run_worker(kind, data) for kind in kinds}
                agree = all(abs(r["pml"]["values"][k] - r["tiled-shared"]["values"][k]) < 1e-6 for k in SHARED)
                agree &= _equal(r["tiled-shared"]["values"], r["chunked-shared"]["values"])
                agree &= _equal(r["tiled-binary"]["values"], r["chunked-binary"]["values"])
                cell = lambda kind: f"{r[kind]['seconds']:.2f} s / {r[kind]['peak_mib']:.0f} MiB"  # noqa: E731
                ratio = lambda kind: f"{r[kind]['seconds'] / r['floor']['seconds']:.2f}x"  # noqa: E731
                lines.append(
                    f"| {n:,} | {r['floor']['seconds']:.2f} s ({r['floor']['tile']}) | {cell('pml')} | {cell('chunked-shared')} | {cell('tiled-shared')} "
                    f"| {ratio('tiled-shared')} | {cell('chunked-binary')} | {cell('tiled-binary')} | {ratio('tiled-binary')} "
                    f"| {r['pml']['seconds'] / r['tiled-shared']['seconds']:.1f}x | {'yes' if agree else 'NO'} "
                    f"(R@1 {r['tiled-shared']['values']['recall@1']:.4f}, mAP@R {r['tiled-shared']['values']['map@r']:.4f}) |"
                )
                print(lines[-1], flush=True)
        lines += ["", f"One-off load of numba and the cached kernels in a fresh process: {r['tiled-binary']['load_seconds']:.1f} s."]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        write_section(section, text)


def write_section(section: str, text: str) -> None:
    """Replace one ``## `` section of the results file, keeping the others (the other mode's, notes)."""
    sections = {STANDARD_SECTION: "", LARGE_SECTION: ""}
    if RESULTS.exists():
        current = None
        for line in RESULTS.read_text().splitlines(keepends=True):
            if line.startswith("## "):
                current = line.rstrip()
                sections.setdefault(current, "")
            if current is not None:
                sections[current] += line
    sections[section] = text
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("# rankopt.metrics benchmark\n\n" + "\n\n".join(t.rstrip("\n") for t in sections.values() if t) + "\n")


if __name__ == "__main__":
    main()
