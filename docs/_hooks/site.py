"""MkDocs hook of the rankopt site (``hooks:`` in mkdocs.yml): what can be read from the code is generated at build
time, with the same functions the command line uses, so the site cannot drift from the code.

* ``<!-- generated: NAME -->`` in a page is replaced by :data:`GENERATORS` ``[NAME]()`` (the CLI's ``--help`` of
  every sub-command, ``rankopt datasets --markdown``, the shipped recipes, the metric names, the loss table, the
  examples, the benchmark tables, the API pages);
* one page per registered loss (``losses/NAME.md``): the hand-written header of ``loss_notes.yaml`` beside this
  file, then what the registry and the code say (arguments, data arguments, the class's docstring through
  mkdocstrings);
* one page per public package (``api/NAME.md``, a mkdocstrings block);
* the committed benchmark tables ``benchmarks/results/*.md`` (and their figures) as pages of their own;
* MathJax 3 served from the site itself (from the ``django-static-mathjax`` wheel: no CDN, the site reads offline);
* links from a page to a repository file the site also holds (``../benchmarks/results/fit.md``, ``../examples/x.py``,
  ``../../docs/benchmarks/studies/x.png`` from a benchmark table) are pointed at the site's copy, so the pages keep
  repository-relative links that work on GitHub too; any other repository file a page links to (``../CHANGELOG.md``,
  ``../scripts/x.sh``) is copied into the site under ``repo/`` (Markdown rendered as a page), and a link to a file
  that does not exist is left for MkDocs to report (``--strict`` fails on it).

Every new loss, dataset, recipe, sub-command, example or benchmark table appears on the next build.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
import logging
import os
import posixpath
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from mkdocs.structure.files import File, Files, InclusionLevel

log = logging.getLogger("mkdocs.hooks.rankopt")

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
NOTES = Path(__file__).with_name("loss_notes.yaml")
MARKER = re.compile(r"^<!--\s*generated:\s*([\w-]+)\s*-->\s*$", re.MULTILINE)
HELP_COLUMNS = "100"

API_PACKAGES: dict[str, str] = {
    "losses": "rank losses, their combinations and sums, the baselines; `build(name)`",
    "rank": "relevance, the step function and its surrogates, SupRank ranks",
    "metrics": "`evaluate()`, metric names, the decomposability gap, verification",
    "data": "dataset loaders (`DATASETS`), your own folders and CSVs, samplers, transforms",
    "models": "backbones (`BACKBONES`), pooling, `RetrievalNet`, stages, `create_model`",
    "engine": "the trainer, checkpoints, optimizers, memory (XBM), multistage backprop, distributed, pretrained weights",
    "postprocess": "whitening, αQE, DBA, multi-scale",
    "search": "`Index`: build, search, edit, save, load",
    "export": "ONNX export with its parity check",
    "report": "run folders, `report.html`, comparisons over seeds",
    "experiments": "the resumable grid runner, the Omniglot benchmark, the papers' studies",
    "client": "`SearchClient`: the HTTP API of `rankopt serve`, from Python",
}
"""The public packages (and modules) with an API page, in the order of the navigation; one not in this checkout
(``src/rankopt/NAME``) gets no page."""

ENGINE_MODULES = ("assembly", "trainer", "checkpoint", "inference", "embed_and_score", "run_writer", "optim",
                  "memory", "multistage", "distributed", "trackers", "weights")
"""``rankopt.engine`` imports nothing itself: its page documents these submodules."""

_state: dict[str, Any] = {"mirrors": {}, "sources": {}}


# ----------------------------------------------------------------------------------------------- small helpers

@contextlib.contextmanager
def _columns(width: str) -> Iterator[None]:
    """argparse wraps help to the terminal's width: fix it, so the page does not depend on who builds it."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = width
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _fence(text: str, lang: str = "text") -> str:
    ticks = "````" if "```" in text else "```"
    return f"{ticks}{lang}\n{text.rstrip()}\n{ticks}\n"


def _first_paragraph(doc: str | None) -> str:
    return " ".join(inspect.cleandoc(doc or "").split("\n\n", 1)[0].split())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _loss_notes() -> dict[str, dict[str, str]]:
    return yaml.safe_load(NOTES.read_text(encoding="utf-8")) or {}


def _example_files() -> list[Path]:
    return sorted((REPO / "examples").glob("*.py"))


def _result_files() -> list[Path]:
    return sorted((REPO / "benchmarks" / "results").glob("*.md"))


def _title(markdown: str, fallback: str) -> str:
    match = re.search(r"^#\s+(.+?)\s*$", markdown, re.MULTILINE)
    return match.group(1) if match else fallback


# ----------------------------------------------------------------------------------------------- generators

def cli_reference() -> str:
    """``rankopt --help`` and every sub-command's ``--help``, from the parser ``rankopt`` itself builds."""
    import argparse

    from rankopt.cli import build_parser

    with _columns(HELP_COLUMNS):
        parser = build_parser()
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        summaries = {a.dest: a.help or "" for a in action._choices_actions}
        out = ["## `rankopt`", "", _fence(parser.format_help())]
        out += ["| command | what it does |", "|---|---|"]
        out += [f"| [`{name}`](#rankopt-{name}) | {_cell(summaries.get(name, ''))} |" for name in action.choices]
        out.append("")
        for name, sub in action.choices.items():
            out += [f"## `rankopt {name}` {{ #rankopt-{name} }}", "", summaries.get(name, ""), "",
                    _fence(sub.format_help())]
    return "\n".join(out)


def datasets_table() -> str:
    """``rankopt datasets --markdown``: the same two functions as the command."""
    from rankopt.cli.datasets import dataset_rows, markdown_table

    return markdown_table(dataset_rows())


def recipes_list() -> str:
    """The shipped recipes (``rankopt train --list-recipes``), each with its YAML."""
    from rankopt.config import RECIPE_DIR, list_recipes, load_recipe

    rows, sections = ["| recipe | description |", "|---|---|"], []
    for name in list_recipes():
        description = load_recipe(name).description
        rows.append(f"| [`{name}`](#recipe-{name}) | {_cell(description)} |")
        text = (Path(RECIPE_DIR) / f"{name}.yaml").read_text(encoding="utf-8")
        sections += [f"### `{name}` {{ #recipe-{name} }}", "", description, "",
                     f'??? note "src/rankopt/recipes/{name}.yaml"', "",
                     "    " + _fence(text, "yaml").replace("\n", "\n    ").rstrip(), ""]
    return "\n".join([*rows, "", *sections])


_METRIC_NOTES = {
    "recall": ("`recall@K`", "hit rate: a positive among the top K (R@K)"),
    "precision": ("`precision@K`", "the fraction of positives among the top K (P@K)"),
    "true_recall": ("`true_recall@K`", "positives in the top K over min(K, R) (TPAMI Eq. 14, TR@K)"),
    "map@r": ("`map@r`", "mAP@R: precision at each positive within the top R, divided by R"),
    "map@k": ("`map@K`", "mAP@K (GLDv2): divided by min(R, K)"),
    "map": ("`map`", "mean average precision over the whole ranking"),
    "mrr": ("`mrr`", "mean reciprocal rank of the first positive"),
    "h-ap": ("`h-ap`", "hierarchical AP (TPAMI Eq. 19, relevance of Eq. 20)"),
    "sum_wap": ("`sum_wap`", "ΣwAP, the weighted sum of the per-level APs (TPAMI Property 1)"),
    "asi": ("`asi`", "average set intersection of the top-k with the ideal ranking, over k"),
    "ndcg": ("`ndcg`", "normalised DCG with the level gains (TPAMI Eq. 23)"),
    "ap@level": ("`ap@levelC`", "AP with relevance = sharing label column C"),
}


def metrics_table() -> str:
    """The metric families of the ``METRICS`` registry and their kinds."""
    from rankopt.metrics import ALL_METRICS, DEFAULT_HIERARCHICAL_METRICS, DEFAULT_METRICS, METRICS

    out = ["| name | kind | meaning |", "|---|---|---|"]
    for family in METRICS.names():
        spec = METRICS.build(family, name=family)
        name, meaning = _METRIC_NOTES.get(family, (f"`{family}`", ""))
        out.append(f"| {name} | {spec.kind} | {meaning} |")
    out += ["", "Verification metrics: `tar@far=F` (TAR at a false-accept rate F, from a dataset's template pairs).",
            "", f"Default metrics: `{'`, `'.join(DEFAULT_METRICS)}`; with hierarchical labels "
            f"`{'`, `'.join(DEFAULT_HIERARCHICAL_METRICS)}`. `all`: `{'`, `'.join(ALL_METRICS)}`.", ""]
    return "\n".join(out)


def losses_table() -> str:
    """Every registered loss: its page, what it is, its paper, where its data arguments come from."""
    from rankopt.losses import LOSSES, data_arguments

    notes = _loss_notes()
    out = ["| loss | what it is | paper | data arguments |", "|---|---|---|---|"]
    for name in LOSSES.names():
        note = notes.get(name, {})
        summary = note.get("title") or _first_paragraph(LOSSES.get(name).__doc__)
        data = ", ".join(f"`{k}`" for k in data_arguments(name)) or "–"
        out.append(f"| [`{name}`]({name}.md) | {_cell(summary)} | {_cell(note.get('paper', ''))} | {data} |")
    return "\n".join(out) + "\n"


def examples_page() -> str:
    """Each ``examples/*.py``: its docstring's first paragraph and its source (pymdownx.snippets)."""
    files = _example_files()
    if not files:
        return "*No example scripts yet: each `examples/*.py` file appears here on the next build.*\n"
    out = ["| example | what it shows |", "|---|---|"]
    out += [f"| [`{f.name}`](#example-{f.stem}) | {_cell(_first_paragraph(_module_doc(f)))} |" for f in files]
    out.append("")
    for f in files:
        doc = inspect.cleandoc(_module_doc(f) or "")
        run = "" if f"examples/{f.name}" in doc else f"Run it from the repository root: `python examples/{f.name}`."
        out += [f"## `{f.name}` {{ #example-{f.stem} }}", "", doc, "", run, "",
                f'````python title="examples/{f.name}"', f'--8<-- "examples/{f.name}"', "````", ""]
    return "\n".join(out)


def _module_doc(path: Path) -> str | None:
    try:
        return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    except SyntaxError:
        return None


def results_list() -> str:
    """The committed benchmark tables, each a page."""
    out = ["| table | title |", "|---|---|"]
    for f in _result_files():
        title = _title(f.read_text(encoding="utf-8"), f.stem)
        out.append(f"| [`{f.name}`]({f.name}) | {_cell(title)} |")
    return "\n".join(out) + "\n"


def api_list() -> str:
    out = ["| package | holds |", "|---|---|"]
    out += [f"| [`rankopt.{name}`]({name}.md) | {what} |" for name, what in _api_packages().items()]
    return "\n".join(out) + "\n"


def _api_packages() -> dict[str, str]:
    return {name: what for name, what in API_PACKAGES.items()
            if (SRC / "rankopt" / name).is_dir() or (SRC / "rankopt" / f"{name}.py").is_file()}


GENERATORS: dict[str, Callable[[], str]] = {
    "cli": cli_reference,
    "datasets": datasets_table,
    "recipes": recipes_list,
    "metrics": metrics_table,
    "losses": losses_table,
    "examples": examples_page,
    "results": results_list,
    "api": api_list,
}


# ----------------------------------------------------------------------------------------------- loss pages

def _signature_rows(factory: Callable[..., Any]) -> list[tuple[str, str, str]]:
    """(argument, default, where it is declared) of a loss class (its ``__init__`` and the bases' reached through
    ``**kwargs``) or factory function."""
    rows: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    chain = [c for c in factory.__mro__ if "__init__" in vars(c)] if inspect.isclass(factory) else [factory]
    for owner in chain:
        function = owner.__init__ if inspect.isclass(owner) else owner
        if function is object.__init__:
            break
        try:
            parameters = list(inspect.signature(function).parameters.values())
        except (TypeError, ValueError):
            break
        for p in parameters:
            if p.name == "self" or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) or p.name in seen:
                continue
            seen.add(p.name)
            default = "required" if p.default is p.empty else f"`{p.default!r}`"
            rows.append((p.name, default, owner.__qualname__))
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            break
    return rows


def _object_path(factory: Callable[..., Any]) -> str | None:
    """The dotted path mkdocstrings can document (``None`` for a factory made inside a function)."""
    if "<locals>" in factory.__qualname__:
        return None
    return f"{factory.__module__}.{factory.__qualname__}"


def loss_page(name: str, note: dict[str, str]) -> str:
    from rankopt.losses import LOSSES, data_arguments
    from rankopt.losses.combination import COMBINATIONS

    factory = LOSSES.get(name)
    title = note.get("title") or _first_paragraph(factory.__doc__)
    out = [f"# `{name}` — {title} {{ #loss-{name} }}", ""]
    if not note:
        log.info("rankopt docs: loss %r has no notes in %s", name, NOTES.name)
        out += ["*No hand-written notes for this loss yet: what follows is read from the code.*", ""]
    for key, heading in (("summary", None), ("formula", "Formula"), ("paper", "Paper"), ("cost", "Cost"),
                         ("use", "When to use it")):
        if note.get(key):
            if heading:
                out += [f"## {heading}", ""]
            out += [note[key].rstrip(), ""]
    data = data_arguments(name)
    out += ["## Arguments", ""]
    combination = COMBINATIONS.get(name)
    if combination is not None:
        out += [f"A ROD combination: $(1 - \\lambda)\\,$`{combination.rank}` $+\\ \\lambda\\,$"
                f"`{combination.decomposability}`, default $\\lambda = {combination.lam}$ (`lam`). "
                f"Each term takes its own arguments, as a map keyed by the term's name "
                f"(`loss.kwargs.{combination.rank}.tau=0.01`, `build(\"{name}\", {combination.rank}={{...}})`); "
                f"the flat keys `{'`, `'.join(combination.decomposability_keys)}` go to "
                f"[`{combination.decomposability}`]({combination.decomposability}.md), every other flat key to "
                f"[`{combination.rank}`]({combination.rank}.md).", ""]
    else:
        rows = _signature_rows(factory)
        if rows and data:
            out += ["| argument | default | from the data | declared by |", "|---|---|---|---|"]
            out += [f"| `{arg}` | {default if arg not in data else '–'} | "
                    f"{f'`{data[arg]}`' if arg in data else ''} | `{owner}` |" for arg, default, owner in rows]
            out.append("")
        elif rows:
            out += ["| argument | default | declared by |", "|---|---|---|"]
            out += [f"| `{arg}` | {default} | `{owner}` |" for arg, default, owner in rows]
            out.append("")
    if data:
        sources = ", ".join(f"`{arg}` ← {source}" for arg, source in data.items())
        out += [f"Data arguments, filled in by the training engine from the data and the model: {sources}.", ""]
    example = f'build("{name}")' if not data else f'build("{name}", ' + ", ".join(
        f"{arg}={'100' if source == 'classes' else '[100, 10]' if source == 'classes_per_level' else '512'}"
        for arg, source in data.items()) + ")"
    out += ["## Use it", "", "```python", "from rankopt.losses import build", "",
            f"loss_fn = {example}", "loss = loss_fn(embeddings, labels)  # + ref_embeddings, ref_labels: a memory",
            "```", "",
            f"In a run: `rankopt train default loss.name={name}`.", "", "## Reference", ""]
    path = _object_path(factory)
    if path is not None:
        out += [f"::: {path}", "    options:", "      heading_level: 3", "      show_root_full_path: true", ""]
    else:
        out += [_first_paragraph(factory.__doc__), "", "::: rankopt.losses.combination.ROD", "    options:",
                "      heading_level: 3", ""]
    return "\n".join(out)


def api_page(name: str, what: str) -> str:
    out = [f"# `rankopt.{name}`", "", what[0].upper() + what[1:] + ".", ""]
    if name == "engine":
        out += ["::: rankopt.engine", "    options:", "      show_root_heading: false", "      members: false", ""]
        for module in ENGINE_MODULES:
            out += [f"::: rankopt.engine.{module}", ""]
    else:
        out += [f"::: rankopt.{name}", "    options:", "      show_root_heading: false", ""]
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------- links

_LINK = re.compile(r"(!?\[[^\]\n]*\]\()(<[^>\n]+>|[^)\s]+)((?:\s+\"[^\"]*\")?\))")
_FENCE = re.compile(r"^(```|~~~)")
_EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//|#)")


def _site_path(repo_path: str) -> str | None:
    """The site path (``src_uri``) holding repository file ``repo_path``, if the site has one."""
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/"):]
    return _state["mirrors"].get(repo_path)


def rewrite_links(markdown: str, page_src: str, repo_src: str) -> str:
    """Point each relative link of the page at ``page_src`` (whose repository file is ``repo_src``) that names a
    repository file held elsewhere on the site at that copy. Fenced code is left alone."""
    repo_dir, page_dir = posixpath.dirname(repo_src), posixpath.dirname(page_src)

    def fix(match: re.Match[str]) -> str:
        target = match.group(2).strip("<>")
        if _EXTERNAL.match(target):
            return match.group(0)
        path, sep, anchor = target.partition("#")
        if not path:
            return match.group(0)
        repo_path = posixpath.normpath(posixpath.join(repo_dir, path))
        site = _site_path(repo_path)
        if site is None:
            return match.group(0)
        site, _, site_anchor = site.partition("#")
        new = posixpath.relpath(site, page_dir or ".")
        anchor = anchor or site_anchor
        return f"{match.group(1)}{new}{'#' + anchor if anchor else ''}{match.group(3)}"

    out, fenced = [], False
    for line in markdown.split("\n"):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        out.append(line if fenced else _LINK.sub(fix, line))
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------- mkdocs events

def _nav_section(nav: list[Any], title: str) -> list[Any] | None:
    for item in nav:
        if isinstance(item, dict) and title in item and isinstance(item[title], list):
            return item[title]
        if isinstance(item, dict):
            for value in item.values():
                if isinstance(value, list):
                    found = _nav_section(value, title)
                    if found is not None:
                        return found
    return None


def on_config(config: Any, **kwargs: Any) -> Any:
    if str(SRC) not in sys.path:
        sys.path.insert(0, str(SRC))  # the rankopt of this checkout, installed or not
    snippets = config.mdx_configs.setdefault("pymdownx.snippets", {})
    snippets["base_path"] = [str(REPO)]  # snippets are repository paths, wherever mkdocs is started from
    from rankopt.losses import LOSSES

    nav = config.nav or []
    losses = _nav_section(nav, "Losses")
    if losses is not None:
        losses += [{f"{name}": f"losses/{name}.md"} for name in LOSSES.names()]
    api = _nav_section(nav, "Python API")
    if api is not None:
        api += [{f"rankopt.{name}": f"api/{name}.md"} for name in _api_packages()]
    tables = _nav_section(nav, "Result tables")
    if tables is not None:
        tables += [{_title(f.read_text(encoding="utf-8"), f.stem): f"benchmarks/results/{f.name}"}
                   for f in _result_files()]
    return config


def _mathjax_dir() -> Path:
    spec = importlib.util.find_spec("mathjax")
    roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    for root in roots:
        es5 = root / "static" / "mathjax" / "es5"
        if (es5 / "tex-chtml.js").is_file():
            return es5
    raise RuntimeError("MathJax not found: install the docs extra (pip install -e '.[docs]', which brings "
                       "django-static-mathjax)")


def _link_targets(markdown: str) -> list[str]:
    """The link and image targets of ``markdown`` outside fenced code."""
    found, fenced = [], False
    for line in markdown.split("\n"):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            found += [m.group(2).strip("<>") for m in _LINK.finditer(line)]
    return found


def _repository_mirrors(pages: list[str], mirrors: dict[str, str]) -> dict[str, str]:
    """Repository files outside ``docs/`` that the pages at ``pages`` (repository paths of Markdown files) link to,
    and those their Markdown links to in turn, each mapped to a site path under ``repo/``. A target that does not
    exist is left out, for MkDocs to report as a broken link."""
    found: dict[str, str] = {}
    queue, seen = list(pages), set(pages)
    while queue:
        page = queue.pop()
        text = (REPO / page).read_text(encoding="utf-8", errors="replace")
        for target in _link_targets(text):
            path = target.partition("#")[0].partition("?")[0]
            if not path or _EXTERNAL.match(target):
                continue
            repo_path = posixpath.normpath(posixpath.join(posixpath.dirname(page), path))
            if (repo_path.startswith(("../", "docs/", ".git/")) or repo_path in mirrors or repo_path in found
                    or not (REPO / repo_path).is_file()):
                continue
            found[repo_path] = f"repo/{repo_path}"
            if repo_path.endswith(".md") and repo_path not in seen:
                seen.add(repo_path)
                queue.append(repo_path)
    return found


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    from rankopt.losses import LOSSES

    mirrors: dict[str, str] = {}
    sources: dict[str, str] = {}
    notes = _loss_notes()
    for name in LOSSES.names():
        files.append(File.generated(config, f"losses/{name}.md", content=loss_page(name, notes.get(name, {}))))
    for name, what in _api_packages().items():
        files.append(File.generated(config, f"api/{name}.md", content=api_page(name, what)))
    files.append(File.generated(config, "benchmarks/results/index.md",
                                content="# Benchmark result tables\n\nThe tables committed under "
                                        "`benchmarks/results/`, each with the command, machine and date that made "
                                        "it.\n\n<!-- generated: results -->\n"))
    for f in sorted((REPO / "benchmarks" / "results").iterdir()):
        if f.suffix in (".md", ".png"):
            mirrors[f"benchmarks/results/{f.name}"] = f"benchmarks/results/{f.name}"
    for f in _example_files():
        mirrors[f"examples/{f.name}"] = f"examples.md#example-{f.stem}"
    pages = [f"docs/{f.src_uri}" for f in files if f.is_documentation_page() and f.abs_src_path
             and Path(f.abs_src_path).is_relative_to(REPO / "docs")]
    pages += [p for p in mirrors if p.endswith(".md")]
    mirrors.update(_repository_mirrors(pages, mirrors))
    mirrors["benchmarks/results"] = "benchmarks/results/index.md"  # the folder: its generated list
    for repo_path, site in mirrors.items():
        if "#" in site or (REPO / repo_path).is_dir():
            continue
        files.append(File.generated(config, site, abs_src_path=str(REPO / repo_path),
                                    inclusion=InclusionLevel.NOT_IN_NAV if site.startswith("repo/")
                                    else InclusionLevel.UNDEFINED))
        if site.endswith(".md"):
            sources[site] = repo_path
    es5 = _mathjax_dir()
    wanted = [es5 / "tex-chtml.js", *sorted((es5 / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))]
    for path in wanted:
        files.append(File.generated(config, "assets/mathjax/" + path.relative_to(es5).as_posix(),
                                    abs_src_path=str(path)))
    _state["mirrors"], _state["sources"] = mirrors, sources
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files, **kwargs: Any) -> str:
    def generate(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            raise KeyError(f"{page.file.src_uri}: unknown generated block {name!r}; known: {', '.join(GENERATORS)}")
        return GENERATORS[name]()

    markdown = MARKER.sub(generate, markdown)
    src = page.file.src_uri
    repo_src = _state["sources"].get(src, "docs/" + src)
    return rewrite_links(markdown, src, repo_src)
