"""The section of a results file that holds the figures the code cites, kept when a benchmark rewrites its tables."""

from __future__ import annotations

from pathlib import Path

CITED = "## Measurements cited by the code"
"""Heading of the section; it runs to the end of the file, after every table the benchmark writes."""


def keep_cited(path: Path, text: str) -> str:
    """``text`` followed by the :data:`CITED` section of the file now at ``path``, when it has one."""
    old = path.read_text() if path.exists() else ""
    if CITED not in old:
        return text
    return text.rstrip("\n") + "\n\n" + old[old.index(CITED):]
