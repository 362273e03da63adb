"""The README's section for one's own photos, run as written: its commands are read from README.md (so the two
cannot drift) and run on a small generated photo folder (SYNTHETIC coloured squares) in a fresh folder, the
weights fetched for real by name into a fresh cache (skipped cleanly when the package index does not answer)."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from helpers.servers import free_port

from helpers.images import FIT_CLASSES as CLASSES
from helpers.images import FIT_PER_CLASS as PER_CLASS
from helpers.images import photo_folder
from rankopt.fit.backbones import CANDIDATES

README = Path(__file__).resolve().parents[2] / "README.md"
MARKER = "<!-- own-photos"


def readme_commands() -> list[str]:
    """The commands of the fenced block after the ``own-photos`` marker, comments dropped."""
    text = README.read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text[text.index(MARKER):], re.S)
    assert block is not None, "README.md: no bash block after the own-photos marker"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.split("#", 1)[0].strip()]


def as_process(command: str) -> list[str]:
    words = shlex.split(command)
    assert words[0] == "rankopt", f"README command {command!r} is not a rankopt command"
    return [sys.executable, "-m", "rankopt", *words[1:]]


def test_the_readme_leads_with_fit_then_serve():
    commands = readme_commands()
    assert [shlex.split(c)[1] for c in commands] == ["fit", "serve"]


@pytest.mark.network
def test_the_readme_commands_run_as_written(tmp_path):
    env = {**os.environ, "RANKOPT_CACHE": str(tmp_path / "cache"), "PYTHONUNBUFFERED": "1"}
    for name in CANDIDATES:  # fit's default, auto, may load each
        fetch = subprocess.run([sys.executable, "-m", "rankopt", "weights", "fetch", name], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=300)
        if fetch.returncode != 0:
            pytest.skip(f"the package index did not answer: {fetch.stderr.strip()[-300:]}")
    photo_folder(tmp_path / "photos")
    fit_command, serve_command = readme_commands()
    done = subprocess.run(as_process(fit_command), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "finished in" in done.stdout and (tmp_path / "run" / "report.html").is_file()
    port = free_port()
    server = subprocess.Popen([*as_process(serve_command), "--port", str(port)], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while server.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.3)
        assert server.poll() is None, "rankopt serve exited"
        assert httpx.get(f"{url}/health", timeout=10).json()["items"] == CLASSES * PER_CLASS
        photo = tmp_path / "photos" / "class1" / "p3.jpg"
        answer = httpx.post(f"{url}/search", params={"k": 3}, files={"image": (photo.name, photo.read_bytes())},
                            timeout=60)
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["results"]) == 3
    finally:
        server.terminate()
        server.wait(timeout=30)
