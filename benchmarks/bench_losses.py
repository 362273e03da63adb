"""Forward+backward time and peak memory of the rank losses against batch size.

Each (loss, B) runs in a fresh subprocess: random d-dimensional embeddings, ``per_class``
images per class (3-level labels fine -> fine // 4 -> fine // 16 for ``hap``; ``(fine, fine // 8, 0)``,
the coarsest level shared by the whole batch, for ``hap_shared`` and ``happier``; proxies for every
fine class for ``rod_ap`` / ``happier``), one warm-up call, then the median of ``--repeats`` timed
``loss(x, y).backward()`` calls. Peak memory is the peak RSS above the process after it built its
inputs and made one call on 8 items (lazy imports, numba kernels; ``ru_maxrss``). pytorch-metric-learning's
SmoothAPLoss and FastAPLoss run side by side (PML SmoothAP materialises B^3 tensors: capped by
``--pml-smooth-ap-max``). A loss is not run at larger B once it failed or took over ``--give-up`` s.

``--ratios``: the combinations against their parts (``roadmap``, ``calibration``, ``rod_ap`` against
``sup_ap``; ``happier`` against ``hap_shared``; ``hap_shared`` against ``sup_ap``), every configuration run
``--rounds`` times round-robin (so a change of the machine's load hits every loss alike) and the median
over rounds reported. Each mode rewrites its own section of ``--out`` and keeps the other.

    python benchmarks/bench_losses.py                      # full run (the main table in results/losses.md)
    python benchmarks/bench_losses.py --ratios             # the ratio table in results/losses.md
    python benchmarks/bench_losses.py --sizes 128 512 --repeats 1 --out /tmp/losses.md   # quick check
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rankopt.files import write_text_atomic
from rankopt.runtime import keep_allocations

OURS = ["sup_ap", "smooth_ap", "calibration", "roadmap", "rod_ap", "hap", "hap_shared", "happier", "sup_recall", "fastap", "softbin_ap"]
PML = {"pml_smooth_ap": "SmoothAPLoss", "pml_fastap": "FastAPLoss"}
SIZES = [128, 256, 512, 1024, 2048, 4096, 8192]
SHARED_TOP = ("hap_shared", "happier")
"""Losses run on labels ``(fine, fine // 8, 0)``: the coarsest level shared by every item of the batch."""
RATIOS = {"calibration": "sup_ap", "roadmap": "sup_ap", "rod_ap": "sup_ap", "happier": "hap_shared", "hap_shared": "sup_ap"}
"""``--ratios``: each loss against the part it is compared with."""
RATIO_SIZES = [512, 4096, 8192]
SHARED_TOP_MAX = 4096
"""``--ratios``: ``hap_shared`` and ``happier`` run up to this B (their target sizes are 512 and 4096)."""
REFERENCE = """Reference figures from issue 3 (same machine, quiet; official code / PML 2.9):

| B | official ROADMAP SupAP + calibration | official Smooth-AP | PML SmoothAPLoss | PML FastAPLoss |
|---:|---|---|---|---|
| 256 | 1.75 s / 864 MiB | 0.51 s / 635 MiB | 0.27 s / 365 MiB | 7.8 ms / 38 MiB |
| 512 | 15.9 s / 4.7 GiB | 4.9 s / 4.5 GiB | 2.6 s / 2.7 GiB | 30 ms / 124 MiB |
| 768 | 63 s / 15.9 GiB | 17.9 s / 15.2 GiB | 9.7 s / 9.0 GiB | – |
| 1024 | out of memory (24 GiB) | out of memory | out of memory | 0.24 s / 235 MiB |
| 4096 | – | – | – | 5.8 s / 3.0 GiB |
| 8192 | – | – | – | 21.5 s / 11.6 GiB |

Targets: sup_ap and smooth_ap at B = 4096 in <= 1.5 s and <= 2 GiB, B = 8192 in <= 6 s; hap (3 levels) at B = 4096 within 6 GiB."""


def worker(name: str, batch: int, dim: int, per_class: int, repeats: int) -> dict:
    """Run one configuration in this process and return its measurements."""
    import torch

    torch.manual_seed(0)
    x = torch.randn(batch, dim)
    fine = torch.arange(batch) // per_class
    if name == "hap":
        labels = torch.stack([fine, fine // 4, fine // 16], dim=1)
    elif name in SHARED_TOP:
        labels = torch.stack([fine, fine // 8, torch.zeros_like(fine)], dim=1)
    else:
        labels = fine
    if name in PML:
        import pytorch_metric_learning.losses as pml

        loss = getattr(pml, PML[name])()
    else:
        import rankopt.losses

        proxies = dict(num_classes=int(fine.max()) + 1, embedding_dim=dim) if name in ("rod_ap", "happier") else {}
        loss = rankopt.losses.build("hap" if name == "hap_shared" else name, **proxies)
    loss(x[:8].clone().requires_grad_(True), labels[:8]).backward()  # lazy imports and compiled kernels, before the baseline
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times, value = [], float("nan")
    for i in range(repeats + 1):
        xg = x.clone().requires_grad_(True)
        start = time.perf_counter()
        out = loss(xg, labels)
        out.backward()
        elapsed = time.perf_counter() - start
        value = out.item()
        if i:
            times.append(elapsed)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"time_s": statistics.median(times), "peak_mib": (peak - base) / 1024.0, "value": value}


def run_worker(cmd: list[str], timeout: float) -> dict:
    """Run a worker process; its last stdout line is a JSON result, else ``{"error": why}``."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout > {timeout:.0f} s"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["killed"])[-1]
        return {"error": "out of memory" if "memory" in tail.lower() or proc.returncode < 0 else tail[:60]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_one(name: str, batch: int, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--worker", name, str(batch), "--dim", str(args.dim), "--per-class", str(args.per_class), "--repeats", str(args.repeats)]
    return run_worker(cmd, args.timeout)


def fmt(result: dict | None) -> str:
    if result is None:
        return "–"
    if "error" in result:
        return result["error"]
    t = result["time_s"]
    time_str = f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.2f} s"
    mem = result["peak_mib"]
    mem_str = f"{mem:.0f} MiB" if mem < 1024 else f"{mem / 1024:.2f} GiB"
    return f"{time_str} / {mem_str}"


def machine_line() -> str:
    """:func:`rankopt.describe.machine_info` on one line (torch imported here: the parent process never needs it)."""
    from rankopt.describe import machine_info

    info = machine_info("cpu")
    return (f"{info['platform']}, {info['cpu_count']} CPU cores, Python {info['python']}, torch {info['torch']}, "
            f"torch threads {info['torch_threads']}")


def write_section(path: Path, name: str, lines: list[str]) -> None:
    """Replace section ``name`` of a results file (between its marker comments) and keep the other sections;
    a file without sections is replaced."""
    begin, end = f"<!-- section {name} -->", f"<!-- end {name} -->"
    text = path.read_text() if path.exists() else ""
    block = "\n".join([begin, *lines, end])
    if begin in text and end in text:
        text = text[: text.index(begin)] + block + text[text.index(end) + len(end) :]
    elif "<!-- section " in text:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    else:
        text = block + "\n"
    write_text_atomic(path, text)


def ratio_run(args: argparse.Namespace, command: str) -> list[str]:
    """``--ratios``: every (loss, B) ``--rounds`` times round-robin; the median over rounds, then the ratios."""
    losses = list(dict.fromkeys([*RATIOS.values(), *RATIOS]))
    runs: dict[tuple[str, int], list[dict]] = {}
    loads, started = [os.getloadavg()[0]], time.time()
    for round_ in range(args.rounds):
        for batch in args.sizes:
            for name in losses:
                if name in SHARED_TOP and batch > SHARED_TOP_MAX:
                    runs[name, batch] = [{"error": "–"}]
                    continue
                res = run_one(name, batch, args)
                runs.setdefault((name, batch), []).append(res)
                loads.append(os.getloadavg()[0])
                print(f"round {round_ + 1}/{args.rounds} {name:12s} B={batch:6d}  {fmt(res)}  load {loads[-1]:.2f}", flush=True)

    def median(name: str, batch: int) -> dict:
        ok = [r for r in runs[name, batch] if "error" not in r]
        if not ok:
            return runs[name, batch][0]
        return {key: statistics.median(r[key] for r in ok) for key in ("time_s", "peak_mib")}

    results = {key: median(*key) for key in runs}
    lines = [
        "## Combined losses against their parts",
        "",
        f"- command: `{command}`",
        f"- date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; total {time.time() - started:.0f} s",
        f"- machine: {machine_line()}; load average (1 min) {min(loads):.2f}–{max(loads):.2f} during the run (median {statistics.median(loads):.2f})",
        f"- d = {args.dim}, {args.per_class} per class; each configuration in a fresh process, median of {args.repeats} calls after a warm-up,"
        f" run {args.rounds} times round-robin: the median of the {args.rounds} runs. Memory = peak RSS above the process that built its inputs and made a call on 8 items.",
        f"- `hap_shared`, `happier`: labels `(fine, fine // 8, 0)`, the coarsest level shared by every item of the batch; run up to B = {SHARED_TOP_MAX}.",
        *([f"- {args.note}"] if args.note else []),
        "",
        "| B | " + " | ".join(losses) + " | " + " | ".join(f"{n} / {d}" for n, d in RATIOS.items()) + " |",
        "|---:|" + "---|" * (len(losses) + len(RATIOS)),
    ]
    for batch in args.sizes:
        ratios = []
        for name, part in RATIOS.items():
            a, b = results[name, batch], results[part, batch]
            ratios.append(f"**{a['time_s'] / b['time_s']:.2f}×**" if "time_s" in a and "time_s" in b else "–")
        lines.append(f"| {batch} | " + " | ".join(fmt(results[n, batch]) for n in losses) + " | " + " | ".join(ratios) + " |")
    return lines


def main() -> None:
    keep_allocations()  # as every rankopt command does (rankopt.runtime)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", help=f"batch sizes (default {SIZES}; with --ratios {RATIO_SIZES})")
    parser.add_argument("--losses", nargs="+", default=OURS + list(PML))
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--per-class", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ratios", action="store_true", help="the combined losses against their parts (their own section of --out)")
    parser.add_argument("--rounds", type=int, default=3, help="--ratios: runs of every configuration, round-robin")
    parser.add_argument("--note", default="", help="a line added to the section (e.g. the previous figures)")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per configuration")
    parser.add_argument("--give-up", type=float, default=30.0, help="skip larger B once a call took longer")
    parser.add_argument("--pml-smooth-ap-max", type=int, default=512, help="largest B for PML SmoothAPLoss (B^3 memory)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "losses.md")
    parser.add_argument("--worker", nargs=2, metavar=("LOSS", "B"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.dim, args.per_class, args.repeats)))
        return
    command = "python " + " ".join([str(Path(sys.argv[0]))] + sys.argv[1:])
    args.sizes = args.sizes or (RATIO_SIZES if args.ratios else SIZES)
    if args.ratios:
        lines = ratio_run(args, command)
        write_section(args.out, "ratios", lines)
        print("\n".join(lines))
        return

    from rankopt.losses import LOSSES

    losses = [n for n in args.losses if n in PML or n in LOSSES or n == "hap_shared"]
    skipped = sorted(set(args.losses) - set(losses))
    results: dict[tuple[str, int], dict | None] = {}
    started, load_start = time.time(), os.getloadavg()[0]
    for name in losses:
        stop = False
        for batch in args.sizes:
            if stop or (name == "pml_smooth_ap" and batch > args.pml_smooth_ap_max):
                results[name, batch] = None
                continue
            res = run_one(name, batch, args)
            results[name, batch] = res
            print(f"{name:14s} B={batch:6d}  {fmt(res)}", flush=True)
            stop = "error" in res or res["time_s"] > args.give_up

    header = "| B | " + " | ".join(losses) + " |"
    lines = [
        "# Rank losses: forward + backward time / peak memory",
        "",
        f"- command: `{command}`",
        f"- date: {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC; total {time.time() - started:.0f} s",
        f"- machine: {machine_line()}, load average {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end",
        f"- d = {args.dim}, {args.per_class} per class, median of {args.repeats} calls after a warm-up, each config in a fresh process;"
        " memory = peak RSS above the process that built the inputs and made a call on 8 items (imports, compiled kernels). `–`: not run (B^3 cap or an earlier failure/time-out).",
        f"- hap: 3-level labels (fine, fine // 4, fine // 16); hap_shared, happier: (fine, fine // 8, 0). Not registered here: {', '.join(skipped) or 'none'}.",
        *([f"- {args.note}"] if args.note else []),
        "",
        header,
        "|---:|" + "---|" * len(losses),
    ]
    for batch in args.sizes:
        lines.append(f"| {batch} | " + " | ".join(fmt(results.get((n, batch))) for n in losses) + " |")
    lines += ["", REFERENCE]
    write_section(args.out, "table", lines)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
