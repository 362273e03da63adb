"""The rank losses and exact evaluation on a CUDA GPU, side by side with pytorch-metric-learning.

    python benchmarks/bench_cuda.py                 # writes benchmarks/results/cuda.md (needs a CUDA device)
    python benchmarks/bench_cuda.py --quick         # small sizes, to check it runs

Losses: random 512-d embeddings, 4 items per class (labels ``(fine, fine // 8, 0)``, a coarsest level shared
by the whole batch, for ``hap_shared``; ``(fine, fine // 4, fine // 16)`` for ``hap``), one warm-up call, then the
median of ``--repeats`` timed ``loss(x, y).backward()`` calls (CUDA events around the call, the device synchronised),
peak memory from ``torch.cuda.max_memory_allocated`` above the inputs. A loss is not run at larger B once it failed
(out of memory) or took over ``--give-up`` s. pytorch-metric-learning's SmoothAPLoss (B^3 memory) and
FastAPLoss run in the same process on the same inputs.

Evaluation: ``rankopt.metrics.evaluate`` (self-retrieval, the nine binary metrics of benchmarks/bench_metrics.py)
on N random unit vectors (5 per class) on the GPU, against its floor: the similarity products and the top-k of each
query block alone (``chunked_topk``), and against pytorch-metric-learning's AccuracyCalculator (faiss on CPU here
when faiss has no GPU build: its time is reported, not its device).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "cuda.md"
LOSSES = ["sup_ap", "smooth_ap", "calibration", "roadmap", "fastap", "softbin_ap", "hap", "hap_shared", "sup_ndcg",
          "triplet", "multi_similarity"]
PML = {"pml_smooth_ap": "SmoothAPLoss", "pml_fastap": "FastAPLoss"}
PML_SMOOTH_AP_MAX = 1024
"""pytorch-metric-learning's SmoothAPLoss materialises B^3 floats (22 GiB at B = 1024): not run beyond."""
METRICS = ["recall@1", "recall@10", "recall@100", "precision@10", "true_recall@10", "map@r", "map@100", "map", "mrr"]


def labels_for(name: str, batch: int, device: torch.device) -> torch.Tensor:
    fine = torch.arange(batch, device=device) // 4
    if name == "hap":
        return torch.stack([fine, fine // 4, fine // 16], dim=1)
    if name == "hap_shared":
        return torch.stack([fine, fine // 8, torch.zeros_like(fine)], dim=1)
    return fine


def build(name: str, device: torch.device) -> torch.nn.Module:
    if name in PML:
        import pytorch_metric_learning.losses as pml

        return getattr(pml, PML[name])().to(device)
    import rankopt.losses

    return rankopt.losses.build("hap" if name == "hap_shared" else name).to(device)


def time_loss(name: str, batch: int, dim: int, repeats: int, device: torch.device) -> dict:
    """Median fwd+bwd seconds and peak MiB above the inputs of one loss at batch size ``batch``."""
    torch.manual_seed(0)
    x = torch.randn(batch, dim, device=device)
    labels = labels_for(name, batch, device)
    loss = build(name, device)
    loss(x[:8].clone().requires_grad_(True), labels[:8]).backward()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    times = []
    for i in range(repeats + 1):
        xg = x.clone().requires_grad_(True)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = loss(xg, labels)
        out.backward()
        end.record()
        torch.cuda.synchronize(device)
        if i:
            times.append(start.elapsed_time(end) / 1000.0)
        if not torch.isfinite(out):
            raise FloatingPointError(f"{name} at B={batch} is {float(out)}")
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    return {"time_s": statistics.median(times), "peak_mib": peak}


def loss_table(sizes: list[int], dim: int, repeats: int, give_up: float, device: torch.device) -> list[str]:
    names = LOSSES + list(PML)
    results: dict[tuple[str, int], str] = {}
    stopped: set[str] = set()
    for batch in sizes:
        for name in names:
            if name in stopped or (name == "pml_smooth_ap" and batch > PML_SMOOTH_AP_MAX):
                results[name, batch] = "–"
                continue
            try:
                r = time_loss(name, batch, dim, repeats, device)
                results[name, batch] = f"{r['time_s'] * 1e3:.1f} ms / {r['peak_mib']:.0f} MiB"
                if r["time_s"] > give_up:
                    stopped.add(name)
            except torch.OutOfMemoryError:
                results[name, batch] = "out of memory"
                stopped.add(name)
            finally:
                torch.cuda.empty_cache()
            print(f"B={batch} {name}: {results[name, batch]}", flush=True)
    lines = ["| loss | " + " | ".join(f"B = {b}" for b in sizes) + " |", "|---|" + "---|" * len(sizes)]
    lines += [f"| {n} | " + " | ".join(results[n, b] for b in sizes) + " |" for n in names]
    return lines


def _timed(fn, device: torch.device, repeats: int = 3) -> float:
    fn()
    torch.cuda.synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return min(times)


def evaluation_table(sizes: list[int], dim: int, device: torch.device) -> list[str]:
    lines = ["| N | product + top-100 floor | rankopt evaluate (9 metrics) | ratio | PML AccuracyCalculator | R@1, mAP@R (rankopt / PML) |",
             "|---:|---|---|---|---|---|"]
    for n in sizes:
        try:
            lines.append(evaluation_row(n, dim, device))
        except torch.OutOfMemoryError:
            lines.append(f"| {n:,} | out of memory | | | | |")
        print(lines[-1], flush=True)
    return lines


def evaluation_row(n: int, dim: int, device: torch.device) -> str:
    """One row of :func:`evaluation_table`: N random unit vectors, 5 per class."""
    from rankopt.metrics import evaluate
    from rankopt.metrics.topk import chunked_topk

    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=1)
    y = torch.randperm(n, generator=g) // 5
    xd, yd = x.to(device), y.to(device)
    floor = _timed(lambda: chunked_topk(xd, xd, 101), device)
    ours = _timed(lambda: evaluate(xd, yd, metrics=METRICS, similarity="cosine"), device)
    result = evaluate(xd, yd, metrics=METRICS, similarity="cosine").metrics
    pml_text, agree = "–", ""
    try:
        from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

        calc = AccuracyCalculator(include=("precision_at_1", "mean_average_precision_at_r"), k="max_bin_count",
                                  device=device)
        start = time.perf_counter()
        pml = calc.get_accuracy(xd, yd, xd, yd, ref_includes_query=True)
        pml_text = f"{time.perf_counter() - start:.2f} s"
        agree = (f"{result['recall@1']:.4f} / {pml['precision_at_1']:.4f}, "
                 f"{result['map@r']:.4f} / {pml['mean_average_precision_at_r']:.4f}")
    except (ImportError, NameError) as err:  # PML's AccuracyCalculator needs faiss (a NameError without it)
        pml_text = f"not run ({err})"
    return f"| {n:,} | {floor:.3f} s | {ours:.3f} s | **{ours / floor:.2f}×** | {pml_text} | {agree} |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 8192, 16384])
    parser.add_argument("--eval-sizes", type=int, nargs="+", default=[60_000, 200_000])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--give-up", type=float, default=5.0, help="seconds per call beyond which larger B are skipped")
    parser.add_argument("--quick", action="store_true", help="B = 256, 1024 and N = 5000 (a check that it runs)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure", file=sys.stderr)
        return 1
    if args.quick:
        args.sizes, args.eval_sizes, args.repeats = [256, 1024], [5000], 2
    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(device)
    from rankopt.runtime import keep_allocations

    keep_allocations()
    losses = loss_table(args.sizes, args.dim, args.repeats, args.give_up, device)
    evaluation = evaluation_table(args.eval_sizes, args.dim, device)
    text = "\n".join([
        "# rankopt on a CUDA GPU", "",
        f"Command: `python benchmarks/bench_cuda.py{' --quick' if args.quick else ''}`  ",
        f"Machine: {props.name} ({props.total_memory / 2**30:.0f} GiB), torch {torch.__version__}, "
        f"Python {platform.python_version()}; {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}", "",
        f"## Losses: forward + backward, d = {args.dim}, 4 per class (median of {args.repeats}; peak memory above the inputs)", "",
        *losses, "",
        "## Exact evaluation (self-retrieval, 512-d, 5 per class) against the product + top-k floor", "",
        *evaluation, "",
    ])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
