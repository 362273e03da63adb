"""The release a user installs holds everything a run reads: the sdist and the wheel built from this
source tree contain every file of the package (the recipes and serve's page included), their metadata
carry the one version (``rankopt.__version__``), the classifiers and the licence, and ``twine check``
passes. docs/release.md describes the release; scripts/release_check.sh installs the wheel into a new
environment and runs it."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import HeaderParser
from pathlib import Path

import pytest

import rankopt
from rankopt.cli import main

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "rankopt"
_CACHES = ("__pycache__", ".pyc", ".pyo", ".nbi", ".nbc")
_TREE = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "CHANGELOG.md")


def package_files() -> list[str]:
    """Every file of the package's source folder (caches left out), as paths inside the package."""
    return sorted(p.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(_CACHES))


def test_version_has_one_source_and_the_cli_prints_it(capsys):
    text = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    project = text.split("\n[project]\n", 1)[1].split("\n[", 1)[0]
    assert 'dynamic = ["version"]' in project
    assert not any(line.startswith("version") for line in project.splitlines())  # no second, static version
    assert 'version = { attr = "rankopt.__version__" }' in text.split("\n[tool.setuptools.dynamic]\n", 1)[1]
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"rankopt {rankopt.__version__}"


def _setuptools_at_least(major: int) -> bool:
    try:
        return int(importlib.metadata.version("setuptools").split(".")[0]) >= major
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.mark.slow
def test_sdist_and_wheel_hold_the_package_and_its_metadata(tmp_path: Path):
    if importlib.util.find_spec("build") is None:
        pytest.skip("the 'build' package is not installed (pip install '.[test]')")
    # A copy of what the build reads, so that no build/ or egg-info is written into the work tree.
    src = tmp_path / "src_tree"
    src.mkdir()
    for name in _TREE:
        shutil.copy2(REPO / name, src / name)
    caches = shutil.ignore_patterns("__pycache__", *(f"*{suffix}" for suffix in _CACHES[1:]))
    shutil.copytree(PACKAGE, src / "src" / "rankopt", ignore=caches)
    dist = tmp_path / "dist"
    # Without isolation where this environment can build (no index needed); else build installs setuptools.
    isolation = ["--no-isolation"] if _setuptools_at_least(77) else []
    done = subprocess.run([sys.executable, "-m", "build", *isolation, "--outdir", str(dist), str(src)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    version = rankopt.__version__
    wheel = dist / f"rankopt-{version}-py3-none-any.whl"
    sdist = dist / f"rankopt-{version}.tar.gz"
    assert sorted(p.name for p in dist.iterdir()) == sorted([wheel.name, sdist.name])

    files = package_files()
    recipes = [f for f in files if f.startswith("rankopt/recipes/") and f.endswith(".yaml")]
    static = [f for f in files if f.startswith("rankopt/serve/static/")]
    assert "rankopt/recipes/default.yaml" in recipes and "rankopt/serve/static/index.html" in static
    assert "rankopt/py.typed" in files

    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
        info = f"rankopt-{version}.dist-info"
        metadata = HeaderParser().parsestr(whl.read(f"{info}/METADATA").decode("utf-8"))
        entry_points = whl.read(f"{info}/entry_points.txt").decode("utf-8")
    assert [f for f in recipes + static if f not in names] == []
    assert [f for f in files if f not in names] == []  # every module and data file of src/rankopt
    assert f"{info}/licenses/LICENSE" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(_CACHES[1:])]

    assert metadata["Name"] == "rankopt"
    assert metadata["Version"] == version
    assert metadata["License-Expression"] == "MIT"
    assert metadata.get_all("License-File") == ["LICENSE"]
    assert metadata["Description-Content-Type"] == "text/markdown"
    classifiers = set(metadata.get_all("Classifier"))
    for wanted in ("Programming Language :: Python :: 3.10", "Programming Language :: Python :: 3.11",
                   "Programming Language :: Python :: 3.12", "Operating System :: OS Independent",
                   "Topic :: Scientific/Engineering :: Artificial Intelligence",
                   "Topic :: Scientific/Engineering :: Image Recognition"):
        assert wanted in classifiers
    urls = {u.split(",", 1)[0] for u in metadata.get_all("Project-URL")}
    assert {"Homepage", "Documentation", "Source", "Changelog", "Issues"} <= urls
    assert "rankopt = rankopt.cli:console_main" in entry_points

    with tarfile.open(sdist) as tar:
        members = set(tar.getnames())
    top = f"rankopt-{version}"
    assert [f for f in files if f"{top}/src/{f}" not in members] == []
    assert [n for n in _TREE if f"{top}/{n}" not in members] == []

    if importlib.util.find_spec("twine") is not None:
        checked = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)],
                                 capture_output=True, text=True, timeout=120, check=False)
        assert checked.returncode == 0, checked.stdout + checked.stderr
