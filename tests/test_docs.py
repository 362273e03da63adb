"""The repository a reader clones is whole: every relative link or image of a committed Markdown
file points at a file that exists and is tracked by git, and no tracked text file names one
machine's absolute paths (a home or work folder: data are read from options and environment
variables, paths in docs are relative to the repository)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from urllib.parse import unquote

import pytest

REPO = Path(__file__).resolve().parents[1]
_SKIPPED_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", "build", "dist", "runs", "studies"}

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
_INLINE = re.compile(r"!?\[[^\]]*\]\(\s*(?:<([^>\n]+)>|([^)\s]+))(?:\s+[\"'(][^)]*)?\)")
_REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
_HTML = re.compile(r"<(?:img|a|source)\b[^>]*?\b(?:src|href)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
_EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//|#)")  # http:, mailto:, protocol-relative, in-page anchors

MACHINE_PATH = re.compile(r"(?<![\w.~/-])/(?:work|home|Users|root|mnt|scratch|net|nfs|gpfs|lustre)/"
                          r"|\b[A-Za-z]:\\(?:Users|work)\\")
"""A home or work folder of one machine (``/tmp`` is on every POSIX system and names none; ``/data/...``
stands for the reader's own dataset folder in examples). Preceded by a word character, a dot or a
slash, the match is part of a URL or a relative path and does not count."""


def link_targets(markdown: str) -> list[str]:
    """The link and image targets of ``markdown`` (inline, reference definitions, HTML ``src``/``href``),
    outside fenced code blocks and code spans, in order."""
    text = _CODE_SPAN.sub("", _FENCE.sub("", markdown))
    found = [(m.start(), next(g for g in m.groups() if g is not None))
             for pattern in (_INLINE, _REFERENCE, _HTML) for m in pattern.finditer(text)]
    return [target for _, target in sorted(found)]


def local_target(target: str) -> str | None:
    """The repository path part of a link target (query and anchor dropped, %-escapes decoded);
    None for URLs and in-page anchors."""
    if _EXTERNAL.match(target):
        return None
    path = unquote(target.split("#", 1)[0].split("?", 1)[0])
    return path or None


def broken_links(markdown_file: Path, root: Path, tracked: set[str] | None) -> list[str]:
    """The relative targets of ``markdown_file`` that do not exist, lie outside ``root`` or (when
    ``tracked`` is given: repository paths, POSIX) are not tracked by git, with the reason."""
    problems = []
    for target in link_targets(markdown_file.read_text(encoding="utf-8")):
        path = local_target(target)
        if path is None:
            continue
        resolved = (root / path.lstrip("/")) if path.startswith("/") else (markdown_file.parent / path)
        resolved = resolved.resolve()
        if not resolved.is_relative_to(root):
            problems.append(f"{target}: outside the repository")
        elif not resolved.exists():
            problems.append(f"{target}: does not exist")
        elif tracked is not None:
            relative = resolved.relative_to(root).as_posix()
            inside = relative + "/"
            if relative not in tracked and not any(t.startswith(inside) for t in tracked):
                problems.append(f"{target}: exists but is not tracked by git (ignored or not added)")
    return problems


def machine_paths(text: str) -> list[str]:
    """The lines of ``text`` naming a machine's absolute home/work path, as ``"line N: ..."``."""
    return [f"line {i}: {line.strip()[:160]}" for i, line in enumerate(text.splitlines(), 1) if MACHINE_PATH.search(line)]


def _git_files(root: Path) -> list[str] | None:
    """Tracked files (repository paths, POSIX), or None outside a git checkout."""
    if shutil.which("git") is None or not (root / ".git").exists():
        return None
    result = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, check=False)
    if result.returncode != 0:
        return None
    return [p for p in result.stdout.decode("utf-8").split("\0") if p]


def _repository_files(root: Path) -> list[str]:
    """Tracked files in a git checkout; else every file outside caches, environments and run outputs."""
    tracked = _git_files(root)
    if tracked is not None:
        return tracked
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                  if p.is_file() and not _SKIPPED_DIRS.intersection(p.relative_to(root).parts[:-1]))


FILES = _repository_files(REPO)
TRACKED = _git_files(REPO)
MARKDOWN = [p for p in FILES if p.endswith(".md")]


# ---------------------------------------------------------------- the checkers catch what they must

def test_link_targets_reads_every_link_form_and_skips_code():
    text = ("![fig](docs/a.png) [page](b.md#part) [site](https://x.org/a.png) [top](#intro)\n"
            "<img src=\"c/d.svg\" width=300>\n[ref]: e.md \"title\"\n"
            "`![not](code.png)`\n```\n![not](fenced.png)\n```\n![spaced](<f g.png>) ![esc](h%20i.png)\n")
    targets = link_targets(text)
    assert targets == ["docs/a.png", "b.md#part", "https://x.org/a.png", "#intro", "c/d.svg", "e.md", "f g.png",
                       "h%20i.png"]
    assert [local_target(t) for t in targets] == ["docs/a.png", "b.md", None, None, "c/d.svg", "e.md", "f g.png", "h i.png"]


def test_broken_links_reports_missing_untracked_and_outside(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "kept.png").write_bytes(b"png")
    (tmp_path / "docs" / "ignored.png").write_bytes(b"png")
    page = tmp_path / "docs" / "page.md"
    page.write_text("![a](kept.png) ![b](ignored.png) ![c](gone.png) [d](../../elsewhere.md) [e](/docs/kept.png)\n")
    problems = broken_links(page, tmp_path.resolve(), {"docs/kept.png", "docs/page.md"})
    assert problems == ["ignored.png: exists but is not tracked by git (ignored or not added)",
                        "gone.png: does not exist", "../../elsewhere.md: outside the repository"]
    assert broken_links(page, tmp_path.resolve(), None) == problems[1:]  # outside git: existence only


def test_machine_paths_flags_home_and_work_folders_only():
    bad = ["root=/" + "work/shared/data", "'/" + "home/alice/x.png'", "C:" + "\\Users\\bob\\data", "cd /" + "Users/carol",
           "(/" + "root/.cache)"]
    fine = ["--out /tmp/h.md", "/dev/null", "https://example.org/home/page", "../shared/data/omniglot",
            "/data/Stanford_Online_Products", "~/.cache/rankopt", "src/work/home.py"]
    assert [machine_paths(s) != [] for s in bad] == [True] * len(bad)
    assert [machine_paths(s) for s in fine] == [[]] * len(fine)


# ---------------------------------------------------------------- the repository

@pytest.mark.parametrize("name", MARKDOWN)
def test_markdown_links_exist_and_are_tracked(name):
    """Each relative link/image of a committed Markdown file exists in the working tree and (in a git
    checkout) is tracked, so a fresh clone shows no broken image or link."""
    tracked = set(TRACKED) if TRACKED is not None else None
    assert broken_links(REPO / name, REPO, tracked) == []


def test_markdown_files_were_found():
    assert "README.md" in MARKDOWN and "docs/benchmarks.md" in MARKDOWN


def test_no_tracked_text_file_names_a_machine_path():
    offenders = {}
    for name in FILES:
        path = REPO / name
        if not path.is_file():  # deleted in the working tree, not yet in the index
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary (PNG, checkpoints)
            continue
        found = machine_paths(data.decode("utf-8", errors="replace"))
        if found:
            offenders[name] = found
    assert offenders == {}, "absolute machine paths (use paths relative to the repository, options or variables)"
