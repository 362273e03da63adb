"""Benchmark peak memory of ``rankopt embed`` and ``rankopt evaluate-embeddings`` against the set size N.

Each command runs in a fresh subprocess that first imports what the command needs (the baseline), then
runs it while a thread samples ``/proc/self/status`` every 2 ms. Reported above the baseline: the peak
resident set (``VmHWM``: includes the pages of memory-mapped files that were read, which the kernel may
drop under pressure) and the peak anonymous memory (``RssAnon``: what cannot be dropped), next to the
size of the embeddings ``N x D x 4`` bytes.

(a) ``rankopt embed CKPT --images DIR --out E.npy``: N generated 32 x 32 PNGs, the omniglot recipe's
    convnet (untrained), batch size 256: the embeddings are written straight into ``E.npy``.
(b) ``rankopt evaluate-embeddings``: 1,000 queries against N memory-mapped d = 128 vectors (cosine,
    recall@1, recall@10, map@r, map); at the largest N once more with ``--ref-block-size`` (the gallery
    read and normalised block by block instead of whole).

    python benchmarks/bench_memory.py --threads 2                                    # full run
    python benchmarks/bench_memory.py --embed-sizes 2000 --eval-sizes 10000 --no-write   # quick check

Writes benchmarks/results/memory.md and memory.csv.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from rankopt.config import config_to_dict, load_config
from rankopt.engine.assembly import build_model
from rankopt.engine.checkpoint import save_checkpoint
from rankopt.describe import machine_info
from rankopt.files import open_npy_atomic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_search import load_text, make_images  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MIB = 2**20
CHILD = r"""
import json, resource, sys, threading, time
import torch
torch.set_num_threads(int(sys.argv[1]))
import rankopt.cli, rankopt.cli.embed, rankopt.cli.evaluate_embeddings, rankopt.engine.assembly
import rankopt.engine.embed_and_score, rankopt.data.image_folder, rankopt.metrics

def status():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {key: int(fields[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM", "RssAnon")}

base = status()
peak = {"anon": base["RssAnon"]}
done = threading.Event()

def sample():
    while not done.wait(0.002):
        peak["anon"] = max(peak["anon"], status()["RssAnon"])

thread = threading.Thread(target=sample, daemon=True)
thread.start()
start = time.perf_counter()
code = rankopt.cli.main(sys.argv[2:])
seconds = time.perf_counter() - start
done.set()
thread.join()
end = status()
peak["anon"] = max(peak["anon"], end["RssAnon"])
print("MEMORY " + json.dumps({"rc": code, "seconds": seconds, "base_rss": base["VmRSS"], "base_anon": base["RssAnon"],
                              "peak_rss": end["VmHWM"], "peak_anon": peak["anon"]}))
"""


def measure(argv: list[str], threads: int) -> dict:
    """Run ``rankopt ARGV`` in a fresh interpreter; its memory figures (bytes) and seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, "-c", CHILD, str(threads), *argv], capture_output=True, text=True, env=env,
                          check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("MEMORY ")]
    if done.returncode or not lines:
        raise RuntimeError(f"rankopt {' '.join(argv)} failed:\n{done.stdout}\n{done.stderr}")
    result = json.loads(lines[-1][len("MEMORY "):])
    if result["rc"]:
        raise RuntimeError(f"rankopt {' '.join(argv)} returned {result['rc']}:\n{done.stderr}")
    return result


def row(section: str, num: int, dim: int, figures: dict) -> dict:
    """One result row, in MiB above the child's baseline."""
    return {"section": section, "N": num, "d": dim, "embeddings_mib": num * dim * 4 / MIB,
            "baseline_rss_mib": figures["base_rss"] / MIB,
            "peak_rss_above_mib": (figures["peak_rss"] - figures["base_rss"]) / MIB,
            "peak_anon_above_mib": (figures["peak_anon"] - figures["base_anon"]) / MIB, "seconds": figures["seconds"]}


def embed_case(work: Path, num: int, checkpoint: Path, threads: int) -> dict:
    folder = make_images(work / f"images{num}", num)
    out = work / f"E{num}.npy"
    figures = measure(["embed", str(checkpoint), "--images", str(folder), "--out", str(out), "--batch-size", "256",
                       "--no-progress"], threads)
    dim = int(np.load(out, mmap_mode="r").shape[1])
    shutil.rmtree(folder)
    return row("embed", num, dim, figures)


def eval_case(work: Path, num: int, queries: int, dim: int, threads: int, ref_block_size: int | None = None) -> dict:
    """1,000 queries vs ``num`` vectors in ``num // 10`` classes (a class centre plus noise), written block by block;
    with ``ref_block_size``, evaluated with ``--ref-block-size``."""
    gen = np.random.default_rng(num)
    classes = max(2, num // 10)
    centres = gen.standard_normal((classes, dim), dtype=np.float32)
    paths = {}
    for name, rows in (("E", num), ("Q", queries)):
        labels = gen.integers(0, classes, rows)
        with open_npy_atomic(work / f"{name}.npy", (rows, dim), np.float32) as array:
            for start in range(0, rows, 50_000):
                part = labels[start : start + 50_000]
                array[start : start + len(part)] = centres[part] + gen.standard_normal((len(part), dim), dtype=np.float32)
        np.save(work / f"{name}.labels.npy", labels)
        paths[name] = (str(work / f"{name}.npy"), str(work / f"{name}.labels.npy"))
    figures = measure(["evaluate-embeddings", "--embeddings", paths["E"][0], "--labels", paths["E"][1],
                       "--query-embeddings", paths["Q"][0], "--query-labels", paths["Q"][1],
                       "--metrics", "recall@1", "recall@10", "map@r", "map", "--no-progress",
                       *(["--ref-block-size", str(ref_block_size)] if ref_block_size else [])], threads)
    return row(f"evaluate --ref-block-size {ref_block_size:,}" if ref_block_size else "evaluate", num, dim, figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each command")
    parser.add_argument("--embed-sizes", type=int, nargs="+", default=[10_000, 50_000])
    parser.add_argument("--eval-sizes", type=int, nargs="+", default=[10_000, 50_000, 200_000])
    parser.add_argument("--ref-block-size", type=int, default=10_000,
                        help="gallery rows per block of the extra evaluate row at the largest N (0: no such row)")
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="rankopt_bench_memory_"))
    rows = []
    try:
        cfg = load_config("omniglot", ["model.pretrained=false"])
        torch.manual_seed(0)
        checkpoint = save_checkpoint(work / "model.ckpt", {"model": build_model(cfg).state_dict(),
                                                           "config": config_to_dict(cfg)})
        for num in args.embed_sizes:
            rows.append(embed_case(work, num, checkpoint, args.threads))
            print(rows[-1], flush=True)
        for num in args.eval_sizes:
            rows.append(eval_case(work, num, args.queries, args.dim, args.threads))
            print(rows[-1], flush=True)
        if args.ref_block_size:
            rows.append(eval_case(work, max(args.eval_sizes), args.queries, args.dim, args.threads, args.ref_block_size))
            print(rows[-1], flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = report(rows, args, started, load_start)
    print(text)
    if not args.no_write:
        (RESULTS / "memory.md").write_text(text)
        with open(RESULTS / "memory.csv", "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


def report(rows: list[dict], args: argparse.Namespace, started: datetime.datetime,
           load_start: tuple[float, float, float]) -> str:
    info = machine_info("cpu")
    command = "python benchmarks/bench_memory.py " + " ".join(sys.argv[1:])
    lines = [
        "# Peak memory of `rankopt embed` and `rankopt evaluate-embeddings` against N", "",
        f"- command: `{command.strip()}`",
        f"- machine: {info['platform']}, {info['cpu_count']} CPU cores, torch {info['torch']} "
        f"({args.threads} threads), Python {info['python']}; no GPU",
        f"- date: {started:%Y-%m-%d %H:%M} UTC; load average at the start {load_text(load_start)}, "
        f"at the end {load_text(os.getloadavg())}",
        "", "Each command in a fresh interpreter; the baseline is its resident set after importing torch and rankopt's "
        "CLI modules. *peak RSS above*: the peak resident set minus the baseline; it includes the pages of the "
        "memory-mapped embeddings that were read or written (file-backed, dropped by the kernel under pressure). "
        "*peak anonymous above*: the peak of the process's own memory (`RssAnon`, sampled every 2 ms) minus the "
        "baseline's: what the set costs in RAM.", "",
        "(a) `rankopt embed CKPT --images DIR --out E.npy`: generated 32 x 32 PNGs in 100 class folders, the omniglot "
        "recipe's convnet (untrained), batch size 256, the embeddings written straight into `E.npy`. "
        f"(b) `rankopt evaluate-embeddings`: {args.queries:,} memory-mapped queries against N memory-mapped "
        f"vectors (d = {args.dim}, cosine, recall@1, recall@10, map@r, map): the gallery is L2-normalised once "
        "in memory; the query chunks are read and normalised one at a time. With `--ref-block-size ROWS` the gallery "
        "too is read and normalised ROWS rows at a time, never whole (no prepared copy of it in memory).", "",
        "| command | N | d | embeddings (MiB) | baseline RSS (MiB) | peak RSS above (MiB) | peak anonymous above (MiB) | seconds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['section']} | {r['N']:,} | {r['d']} | {r['embeddings_mib']:.1f} | {r['baseline_rss_mib']:.0f} | "
                     f"{r['peak_rss_above_mib']:.1f} | {r['peak_anon_above_mib']:.1f} | {r['seconds']:.1f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
