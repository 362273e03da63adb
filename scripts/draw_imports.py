"""Draw the house: the imports between rankopt's source files, by layer (``docs/imports.svg``).

The layer order is the one of ``docs/ARCHITECTURE.md`` ("Layers only look down"). The drawing marks import
circles and imports that do not look down in red; ``tests/test_architecture.py`` checks the same findings::

    .venv/bin/python scripts/draw_imports.py            # writes docs/imports.svg, prints the findings
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "src" / "rankopt"
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"
DRAWING = REPO / "docs" / "imports.svg"
MAX_LINES = 500
MAX_FUNCTION_LINES = 100
"""No source file is longer."""


def modules(root: Path = SOURCE) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root`` (a package by its ``__init__.py``)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(found: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the rankopt modules it imports (at the top, in functions or for type checking alike)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in found.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in found else base for a in node.names]
            else:
                continue
            for target in targets:
                while target not in found and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in found and target != name:
                    graph[name].add(target)
    return graph


def unit(module: str, found: dict[str, Path]) -> str:
    """The layered unit of a module: its sub-package, ``__main__``, or ``rankopt`` for the top-level modules."""
    parts = module.split(".")
    top = ".".join(parts[:2])
    is_package = top in found and found[top].name == "__init__.py"
    return parts[1] if len(parts) > 1 and (is_package or parts[1] == "__main__") else "rankopt"


def layers(doc: Path = ARCHITECTURE) -> list[list[str]]:
    """The layers of ``doc``'s "Layers only look down" block, bottom first: each line of its first fenced block
    names the units of one layer (words before ``#``), the top layer first."""
    text = doc.read_text(encoding="utf-8")
    section = text[text.index("Layers only look down"):]
    block = re.search(r"```[a-z]*\n(.*?)```", section, re.S)
    if block is None:
        raise ValueError(f"{doc}: no fenced block of layers after 'Layers only look down'")
    rows = [line.split("#")[0].split() for line in block.group(1).splitlines()]
    return [row for row in rows if row][::-1]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def not_down(found: dict[str, Path], graph: dict[str, set[str]], order: list[list[str]]) -> list[tuple[str, str]]:
    """The imports that do not look down: to a higher layer, or to another unit of the same layer."""
    level = {name: i for i, row in enumerate(order) for name in row}
    return sorted((a, b) for a, targets in graph.items() for b in targets if unit(a, found) != unit(b, found)
                  and level.get(unit(b, found), -1) >= level.get(unit(a, found), -1))


def private_imports(found: dict[str, Path], graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports of another unit's private module (``_name``)."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if unit(a, found) != unit(b, found)
                  and b.rsplit(".", 1)[-1].startswith("_") and b != "rankopt.__main__")


def unlayered(found: dict[str, Path], order: list[list[str]]) -> list[str]:
    """Units with no layer in the list."""
    return sorted({unit(m, found) for m in found} - {name for row in order for name in row})


def long_files(found: dict[str, Path], limit: int = MAX_LINES) -> dict[str, int]:
    """Module -> line count, for the files over ``limit`` lines."""
    counts = {name: len(path.read_text(encoding="utf-8").splitlines()) for name, path in found.items()}
    return {name: n for name, n in counts.items() if n > limit}



def long_functions(found: dict[str, Path], limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``module:function`` (``module:Class.method``) -> its lines (signature, docstring and body), for the
    functions over ``limit`` lines."""
    long: dict[str, int] = {}
    for name, path in found.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        stack: list[tuple[ast.AST, str]] = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    qualified = prefix + child.name
                    size = child.end_lineno - child.lineno + 1
                    if not isinstance(child, ast.ClassDef) and size > limit:
                        long[f"{name}:{qualified}"] = size
                    stack.append((child, qualified + "."))
                else:
                    stack.append((child, prefix))
    return long

def draw(found: dict[str, Path], graph: dict[str, set[str]], order: list[list[str]], out: Path = DRAWING) -> None:
    """One band per layer (bottom first), one column block per unit, one dot per file; grey lines for the
    imports, red for those in a circle or not looking down."""
    import matplotlib  # the drawing only: the findings need no matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "rankopt"  # the same file for the same house
    from matplotlib import pyplot as plt

    rows_per_column, height, column, where, bands = 6, 8, 2.4, {}, []
    for y, row in enumerate(order):
        x = 0.0
        for name in row:
            members = sorted(m for m in found if unit(m, found) == name)
            for i, module in enumerate(members):
                where[module] = (x + (i // rows_per_column) * column, y * height + (i % rows_per_column))
            width = column * max(1, -(-len(members) // rows_per_column))
            bands.append((name, x, y * height, width))
            x += width + 0.8
    bad = set(not_down(found, graph, order))
    bad |= {(a, b) for group in circles(graph) for a in group for b in graph[a] if b in group}
    span = max(x0 + w for _, x0, _, w in bands)
    fig, ax = plt.subplots(figsize=(max(12.0, span * 0.5), len(order) * height * 0.22))
    for name, x0, y0, w in bands:
        ax.add_patch(plt.Rectangle((x0 - 0.2, y0 - 0.8), w - 0.2, height - 1, fill=True, color="#eef2f7", zorder=0))
        ax.text(x0, y0 + height - 1.9, name, fontsize=9, weight="bold", va="bottom")
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            if a in where and b in where:
                red = (a, b) in bad
                ax.annotate("", where[b], where[a], zorder=2 if red else 1, arrowprops={
                    "arrowstyle": "->", "color": "#d62728" if red else "#9aa5b1", "alpha": 0.9 if red else 0.25,
                    "lw": 1.2 if red else 0.4})
    for module, (x, y) in where.items():
        ax.plot(x, y, "o", ms=2.5, color="#1f4e79", zorder=3)
        ax.text(x + 0.08, y, module.rsplit(".", 1)[-1], fontsize=4.5, va="center", zorder=3)
    ax.set_title(f"rankopt: imports between files, layers bottom to top ({len(bad)} in red: circles, not down)")
    ax.set_xlim(-1, span + 1)
    ax.set_ylim(-2, len(order) * height)
    ax.axis("off")
    fig.savefig(out, bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)


def main() -> int:
    """Draw ``docs/imports.svg``; print the circles, the imports not looking down or of another unit's private
    module, the units with no layer and the long files."""
    found = modules()
    graph, order = imports(found), layers()
    draw(found, graph, order)
    print(f"wrote {DRAWING.relative_to(REPO)}")
    for group in circles(graph):
        print("circle:", " <-> ".join(group))
    for a, b in not_down(found, graph, order):
        print(f"not down: {a} -> {b}")
    for a, b in private_imports(found, graph):
        print(f"private: {a} -> {b}")
    for name in unlayered(found, order):
        print(f"no layer: {name}")
    for name, n in long_files(found).items():
        print(f"over {MAX_LINES} lines: {name} ({n})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
