"""``rankopt serve`` as its own process on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_server(index: Path, *options: str) -> Iterator[str]:
    """``rankopt serve INDEX OPTIONS`` as its own process on a free loopback port; its base URL."""
    import httpx

    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = open(index.parent / f"server-{port}.log", "w+b")  # noqa: SIM115 - kept open for the process's life
    process = subprocess.Popen([sys.executable, "-m", "rankopt", "serve", str(index), "--port", str(port),
                                "--device", "cpu", *options], stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if process.poll() is not None:
                log.seek(0)
                raise AssertionError(f"rankopt serve exited with {process.returncode}:\n{log.read().decode()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "rankopt serve did not answer /health within 600 s (a busy machine?)"
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
