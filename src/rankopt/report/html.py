"""Small HTML primitives for rankopt's self-contained report pages.

Every primitive returns :class:`Raw` (a ``str`` holding finished HTML), so its result can be
nested inside another primitive without being escaped twice; any other text is escaped.
Pages have their CSS inline, no JavaScript and no network resources: they read offline and print.
"""

from __future__ import annotations

import html
import math
import numbers
import os
import re
import struct
from collections.abc import Collection, Sequence
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

from rankopt.files import write_text_atomic

__all__ = ["DASH", "Raw", "check_page", "code", "columns", "escape", "figure", "format_value", "key_values", "link",
           "note", "page", "png_problem", "section", "table", "write_page"]

DASH = "\u2013"
"""What :func:`format_value` writes for a missing value (``None`` or NaN)."""


class Raw(str):
    """Finished HTML: inserted as is by :func:`escape` and every primitive."""


def escape(text: object) -> str:
    """HTML-escape ``str(text)`` (quotes included); :class:`Raw` HTML is returned unchanged."""
    return text if isinstance(text, Raw) else html.escape(str(text), quote=True)


def format_value(value: object, digits: int | None = 4) -> str:
    """Text of a cell: floats with ``digits`` decimals (``g`` format when tiny or huge; ``None``:
    up to 6 significant digits), integers grouped by thousands from 10 000, booleans as yes/no,
    ``None``/NaN as an en dash."""
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, numbers.Integral):
        return f"{int(value):,}" if abs(int(value)) >= 10_000 else str(int(value))
    if isinstance(value, numbers.Real):
        x = float(value)
        if math.isnan(x):
            return DASH
        if math.isinf(x):
            return "∞" if x > 0 else "−∞"
        if digits is None:
            return f"{x:.6g}"
        if x != 0 and (abs(x) < 0.5 * 10.0**-digits or abs(x) >= 1e7):
            return f"{x:.{max(digits - 1, 1)}g}"
        return f"{x:.{digits}f}"
    return str(value)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _cell(value: object, digits: int | None) -> str:
    return str(value) if isinstance(value, Raw) else escape(format_value(value, digits))


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"


def link(href: str, text: object) -> Raw:
    """An ``<a>`` to ``href`` (a path relative to the page, an ``#anchor`` or a paper's URL)."""
    return Raw(f'<a href="{escape(href)}">{escape(text)}</a>')


def code(text: object) -> Raw:
    """Inline code (``<code>``), or a preformatted block when ``text`` has several lines."""
    body = escape(text)
    return Raw(f"<pre>{body}</pre>" if "\n" in str(text) else f"<code>{body}</code>")


def note(text: object, *, warning: bool = False) -> Raw:
    """A paragraph of side information (italic, muted), or a highlighted ``warning``."""
    return Raw(f'<p class="{"warning" if warning else "note"}">{escape(text)}</p>')


def columns(blocks: Sequence[str]) -> Raw:
    """Blocks (HTML) side by side, wrapping to one column on narrow pages."""
    return Raw('<div class="columns">' + "".join(f"<div>{b}</div>" for b in blocks) + "</div>")


def section(title: str, body: str, *, anchor: str | None = None, intro: str = "") -> Raw:
    """A titled ``<section>`` (id ``anchor``, default: a slug of the title) around ``body`` (HTML),
    with an optional introductory paragraph (text)."""
    intro_html = f'<p class="intro">{escape(intro)}</p>\n' if intro else ""
    return Raw(f'<section id="{escape(anchor or _slug(title))}">\n<h2>{escape(title)}</h2>\n'
               f'{intro_html}{body}\n</section>')


def table(header: list[str], rows: list[list[object]], *, highlight_rows: Collection[int] = (),
          caption: str = "", digits: int = 4, highlight_columns: Collection[int] = ()) -> Raw:
    """A table: numbers right-aligned with ``digits`` decimals, missing values as an en dash,
    the rows and columns whose index is in ``highlight_rows``/``highlight_columns``
    highlighted, a caption above (text). :class:`Raw` cells are inserted as is."""
    width = max([len(header)] + [len(r) for r in rows])
    numeric = [all(_is_number(r[c]) or r[c] is None for r in rows if c < len(r))
               and any(c < len(r) and _is_number(r[c]) for r in rows) for c in range(width)]

    def cls(column: int) -> str:
        names = ["num"] * numeric[column] + ["highlight"] * (column in highlight_columns)
        return f' class="{" ".join(names)}"' if names else ""

    head = "".join(f"<th{cls(c)}>{escape(h)}</th>" for c, h in enumerate(header))
    body = []
    for i, row in enumerate(rows):
        cells = "".join(f"<td{cls(c)}>{_cell(v, digits)}</td>" for c, v in enumerate(row))
        mark = ' class="highlight"' if i in highlight_rows else ""
        body.append(f"<tr{mark}>{cells}</tr>")
    cap = f"<caption>{escape(caption)}</caption>" if caption else ""
    return Raw(f'<div class="table-wrap"><table class="data">{cap}<thead><tr>{head}</tr></thead>'
               f'<tbody>\n{chr(10).join(body)}\n</tbody></table></div>')


def key_values(pairs: Sequence[tuple[str, object]]) -> Raw:
    """A two-column definition table: names in the first column, formatted values in the second."""
    rows = "\n".join(f'<tr><th scope="row">{escape(k)}</th><td>{_cell(v, None)}</td></tr>' for k, v in pairs)
    return Raw(f'<table class="kv"><tbody>\n{rows}\n</tbody></table>')


def figure(src: str, caption: str, *, width: str | None = None) -> Raw:
    """An image (``src`` relative to the page) with its caption (text); ``width`` a CSS length."""
    style = f' style="width: {escape(width)}"' if width else ""
    return Raw(f'<figure{style}><img src="{escape(src)}" alt="{escape(caption)}">'
               f"<figcaption>{escape(caption)}</figcaption></figure>")


_CSS = """
:root { --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --zebra: #f6f8fa; --accent: #0969da;
        --hl: #fff8c5; --hl-line: #d4a72c; }
* { box-sizing: border-box; }
body { margin: 0; color: var(--fg); background: #fff; line-height: 1.5; font-size: 15px;
       font-family: system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Noto Sans",
                    "Liberation Sans", sans-serif; }
main { max-width: 1150px; margin: 0 auto; padding: 28px 32px 40px; }
header.page { border-bottom: 2px solid var(--line); margin-bottom: 8px; padding-bottom: 10px; }
h1 { font-size: 1.75rem; margin: 0 0 4px; line-height: 1.25; }
.subtitle { color: var(--muted); margin: 0; }
nav.toc { font-size: 0.9rem; margin: 10px 0 6px; color: var(--muted); }
nav.toc a { margin-right: 14px; white-space: nowrap; }
section { margin-top: 30px; }
h2 { font-size: 1.3rem; border-bottom: 1px solid var(--line); padding-bottom: 4px; margin: 0 0 12px; }
h3 { font-size: 1.05rem; margin: 18px 0 8px; }
p { margin: 8px 0; }
.intro, .note { color: var(--muted); }
.note { font-style: italic; }
.warning { background: #fff1e5; border-left: 4px solid #bc4c00; padding: 6px 12px; margin: 10px 0; }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
code { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace; font-size: 0.88em;
       background: var(--zebra); padding: 1px 4px; border-radius: 4px; }
pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, "Liberation Mono", monospace; font-size: 0.82rem;
      background: var(--zebra); border: 1px solid var(--line); border-radius: 6px; padding: 10px 12px;
      overflow-x: auto; white-space: pre-wrap; word-break: break-word; }
.table-wrap { overflow-x: auto; margin: 10px 0; }
table { border-collapse: collapse; font-size: 0.9rem; }
table.data { min-width: 50%; }
caption { caption-side: top; text-align: left; font-weight: 600; padding: 0 0 6px; }
th, td { padding: 5px 10px; border-bottom: 1px solid var(--line); vertical-align: top; text-align: left; }
table.data thead th { background: #eef1f4; border-bottom: 2px solid var(--line); white-space: nowrap; }
table.data tbody tr:nth-child(even) { background: var(--zebra); }
table.data tbody tr.highlight { background: var(--hl); }
table.data tbody tr.highlight td { border-bottom-color: var(--hl-line); font-weight: 600; }
table.data td.highlight { background: rgba(255, 223, 93, 0.28); font-weight: 600; }
table.data th.highlight { background: var(--hl); box-shadow: inset 0 -2px 0 var(--hl-line); }
.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
table.kv { margin: 6px 0 14px; }
table.kv th { font-weight: 600; color: var(--muted); white-space: nowrap; padding-right: 18px; width: 1%; }
table.kv td { font-variant-numeric: tabular-nums; word-break: break-word; }
.columns { display: flex; flex-wrap: wrap; gap: 0 40px; }
.columns > div { flex: 1 1 480px; min-width: 0; }
.columns table.kv { width: 100%; }
figure { margin: 14px 0 22px; max-width: 100%; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 4px; }
figcaption { color: var(--muted); font-size: 0.88rem; margin-top: 6px; }
footer { margin-top: 40px; border-top: 1px solid var(--line); padding-top: 10px; color: var(--muted);
         font-size: 0.85rem; }
@media print {
  body { font-size: 11pt; }
  main { max-width: none; padding: 0; }
  nav.toc { display: none; }
  a { color: inherit; }
  section, figure, table { break-inside: avoid; }
  h2 { break-after: avoid; }
  .table-wrap { overflow: visible; }
}
"""

_SECTION_HEAD = re.compile(r'<section id="([^"]+)">\s*<h2>(.*?)</h2>', re.S)


def page(title: str, body_sections: list[str], *, subtitle: str = "") -> Raw:
    """A complete HTML5 document: title, subtitle (text), a table of contents of the
    :func:`section` blocks, then the blocks themselves (HTML)."""
    heads = [m.groups() for s in body_sections if (m := _SECTION_HEAD.match(s))]
    toc = ('<nav class="toc">' + "".join(f'<a href="#{a}">{t}</a>'
                                         for a, t in heads) + "</nav>\n") if len(heads) > 1 else ""
    sub = f'<p class="subtitle">{escape(subtitle)}</p>' if subtitle else ""
    body = "\n".join(body_sections)
    return Raw(f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>{_CSS}</style>
</head>
<body>
<main>
<header class="page"><h1>{escape(title)}</h1>{sub}</header>
{toc}{body}
</main>
</body>
</html>
""")


def write_page(path: str | os.PathLike[str], html_text: str) -> Path:
    """Write ``html_text`` to ``path`` atomically (``rankopt.files.write_text_atomic``); returns the path."""
    return write_text_atomic(path, html_text)


# ---------------------------------------------------------------- page checks

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
_OPTIONAL_END = {"p", "li", "dt", "dd", "tr", "td", "th", "thead", "tbody", "tfoot", "option", "html", "head", "body"}
_RESOURCE_ATTRS = {"img": "src", "script": "src", "link": "href", "iframe": "src", "source": "src", "video": "src",
                   "audio": "src", "embed": "src", "object": "data", "input": "src"}
_CSS_URL = re.compile(r"""(?:url\(\s*['"]?|@import\s+['"])\s*(https?:)?//""", re.I)


def png_problem(path: Path) -> str | None:
    """Why ``path`` is not a valid PNG (signature, IHDR with positive size, Pillow's verify), or None."""
    try:
        with open(path, "rb") as f:
            head = f.read(24)
    except OSError as err:
        return f"cannot read {path.name}: {err.strerror}"
    if head[:8] != _PNG_SIGNATURE:
        return f"{path.name} is not a PNG (bad signature)"
    if len(head) < 24 or head[12:16] != b"IHDR":
        return f"{path.name} has no IHDR header"
    width, height = struct.unpack(">II", head[16:24])
    if width == 0 or height == 0:
        return f"{path.name} has an empty size {width}x{height}"
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.verify()
    except Exception as err:  # Pillow raises many types for corrupt data
        return f"{path.name} is a corrupt PNG ({type(err).__name__}: {err})"
    return None


class _PageScanner(HTMLParser):
    """Collects local references, network resources, ids and tag-nesting errors of a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.local: list[tuple[str, str]] = []
        self.anchors: list[str] = []
        self.ids: set[str] = set()
        self.problems: list[str] = []
        self.stack: list[str] = []
        self.in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if "id" in a:
            self.ids.add(a["id"])
        if tag == "script":
            self.problems.append("<script> element: report pages carry no JavaScript")
        if _CSS_URL.search(a.get("style", "")):
            self.problems.append(f"<{tag} style> loads a network resource")
        attr = _RESOURCE_ATTRS.get(tag)
        if attr and attr in a:
            self._reference(tag, a[attr], resource=True)
        if tag == "a" and "href" in a:
            self._reference(tag, a["href"], resource=False)
        if tag == "style":
            self.in_style = True
        if tag not in _VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID and self.stack and self.stack[-1] == tag:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self.in_style = False
        if tag in _VOID:
            return
        if tag not in self.stack:
            self.problems.append(f"stray </{tag}> at line {self.getpos()[0]}")
            return
        while self.stack:
            open_tag = self.stack.pop()
            if open_tag == tag:
                break
            if open_tag not in _OPTIONAL_END:
                self.problems.append(f"<{open_tag}> not closed before </{tag}> at line {self.getpos()[0]}")

    def handle_data(self, data: str) -> None:
        if self.in_style and _CSS_URL.search(data):
            self.problems.append("<style> loads a network resource (url()/@import)")

    def _reference(self, tag: str, target: str, *, resource: bool) -> None:
        target = target.strip()
        parts = urlsplit(target)
        scheme = parts.scheme.lower()
        if target.startswith("//") or scheme in ("http", "https"):
            if resource:
                self.problems.append(f"<{tag}> loads a network resource: {target}")
            return
        if scheme in ("mailto", "data"):
            return
        if scheme not in ("", "file") or (not parts.path and not parts.fragment):
            self.problems.append(f"<{tag}> has an unsupported reference: {target!r}")
        elif not parts.path:
            self.anchors.append(parts.fragment)
        else:
            self.local.append((tag, unquote(parts.path)))


def check_page(path: str | os.PathLike[str]) -> list[str]:
    """Problems of a report page (an empty list when none): every local ``<img src>``/``<a href>``
    exists (PNGs are valid), every ``#anchor`` has its id, no ``<script>`` and no resource
    (image, style sheet, frame, CSS ``url()``) from the network, tags properly nested."""
    page_path = Path(path)
    if not page_path.is_file():
        raise FileNotFoundError(f"report page {page_path} does not exist")
    scanner = _PageScanner()
    scanner.feed(page_path.read_text(encoding="utf-8"))
    scanner.close()
    problems = list(scanner.problems)
    unclosed = [t for t in scanner.stack if t not in _OPTIONAL_END]
    if unclosed:
        problems.append(f"unclosed tags at the end of the page: {', '.join(unclosed)}")
    problems += [f'<a href="#{a}"> points to no id' for a in scanner.anchors if a not in scanner.ids]
    for tag, ref in scanner.local:
        target = Path(ref) if Path(ref).is_absolute() else page_path.parent / ref
        if not target.exists():
            problems.append(f"<{tag}> refers to a missing file: {ref}")
        elif target.suffix.lower() == ".png" and (why := png_problem(target)):
            problems.append(f"<{tag}> refers to a bad image: {why}")
    return problems
