"""Every ``examples/*.py`` runs: each script in its own process from the repository root, as its docstring says to run
it, exits 0 and prints its results (the scripts assert what they print). A new example is found by the glob."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.py"))
SLOW = {"finetune_on_a_folder.py"}
"""Examples that train a model with the trainer, end to end (the ``slow`` marker's meaning)."""
NEEDS = {"call_the_service.py": ("fastapi", "uvicorn", "multipart", "httpx")}
"""Examples that need an optional extra (the ``serve`` extra): skipped where it is not installed."""
TIMEOUT_S = 300


def test_the_examples_are_found():
    assert len(EXAMPLES) >= 6, EXAMPLES


@pytest.mark.parametrize("script", [pytest.param(path, id=path.stem, marks=[pytest.mark.slow] if path.name in SLOW
                                                 else []) for path in EXAMPLES])
def test_the_example_runs(script: Path):
    for module in NEEDS.get(script.name, ()):
        pytest.importorskip(module, reason=f"{script.name} needs the serve extra")
    text = script.read_text(encoding="utf-8")
    assert text.startswith('"""') and "python examples/" in text, "a docstring saying what it shows and how to run it"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO_ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, str(script.relative_to(REPO_ROOT))], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=TIMEOUT_S)
    assert run.returncode == 0, f"{script.name} exited with {run.returncode}:\n{run.stdout}\n{run.stderr}"
    assert run.stdout.strip(), f"{script.name} printed nothing:\n{run.stderr}"
