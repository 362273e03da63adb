"""The fp32 matrix-product floor of exact evaluation on this machine.

Exact retrieval metrics over N embeddings need the N x N score matrix, computed once
(symmetric tiles, rankopt's self-retrieval path) or twice (a full product, as a flat
faiss index does). This script measures the machine's matmul throughput on the tile
shape rankopt uses (4096 x d @ d x 4096) and prints the time that the products alone
take at N = 10k, 30k and 60k, d = 512: no exact method can be faster than that.

    python benchmarks/matmul_floor.py            # writes benchmarks/results/matmul_floor.md
"""

from __future__ import annotations

import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import torch


def throughput(tile: int = 4096, dim: int = 512, repeats: int = 5) -> float:
    """Best-of-``repeats`` GFLOP/s of a ``(tile, dim) @ (dim, tile)`` float32 product."""
    a, b = torch.randn(tile, dim), torch.randn(tile, dim)
    a @ b.T  # warm-up
    best = min(_timed(lambda: a @ b.T) for _ in range(repeats))
    return 2 * tile * tile * dim / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    dim = 512
    gflops = throughput(dim=dim)
    rows = []
    for n in (10_000, 30_000, 60_000):
        full = 2 * n * n * dim / gflops / 1e9
        rows.append(f"| {n:,} | {full / 2:.1f} s | {full:.1f} s |")
    text = "\n".join([
        "# The fp32 matrix-product floor of exact evaluation",
        "",
        "Command: `python benchmarks/matmul_floor.py`  ",
        f"Machine: {platform.machine()}, {torch.get_num_threads()} torch threads, torch {torch.__version__}  ",
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        "",
        f"Measured float32 matmul throughput (4096 x {dim} @ {dim} x 4096, best of 5): **{gflops:.0f} GFLOP/s**.",
        "",
        "| N (query = gallery, d = 512) | symmetric product (half the matrix, rankopt) | full product (flat index) |",
        "|---:|---:|---:|",
        *rows,
        "",
        "An exact evaluation cannot take less than its products. A ratio against a peer that",
        "computes the full product is therefore capped near 2x plus whatever the peer spends",
        "beyond its product (PML's label counting, for instance).",
    ])
    print(text)
    out = Path(__file__).parent / "results" / "matmul_floor.md"
    out.write_text(text + "\n")


if __name__ == "__main__":
    main()
