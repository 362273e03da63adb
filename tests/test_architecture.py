"""The house's shape: no import circle, every import looks down (docs/ARCHITECTURE.md), no other package's private
module, no file over 500 lines, no function over 100; the commands start without the packages only some of them
need."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "draw_imports.py"
_spec = importlib.util.spec_from_file_location("draw_imports", _SCRIPT)
assert _spec is not None and _spec.loader is not None
draw_imports = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(draw_imports)


@pytest.fixture(scope="module")
def house() -> tuple[dict[str, Path], dict[str, set[str]], list[list[str]]]:
    found = draw_imports.modules()
    return found, draw_imports.imports(found), draw_imports.layers()


def test_the_finder_sees_circles_and_imports_up(tmp_path: Path):
    package = tmp_path / "rankopt"
    for folder, text in (("low", "from rankopt.high import b\n"), ("high", "from rankopt.low import _k, a\n")):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
        (package / folder / ("a.py" if folder == "low" else "b.py")).write_text(text)
    (package / "low" / "_k.py").write_text("")
    found = draw_imports.modules(package)
    graph = draw_imports.imports(found)
    assert draw_imports.circles(graph) == [["rankopt.high.b", "rankopt.low.a"]]
    assert draw_imports.not_down(found, graph, [["low"], ["high"]]) == [("rankopt.low.a", "rankopt.high.b")]
    assert draw_imports.unlayered(found, [["low"]]) == ["high"]
    assert draw_imports.private_imports(found, graph) == [("rankopt.high.b", "rankopt.low._k")]


def test_the_finder_measures_functions_and_methods(tmp_path: Path):
    package = tmp_path / "rankopt"
    package.mkdir()
    (package / "a.py").write_text("class C:\n"
                                  "    def long(self):\n        x = 1\n        y = 2\n        return x + y\n"
                                  "    def short(self):\n        return 1\n"
                                  "def nested():\n    def inner():\n        a = 1\n        b = 2\n        return a + b\n"
                                  "    return inner\n")
    found = draw_imports.modules(package)
    assert draw_imports.long_functions(found, limit=3) == {"rankopt.a:C.long": 4, "rankopt.a:nested": 6,
                                                          "rankopt.a:nested.inner": 4}


def test_every_unit_has_a_layer(house):
    found, _, order = house
    assert draw_imports.unlayered(found, order) == []


def test_no_import_circle(house):
    _, graph, _ = house
    assert draw_imports.circles(graph) == []


def test_imports_only_look_down(house):
    found, graph, order = house
    assert draw_imports.not_down(found, graph, order) == []


def test_no_private_module_of_another_package(house):
    found, graph, _ = house
    assert draw_imports.private_imports(found, graph) == []


def test_no_source_file_over_500_lines(house):
    found, _, _ = house
    assert draw_imports.long_files(found) == {}


def test_no_function_over_100_lines(house):
    found, _, _ = house
    assert draw_imports.long_functions(found) == {}


HEAVY_FOR_THE_COMMANDS = ("sklearn", "pytorch_metric_learning", "scipy.stats", "matplotlib")
"""Packages that take seconds to import on a busy 2-core machine and that ``fit`` needs only to draw its report,
``index`` and ``serve`` never: loaded where they are used, so a command's start is not spent on them."""


def test_the_commands_start_without_the_heavy_packages():
    modules = ["rankopt.cli", "rankopt.cli.fit", "rankopt.fit.run", "rankopt.cli.index", "rankopt.search.index",
               "rankopt.losses"]
    code = (f"import importlib, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY_FOR_THE_COMMANDS!r} "
            f"or m.startswith('scipy.stats')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]", f"imported at start: {loaded.strip()[:500]}"
