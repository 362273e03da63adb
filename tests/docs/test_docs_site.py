"""The documentation site builds, strictly, and shows what is generated from the code: ``mkdocs build --strict``
(any broken link, unresolved reference or warning fails) into a temporary folder, then a few key pages are read
back. Skipped where the docs extra (mkdocs-material, mkdocstrings) is not installed."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("material")
pytest.importorskip("mkdocstrings")
pytest.importorskip("mkdocstrings_handlers.python")
pytest.importorskip("mathjax", reason="django-static-mathjax (the site's MathJax) is not installed")

REPO = Path(__file__).resolve().parents[2]
HOOKS = REPO / "docs" / "_hooks"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(REPO / "mkdocs.yml"), "--site-dir", str(out)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert time.monotonic() - start < 300, "the docs build should take well under a minute"
    return out


def page(site: Path, path: str) -> str:
    file = site / path / "index.html" if path else site / "index.html"
    assert file.is_file(), f"{path or 'index'}: no page"
    return file.read_text(encoding="utf-8")


def text(html: str) -> str:
    """The page's text, tags dropped and entities of the help texts decoded."""
    plain = re.sub(r"<[^>]+>", "", html)
    return plain.replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&#39;", "'").replace(
        "&amp;", "&")


def test_cli_page_holds_every_subcommands_help(site):
    from rankopt.cli import SUBCOMMAND_MODULES, build_parser

    cli = text(page(site, "cli"))
    assert "usage: rankopt fit" in cli and "--minutes" in cli  # the fit sub-command's own help
    parser = build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert len(action.choices) >= len(SUBCOMMAND_MODULES)
    for name in action.choices:
        assert f"usage: rankopt {name}" in cli, name


def test_datasets_page_is_the_listing_of_the_command(site):
    from rankopt.cli.datasets import dataset_rows

    datasets = text(page(site, "datasets"))
    assert "caltech101" in datasets and "Ebay_train.txt" in datasets
    for row in dataset_rows():
        assert row["name"] in datasets


def test_every_registered_loss_has_a_page_with_its_reference(site):
    from rankopt.losses import LOSSES

    for name in LOSSES.names():
        html = page(site, f"losses/{name}")
        assert "Arguments" in html and "Use it" in html, name
    sup_ap = page(site, "losses/sup_ap")
    assert "SupAPLoss" in sup_ap and 'class="arithmatex"' in sup_ap  # mkdocstrings block and the formula
    assert "Eq. 11" in sup_ap
    index = text(page(site, "losses"))
    assert all(name in index for name in LOSSES.names())


def test_recipes_examples_api_and_benchmark_tables_are_generated(site):
    from rankopt.config import list_recipes

    recipes = text(page(site, "recipes"))
    assert all(name in recipes for name in list_recipes())
    examples = page(site, "examples")
    for example in sorted((REPO / "examples").glob("*.py")):
        assert example.name in examples
    assert "class=\"doc doc-object" in page(site, "api/losses")  # rendered by mkdocstrings
    for table in sorted((REPO / "benchmarks" / "results").glob("*.md")):
        assert (site / "benchmarks" / "results" / table.stem / "index.html").is_file(), table.name
    assert (site / "assets" / "mathjax" / "tex-chtml.js").is_file()  # served locally, no CDN
    assert "cdn" not in page(site, "concepts").lower()


def test_getting_started_has_the_readme_commands_verbatim(site):
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    started = (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")
    commands = ["bash scripts/bootstrap.sh && .venv/bin/rankopt train",
                "bash scripts/bootstrap.sh test && .venv/bin/python -m pytest -q"]
    for command in commands:
        assert f"```bash\n{command}\n```" in readme
        assert f"```bash\n{command}\n```" in started
    html = text(page(site, "getting-started"))
    assert all(command in html for command in commands) and "rankopt fit photos --out run" in html


# ------------------------------------------------------------------ the hook's pieces, without a build

def test_links_to_repository_files_point_at_the_site_copies():
    hooks = _load("rankopt_docs_site_hook", HOOKS / "site.py")
    hooks._state["mirrors"] = {"benchmarks/results/fit.md": "benchmarks/results/fit.md",
                               "benchmarks/results/a.png": "benchmarks/results/a.png",
                               "CHANGELOG.md": "repo/CHANGELOG.md", "examples/x.py": "examples.md#example-x"}
    rewrite = hooks.rewrite_links
    assert rewrite("[t](../benchmarks/results/fit.md#rows)", "fit.md", "docs/fit.md") == \
        "[t](benchmarks/results/fit.md#rows)"
    assert rewrite("![f](../../docs/benchmarks/studies/rho.png)", "benchmarks/results/study_rho.md",
                   "benchmarks/results/study_rho.md") == "![f](../studies/rho.png)"
    assert rewrite("[c](../../CHANGELOG.md)", "guide/x.md", "docs/guide/x.md") == "[c](../repo/CHANGELOG.md)"
    assert rewrite("[e](../examples/x.py)", "index.md", "docs/index.md") == "[e](examples.md#example-x)"
    kept = "[s](https://x.org/a.md) [a](#part) [d](concepts.md)\n```\n[n](../CHANGELOG.md)\n```"
    assert rewrite(kept, "index.md", "docs/index.md") == kept


def test_docstring_roles_become_code_spans():
    pytest.importorskip("griffe")
    roles = _load("rankopt_docs_griffe_roles", HOOKS / "griffe_roles.py")
    assert roles.as_markdown("see :func:`~rankopt.rank.sup_step` and :class:`rankopt.search.Index`") == \
        "see `sup_step` and `rankopt.search.Index`"
    assert roles.as_markdown("Sup-AP (Eq. 5)::\n\n    L = 1 - AP") == "Sup-AP (Eq. 5):\n\n    L = 1 - AP"
