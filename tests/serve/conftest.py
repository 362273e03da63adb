"""Fixtures of the service tests: a tiny index (4 classes x 3 PNGs, an untrained 16-d model), query
images, an in-process client, and the real ``rankopt serve`` process on a free port."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.checkpoints import write_checkpoint
from helpers.images import CLASSES, class_tree, draw
from helpers.servers import running_server

from rankopt.cli import main
from rankopt.search import Index

pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install 'rankopt[serve]'")
pytest.importorskip("httpx", reason="the service tests need httpx (the test extra)")

from fastapi.testclient import TestClient  # noqa: E402 - after the skip

from rankopt.serve import IndexHolder, Settings, create_app  # noqa: E402
from rankopt.serve.settings import HostRule  # noqa: E402


TEST_HOSTS = HostRule(allowed=("testserver",))
"""The test client's ``Host``, answered besides the loopback names."""


@pytest.fixture(scope="session")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with ``idx/`` (the index of ``gallery/``), ``model.ckpt`` and ``queries/``."""
    root = tmp_path_factory.mktemp("served")
    checkpoint = write_checkpoint(root / "model.ckpt")
    gallery = class_tree(root / "gallery")
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


@pytest.fixture(scope="session")
def live_server(served: Path) -> Iterator[str]:
    """``rankopt serve`` started as its own process on a free loopback port; its base URL."""
    with running_server(served / "idx") as url:
        yield url
