"""Cost of ``hap`` (Sup-H-AP) against the batch size and the coarsest class's share of the batch.

Both ways of counting the exact step parts run side by side: ``sorted`` (each row's pivots sorted
once, per-level suffix sums; only pivots with a less relevant item enter the ``H^-`` kernel) and
``pairwise`` (the previous path: ``P^2`` comparisons per query, every pivot through the kernel).
Labels: ``per_class`` images per fine class; hierarchies shaped like

* ``benchmark``: ``(fine, fine // 4, fine // 16)``, the labels of ``bench_losses.py``;
* ``issue``: ``(fine, fine // 8, 0)``, the coarsest level shared by every item (f = 1);
* ``inat_full``: iNaturalist's 7 levels, kingdoms holding 60 / 36 / 4 % of the batch, phyla 45 / 15 / 36 / 4 %;
* ``dyml``: DyML's 3 levels, 5 coarse classes holding 30 / 25 / 20 / 15 / 10 %;
* ``sop``: SOP's 2 levels with its hierarchical sampler (2 super-classes per batch, 50 % each);
* ``f=...``: ``(fine, fine // 8, coarse)``, one coarse class holding the fraction f of the batch, the
  others 8 fine classes each (the sweep over f at ``--f-batch``).

Intermediate levels are ``(coarsest, fine // d)``, so every hierarchy is a tree. Each run is a fresh
process: random d-dimensional embeddings, ``loss(x, y).backward()`` timed once after a warm-up call
(no warm-up above 2 s); memory = peak RSS above the process that built its inputs and made one call on
8 items (lazy imports, numba kernels). A path is not run at larger B once a call took over ``--give-up``
seconds. ``sup_ap`` on the finest labels runs at every B too: the ``issue`` hierarchy (every item sharing
the coarsest level) is reported against it.

    python benchmarks/bench_hierarchical.py            # the table in results/hierarchical_losses.md
    python benchmarks/bench_hierarchical.py --sizes 256 512 --fractions 0.5 1 --out /tmp/h.md   # quick check
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import io
import json
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

from bench_losses import fmt, run_worker

SHAPES: dict[str, tuple[tuple[int, ...], tuple[tuple[float, ...], ...]]] = {
    # name: (divisors of the fine class index for the intermediate levels, nested coarse partitions finest first)
    "benchmark": ((4,), ()),
    "issue": ((8,), ((1.0,),)),
    "inat_full": ((2, 4, 16, 64), ((0.45, 0.15, 0.36, 0.04), (0.6, 0.36, 0.04))),
    "dyml": ((8,), ((0.3, 0.25, 0.2, 0.15, 0.1),)),
    "sop": ((), ((0.5, 0.5),)),
}
SIZES = [256, 512, 1024, 2048, 4096]
REFERENCE = "sup_ap"
"""The worker's name for ``sup_ap`` on the finest labels (the denominator of the ``issue`` ratio)."""
FRACTIONS = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]
PATHS = ("pairwise", "sorted")


def partition(num_classes: int, fractions: tuple[float, ...]):
    """Coarse class of each fine class: consecutive blocks holding ``fractions`` of the classes."""
    import torch

    bounds = torch.tensor(fractions, dtype=torch.float64).cumsum(0) * num_classes
    return torch.bucketize(torch.arange(num_classes, dtype=torch.float64) + 0.5, bounds).clamp(max=len(fractions) - 1)


def hierarchy(shape: str, batch: int, per_class: int):
    """``(B, L)`` labels, column 0 finest, of a named shape or ``f=<fraction>``."""
    import torch

    fine = torch.arange(batch) // per_class
    num_fine = int(fine.max()) + 1
    if shape == "benchmark":
        return torch.stack([fine, fine // 4, fine // 16], dim=1)
    if shape.startswith("f="):
        f = float(shape[2:])
        shared = round(f * num_fine)  # fine classes in the big coarse class; the others 8 per coarse class
        top = torch.where(torch.arange(num_fine) < shared, 0, 1 + (torch.arange(num_fine) - shared) // 8)
        divisors, coarse = (8,), [top]
    else:
        divisors, partitions = SHAPES[shape]
        coarse = [partition(num_fine, p) for p in partitions]
    top = coarse[0][fine]  # the finest coarse partition: intermediate levels nest in it
    levels = [fine] + [top * batch + fine // d for d in divisors] + [c[fine] for c in coarse]
    return torch.stack(levels, dim=1)


def worker(shape: str, batch: int, path: str, dim: int, per_class: int) -> dict:
    """Run one configuration in this process and return its measurements."""
    import torch

    import rankopt.losses

    torch.manual_seed(0)
    if shape == REFERENCE:  # Sup-AP on the finest labels: what hap is compared with
        x, labels = torch.randn(batch, dim), (torch.arange(batch) // per_class).unsqueeze(1)
        loss = rankopt.losses.build("sup_ap")
    else:
        x, labels = torch.randn(batch, dim), hierarchy(shape, batch, per_class)
        loss = rankopt.losses.build("hap", step_counts=path)
    loss(x[:8].clone().requires_grad_(True), labels[:8]).backward()  # lazy imports and compiled kernels, before the baseline
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    elapsed, calls = float("inf"), 0
    while calls < 2 and (calls == 0 or elapsed <= 2.0):
        xg = x.clone().requires_grad_(True)
        start = time.perf_counter()
        out = loss(xg, labels)
        out.backward()
        elapsed, calls = time.perf_counter() - start, calls + 1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    top_fraction = float(torch.bincount(labels[:, -1]).max()) / batch
    return {"time_s": elapsed, "peak_mib": (peak - base) / 1024.0, "value": out.item(), "levels": labels.shape[1], "f": top_fraction}


def run_one(shape: str, batch: int, path: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--worker", shape, str(batch), path, "--dim", str(args.dim), "--per-class", str(args.per_class)]
    return run_worker(cmd, args.timeout)


def sweep(shapes: list[str], sizes: list[int], args: argparse.Namespace) -> list[dict]:
    """Every (shape, B, path), each path stopping at larger B once a call took over ``--give-up`` s."""
    rows = []
    for shape in shapes:
        for path in PATHS:
            stop = False
            for batch in sizes:
                res = {"error": "–"} if stop else run_one(shape, batch, path, args)
                rows.append({"shape": shape, "B": batch, "path": path, **res})
                print(f"{shape:10s} B={batch:5d} {path:8s} {fmt(None if stop else res)}", flush=True)
                stop = stop or "error" in res or res["time_s"] > args.give_up
    return rows


def plot(rows: list[dict], shapes: list[str], fractions: list[str], f_batch: int, out: Path) -> None:
    """Time against B per shape, and against f at ``f_batch``; solid: sorted, dashed: pairwise. Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, shape in enumerate(shapes):
        for path, style in zip(PATHS, ("--", "-"), strict=True):
            pts = [(r["B"], r["time_s"]) for r in rows if r["shape"] == shape and r["path"] == path and "time_s" in r]
            if pts:
                left.plot(*zip(*pts), style, marker="o", color=f"C{i}", label=f"{shape} ({path})")
    left.set(xscale="log", yscale="log", xlabel="batch size B", ylabel="forward + backward (s)", title="hap: cost against B")
    left.xaxis.set_minor_locator(NullLocator())
    left.set_xticks(sorted({r["B"] for r in rows}), labels=[str(b) for b in sorted({r["B"] for r in rows})])
    left.legend(fontsize=7)
    for path, style in zip(PATHS, ("--", "-"), strict=True):
        pts = [(r["f"], r["time_s"]) for r in rows if r["shape"] in fractions and r["path"] == path and "time_s" in r]
        if pts:
            right.plot(*zip(*sorted(pts)), style, marker="o", color="k", label=path)
    right.set(yscale="log", xlabel="coarsest class's fraction f of the batch", ylabel="forward + backward (s)", title=f"hap at B = {f_batch}, (fine, fine // 8, coarse)")
    right.legend()
    fig.tight_layout()
    with tempfile.NamedTemporaryFile(dir=out.parent, suffix=".png", delete=False) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    os.replace(tmp.name, out)
    plt.close(fig)


def table(rows: list[dict], shapes: list[str], sizes: list[int], key: str) -> list[str]:
    """A markdown table: one row per ``key`` value, ``pairwise`` and ``sorted`` side by side per shape."""
    lines = ["| " + key + " | " + " | ".join(f"{s} pairwise | {s} sorted" for s in shapes) + " |", "|---:|" + "---|---|" * len(shapes)]
    by = {(r["shape"], r["B"], r["path"]): r for r in rows}
    for batch in sizes:
        cells = [fmt(by.get((s, batch, p))) if (s, batch, p) in by else "" for s in shapes for p in PATHS]
        lines.append(f"| {batch} | " + " | ".join(cells) + " |")
    return lines


def shared_top_table(rows: list[dict], reference: dict[int, dict], sizes: list[int]) -> list[str]:
    """``hap`` with the coarsest level shared by the whole batch (shape ``issue``, sorted) against ``sup_ap`` at each B."""
    by = {r["B"]: r for r in rows if r["shape"] == "issue" and r["path"] == "sorted"}
    lines = ["## The coarsest level shared by every item: hap against sup_ap", "",
             "| B | sup_ap (finest labels) | hap, issue, sorted | hap / sup_ap |", "|---:|---|---|---|"]
    for batch in sizes:
        hap, ref = by.get(batch, {}), reference[batch]
        ratio = f"**{hap['time_s'] / ref['time_s']:.2f}×**" if "time_s" in hap and "time_s" in ref else "–"
        lines.append(f"| {batch} | {fmt(ref)} | {fmt(hap) if hap else '–'} | {ratio} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--fractions", type=float, nargs="+", default=FRACTIONS, help="coarsest class fractions f of the sweep")
    parser.add_argument("--f-batch", type=int, default=512, help="batch size of the sweep over f")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--per-class", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=45.0, help="seconds per configuration")
    parser.add_argument("--give-up", type=float, default=10.0, help="skip larger B once a call took longer")
    parser.add_argument("--note", default="", help="a line added under the header (e.g. the previous figures)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "hierarchical_losses.md")
    parser.add_argument("--worker", nargs=3, metavar=("SHAPE", "B", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.worker[2], args.dim, args.per_class)))
        return

    from rankopt.files import write_text_atomic

    started, load_start = time.time(), os.getloadavg()[0]
    fractions = [f"f={f:g}" for f in args.fractions]
    rows = sweep(args.shapes, args.sizes, args)
    reference = {batch: run_one(REFERENCE, batch, "sorted", args) for batch in args.sizes}
    f_rows = sweep(fractions, [args.f_batch], args)
    for r in f_rows:
        r["f"] = r.get("f", float(r["shape"][2:]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    png = args.out.with_suffix(".png")
    plot(rows + f_rows, args.shapes, fractions, args.f_batch, png)
    buffer = io.StringIO()
    fields = ["shape", "B", "path", "levels", "f", "time_s", "peak_mib", "value", "error"]
    writer = csv.DictWriter(buffer, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows + f_rows)
    write_text_atomic(args.out.with_suffix(".csv"), buffer.getvalue())

    levels = {r["shape"]: f"{r['levels']} levels, f = {r['f']:.2f}" for r in rows if "levels" in r}
    command = "python " + " ".join([str(Path(sys.argv[0]))] + sys.argv[1:])
    lines = [
        "# Hierarchical rank loss (hap): sorted against pairwise exact step counts",
        "",
        f"- command: `{command}`",
        f"- date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; total {time.time() - started:.0f} s",
        f"- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, torch {__import__('torch').__version__}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end",
        f"- d = {args.dim}, {args.per_class} per class; forward + backward of one call after a warm-up (none above 2 s), each run in a fresh "
        "process; memory = peak RSS above the process that built the inputs. `–`: not run (an earlier B took over "
        f"{args.give_up:g} s or failed). `pairwise` = the previous path (`step_counts=\"pairwise\"`), `sorted` = the default.",
        "- shapes: " + "; ".join(f"{s}: {levels.get(s, '?')}" for s in args.shapes) + " (f = the coarsest class's fraction of the batch).",
        *([f"- {args.note}"] if args.note else []),
        "",
        "## Cost against the batch size",
        "",
        *table(rows, args.shapes, args.sizes, "B"),
        "",
        *shared_top_table(rows, reference, args.sizes),
        "",
        f"## Cost against the coarsest class's fraction f (B = {args.f_batch}, labels (fine, fine // 8, coarse))",
        "",
        "| f | pairwise | sorted |",
        "|---:|---|---|",
    ]
    by = {(r["shape"], r["path"]): r for r in f_rows}
    lines += [f"| {f[2:]} | {fmt(by.get((f, 'pairwise')))} | {fmt(by.get((f, 'sorted')))} |" for f in fractions]
    lines += ["", f"![hap cost]({png.name})", ""]
    write_text_atomic(args.out, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
