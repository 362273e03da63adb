"""A griffe extension for the documentation site: rankopt's docstrings are written for reading in the source, with
Sphinx roles (``:func:`~rankopt.x.y```) and reST literal blocks (``text::``). On the site a role becomes a code span
of the name it shows, and a paragraph's closing ``::`` a ``:`` (the indented block after it is already a code
block in Markdown)."""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|obj|exc|const|ref|term):`(~?)([^`<]+?)(?:\s*<([^>]+)>)?`")
_LITERAL = re.compile(r"(?<=\S)::[ \t]*$", re.MULTILINE)


def _role(match: re.Match[str]) -> str:
    short, name, target = match.group(1), match.group(2).strip(), match.group(3)
    if target:  # :ref:`text <target>`
        return f"`{name}`"
    if short:
        name = name.rsplit(".", 1)[-1]
    return f"`{name}`"


def as_markdown(text: str) -> str:
    """``text`` with Sphinx roles as code spans and reST ``::`` paragraph endings as ``:``."""
    return _LITERAL.sub(":", _ROLE.sub(_role, text))


class RolesAsCode(griffe.Extension):
    """Rewrite each docstring once, when griffe first meets its object."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = as_markdown(obj.docstring.value)
