"""Fixtures of the service tests: a tiny index (4 classes x 3 PNGs, an untrained 16-d model), query
images, an in-process client, and the real ``rankopt serve`` process on a free port."""

from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from search.conftest import CLASSES, draw, make_tree, write_checkpoint

from rankopt.cli import main
from rankopt.search import Index

pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install 'rankopt[serve]'")
pytest.importorskip("httpx", reason="the service tests need httpx (the test extra)")

from fastapi.testclient import TestClient  # noqa: E402 - after the skip

from rankopt.serve import IndexHolder, Settings, create_app  # noqa: E402
from rankopt.serve.guard import HostRule  # noqa: E402


TEST_HOSTS = HostRule(allowed=("testserver",))
"""The test client's ``Host``, answered besides the loopback names."""


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with ``idx/`` (the index of ``gallery/``), ``model.ckpt`` and ``queries/``."""
    root = tmp_path_factory.mktemp("served")
    checkpoint = write_checkpoint(root / "model.ckpt")
    gallery = make_tree(root / "gallery")
    rows = [f"{p.relative_to(root).as_posix()},{'north' if i % 2 else 'south'},{10 * i}"
            for i, p in enumerate(sorted(gallery.rglob("*.png")))]
    (root / "shops.csv").write_text("path,shop,price\n" + "\n".join(rows) + "\n")
    assert main(["index", str(checkpoint), "--images", str(gallery), "--out", str(root / "idx"),
                 "--metadata", str(root / "shops.csv"), "--device", "cpu", "--no-progress"]) == 0
    index = Index.load(root / "idx")
    index.set_threshold({"value": 0.5, "fmr": 0.01})  # results then say whether they match
    index.save(root / "idx")
    draw(root / "queries" / "alpha" / "one" / "q.png", CLASSES["alpha/one"], 99)
    draw(root / "queries" / "beta" / "four" / "q.jpg", CLASSES["beta/four"], 98, size=200)
    draw(root / "queries" / "elsewhere" / "q.png", (128, 128, 128), 97)
    return root


@pytest.fixture
def index_dir(served: Path, tmp_path: Path) -> Path:
    """A copy of the served index that a test may change."""
    import shutil

    return Path(shutil.copytree(served / "idx", tmp_path / "idx"))


@pytest.fixture
def query_files(served: Path) -> list[Path]:
    return sorted((served / "queries").rglob("q.*"))


@pytest.fixture
def make_client(index_dir: Path) -> Iterator[Callable[..., TestClient]]:
    """``make_client(**settings)``: a test client of the service of ``index_dir`` (lifespan running)."""
    with contextlib.ExitStack() as stack:
        def make(**settings) -> TestClient:
            settings.setdefault("reload_every_s", 0)
            settings.setdefault("hosts", TEST_HOSTS)
            app = create_app(IndexHolder(index_dir, device="cpu"), Settings(**settings))
            return stack.enter_context(TestClient(app))

        yield make


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


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


@pytest.fixture(scope="session")
def live_server(served: Path) -> Iterator[str]:
    """``rankopt serve`` started as its own process on a free loopback port; its base URL."""
    with running_server(served / "idx") as url:
        yield url


def image_bytes(colour: tuple[int, int, int], fmt: str = "PNG", size: int = 40) -> bytes:
    """A small image of one ``colour`` in format ``fmt``."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(buffer, format=fmt)
    return buffer.getvalue()
