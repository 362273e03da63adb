"""Hierarchical metrics (H-AP, ASI, NDCG) of ``rankopt.metrics.evaluate`` against the product and one sort.

Synthetic data shaped like Stanford Online Products' test split: L2-normalised Gaussian 512-d
embeddings; 2-level labels, product classes of 5 or 6 images (5.3 on average, as SOP) in 12
super-classes of very different sizes, proportional to ``SUPER_CLASS_SHARES`` (a model of SOP's
12 super-classes: 3.4 % to 14 % of the images); the query set is the gallery (each query excluded by index). For each N, each
in a fresh subprocess with ``--threads`` torch threads:

* (a) the product alone: ``score_chunks`` with the chunk size ``evaluate`` uses (read from (c));
* (b) the product and ``scores.sort(dim=1, descending=True)`` of each chunk;
* (c) ``evaluate(x, labels, metrics=["h-ap", "asi", "ndcg"])``;
* (d) ``evaluate(x, labels)``: the default hierarchical set (recall@1, recall@10, map@r, map, h-ap, asi, ndcg).

Each worker first runs ``evaluate`` on 200 items (lazy imports, not timed); memory = peak RSS
above the RSS after building the data.

    python benchmarks/bench_metrics_hierarchical.py                                  # N = 10k, 30k, 60k, 2 threads
    python benchmarks/bench_metrics_hierarchical.py --sizes 2000 5000 --threads 1 --no-write   # quick check
"""

from __future__ import annotations

import argparse
import datetime
import os
import resource
import sys
import time
from pathlib import Path

from bench_losses import fmt, run_worker
from bench_metrics import machine

DIM = 512
IMAGES_PER_CLASS = 5.3
SUPER_CLASS_SHARES = (0.034, 0.045, 0.06, 0.067, 0.072, 0.074, 0.082, 0.089, 0.094, 0.11, 0.13, 0.14)
HIERARCHICAL = ["h-ap", "asi", "ndcg"]
KINDS = ("c", "a", "b", "d")  # (c) first: it reports the chunk size (a) and (b) use
RESULTS = Path(__file__).resolve().parent / "results" / "metrics_hierarchical.md"
BEFORE = """Before the relevant-items path (whole rows sorted with indices by `torch.sort`, levels and running counts
over the whole rows), same command with `--sizes 10000 30000 --threads 1`, same machine, 2026-11-23:

| N | (a) product | (b) product + sort | (c) H-AP, ASI, NDCG | (c)/(b) | (d) default hierarchical set |
|---:|---:|---:|---:|---:|---:|
| 10,000 | 1.27 s / 77 MiB | 6.97 s / 105 MiB | 12.40 s / 314 MiB | 1.78 | 14.02 s / 366 MiB |
| 30,000 | 13.71 s / 98 MiB | 71.63 s / 125 MiB | 117.90 s / 403 MiB | 1.65 | 131.65 s / 409 MiB |

Before the thread pool (one chunk at a time, torch on 2 threads, numpy's sorts on one; chunks sized for
96 + 8L bytes per score), same command, same machine, 2026-11-23 20:20 UTC:

| N | chunk rows | (a) product | (b) product + sort | (c) H-AP, ASI, NDCG | (c)/(b) | (d) default hierarchical set |
|---:|---:|---:|---:|---:|---:|---:|
| 10,000 | 239 | 641.9 ms / 47 MiB | 3.53 s / 102 MiB | 1.88 s / 110 MiB | 0.53 | 2.03 s / 113 MiB |
| 30,000 | 79 | 6.62 s / 113 MiB | 35.62 s / 104 MiB | 20.63 s / 158 MiB | 0.58 | 22.16 s / 156 MiB |
| 60,000 | 39 | 35.18 s / 144 MiB | 165.49 s / 171 MiB | 86.01 s / 214 MiB | 0.52 | 93.38 s / 216 MiB |"""


def make_data(n: int, seed: int = 0):
    """``(x, labels)``: ``(n, 512)`` unit float32 rows, ``(n, 2)`` int64 labels (product, super-class)."""
    import numpy as np
    import torch

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, DIM), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    num_classes = round(n / IMAGES_PER_CLASS)
    fine = rng.permutation(np.arange(n) % num_classes)
    shares = np.asarray(SUPER_CLASS_SHARES) / sum(SUPER_CLASS_SHARES)
    bounds = np.round(np.cumsum(shares) * num_classes)
    super_of_class = np.searchsorted(bounds, rng.permutation(num_classes), side="right")
    return torch.from_numpy(x), torch.from_numpy(np.stack([fine, super_of_class[fine]], axis=1))


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) / 1024 for line in fh if line.startswith("VmRSS:"))


def worker(kind: str, n: int, threads: int, chunk: int) -> dict:
    """Run one measurement in this process."""
    import torch

    from rankopt.metrics import evaluate, evaluation
    from rankopt.metrics.topk import chunk_scorer
    from rankopt.threads import ThreadPool

    torch.set_num_threads(threads)
    metrics = HIERARCHICAL if kind == "c" else None
    evaluate(*make_data(200, seed=1), metrics=metrics)  # warm-up: lazy imports (numba, ...) are not timed
    x, labels = make_data(n)
    base = _rss_mib()
    used: list[int] = []
    start = time.perf_counter()
    if kind in ("a", "b"):  # the chunks evaluate uses, scored (and sorted) on the same thread pool
        scores_of = chunk_scorer(x, None)

        def work(start: int) -> None:
            scores = scores_of(start, start + chunk)
            if kind == "b":
                scores.sort(dim=1, descending=True)

        with ThreadPool(threads) as pool:
            list(pool.imap(work, range(0, n, chunk)))
        values = {}
    else:
        chunk_size = evaluation.default_chunk_size

        def recording(*args, **kwargs):
            used.append(chunk_size(*args, **kwargs))
            return used[-1]

        evaluation.default_chunk_size = recording
        values = evaluate(x, labels, metrics=metrics).metrics
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"time_s": seconds, "peak_mib": peak - base, "values": values, "chunk": used[0] if used else chunk,
            "threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 30_000, 60_000])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (and OMP/MKL threads) of each worker")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per measurement")
    parser.add_argument("--no-write", action="store_true", help=f"print only, do not write {RESULTS.name}")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import json

        kind, n, threads, chunk = args.worker
        print(json.dumps(worker(kind, int(n), int(threads), int(chunk))))
        return

    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    lines = [
        "# Hierarchical metrics of evaluate against the product and one per-row sort",
        "",
        f"Command: `{' '.join(['python benchmarks/bench_metrics_hierarchical.py', *sys.argv[1:]])}`  ",
        f"Machine: {machine(args.threads)}  ",
        f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}  ",
        f"Data: synthetic, SOP-shaped: L2-normalised Gaussian {DIM}-d embeddings; 2-level labels, product classes of 5 or 6 "
        f"images ({IMAGES_PER_CLASS} on average) in 12 super-classes holding {', '.join(f'{s:g}' for s in SUPER_CLASS_SHARES)} "
        "of the images (normalised); query set = gallery, each query excluded by index. Each measurement in a fresh "
        "subprocess, after an untimed warm-up `evaluate` on 200 items (lazy imports); memory = peak RSS above the RSS "
        "after building the data.",
        "",
        "(a) the product alone, in the query chunks `evaluate` uses, on the same thread pool (`chunk_scorer`, "
        "`ThreadPool`: each thread scores whole chunks, torch single-threaded); (b) the product and "
        "`scores.sort(dim=1, descending=True)` of each chunk, the same way; (c) `evaluate(x, labels, metrics=['h-ap', 'asi', 'ndcg'])`; "
        "(d) `evaluate(x, labels)`, the default hierarchical set (recall@1, recall@10, map@r, map, h-ap, asi, ndcg).",
        "",
        "| N | chunk rows | (a) product | (b) product + sort | (c) H-AP, ASI, NDCG | (c)/(b) | (d) default hierarchical set | values (c) |",
        "|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n in args.sizes:
        res: dict[str, dict] = {}
        chunk = 0
        for kind in KINDS:
            res[kind] = run_worker([sys.executable, __file__, "--worker", kind, str(n), str(args.threads), str(chunk)], args.timeout)
            chunk = res["c"].get("chunk", 0)
            print(f"N={n} ({kind}) {fmt(res[kind])}", flush=True)
            if chunk == 0:
                break
        c, b = res["c"], res.get("b", {})
        ratio = f"{c['time_s'] / b['time_s']:.2f}" if "time_s" in c and "time_s" in b else "–"
        values = ", ".join(f"{k} {v:.4f}" for k, v in c.get("values", {}).items())
        agree = all(abs(res.get("d", {}).get("values", {}).get(k, float("nan")) - v) < 1e-12 for k, v in c.get("values", {}).items())
        lines.append(f"| {n:,} | {chunk} | {fmt(res.get('a'))} | {fmt(b or None)} | {fmt(c)} | {ratio} | {fmt(res.get('d'))} "
                     f"| {values}{'' if agree else ' (d) DIFFERS'} |")
        print(lines[-1], flush=True)
    text = "\n".join([*lines, "", BEFORE]) + "\n"
    print(text)
    if not args.no_write:
        RESULTS.write_text(text)


if __name__ == "__main__":
    main()
