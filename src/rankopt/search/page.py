"""The results page of a search (``rankopt search --html OUT.html``): one row per query, its
thumbnail then its top-k thumbnails with rank and score, framed by relevance when the query's
label is known: green = same finest class, orange = shares a coarser level only, red = no shared
label, grey = unknown; "no match" marks a result scoring below the index's calibrated threshold.
Thumbnails are small PNGs written to ``OUT_files/`` beside the page (never
links to the user's originals): the page works offline and when moved; no JavaScript.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path, PurePath

import torch
from matplotlib.colors import to_hex
from PIL import Image

from rankopt.labels import relevance_levels
from rankopt.report.html import (
    Raw,
    escape,
    format_value,
    key_values,
    note,
    page,
    section,
    write_page,
)
from rankopt.search.result import SearchResult
from rankopt.viz.pictures import level_colour, level_name, thumbnail

UNKNOWN_COLOUR = "#8c959f"
QUERY_COLOUR = "#0969da"
_CELL = ("display:inline-block;width:146px;margin:0 6px 10px 0;text-align:center;vertical-align:top;"
         "font-size:0.78rem;line-height:1.3")
_IMAGE = ("display:block;width:136px;height:136px;object-fit:contain;background:#fff;border:5px solid {};"
          "border-radius:6px;margin:0 auto 3px")
_MISSING = ("display:flex;align-items:center;justify-content:center;width:136px;height:136px;margin:0 auto 3px;"
            "border:5px solid {};border-radius:6px;background:#f6f8fa;color:#59636e")
_NAME = "color:#59636e;overflow-wrap:anywhere"
_SWATCH = ("display:inline-block;width:14px;height:14px;border-radius:3px;vertical-align:-2px;margin:0 6px 0 "
           "14px;background:{}")


def thumbnails_folder(html_path: Path) -> Path:
    """``OUT_files/`` beside ``OUT.html``."""
    return html_path.with_name(f"{html_path.stem}_files")


def _write_png(path: Path, source: str) -> bool:
    """A PNG thumbnail of image ``source`` at ``path`` (temporary file + ``os.replace``); False when unreadable."""
    try:
        pixels = thumbnail(source)
    except FileNotFoundError:
        return False
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(buffer.getvalue())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return True


def _cell(src: str | None, colour: str, lines: Sequence[str], title: str) -> str:
    image = (f'<img src="{escape(src)}" alt="{escape(lines[-1])}" title="{escape(title)}" '
             f'style="{_IMAGE.format(colour)}">'
             if src is not None else f'<div style="{_MISSING.format(colour)}">image unreadable</div>')
    text = f"<div>{escape(lines[0])}</div>" + "".join('<div '
                                                      f'style="{_NAME}">{escape(line)}</div>' for line in lines[1:])
    return f'<div style="{_CELL}">{image}{text}</div>'


def _legend(levels: int, level_names: Sequence[str]) -> Raw:
    items = [(to_hex(level_colour(lv, levels)), level_name(lv, levels, level_names)) for lv in range(levels, -1, -1)]
    items += [(UNKNOWN_COLOUR, "query label unknown"), (QUERY_COLOUR, "the query")]
    swatches = "".join(f'<span style="{_SWATCH.format(c)}"></span>{escape(t)}' for c, t in items)
    return Raw(f'<p style="margin-left:-14px">{swatches}</p>')


def write_results_page(result: SearchResult, html_path: str | os.PathLike[str], *, title: str = "Search results",
                       details: Sequence[tuple[str, object]] = ()) -> Path:
    """Write the results page of ``result`` (image queries) to ``html_path`` and its thumbnails beside it."""
    out = Path(html_path)
    if result.query_paths is None:
        raise ValueError("the results page shows image queries; these queries were embeddings")
    folder = thumbnails_folder(out)
    folder.mkdir(parents=True, exist_ok=True)
    written: dict[str, str | None] = {}

    def src(name: str, source: str | None) -> str | None:
        if source is not None and name not in written:
            written[name] = f"{folder.name}/{name}" if _write_png(folder / name, source) else None
        return written.get(name)

    levels = result.labels.shape[-1]
    matches = result.matches
    base = os.path.commonpath([str(PurePath(p).parent) for p in result.query_paths])
    rows = []
    for q, query in enumerate(result.query_paths):
        query_label = result.query_labels[q] if result.query_labels is not None else torch.full((levels,), -1)
        known = int(query_label[0]) >= 0
        heading = os.path.relpath(query, base) + (f" — {result.label_text(int(query_label[0]))}" if known else "")
        cells = [_cell(src(f"query{q}.png", query), QUERY_COLOUR, ["query", PurePath(query).name], query)]
        shared = relevance_levels(query_label.unsqueeze(0), result.labels[q])[0]
        for rank, row in enumerate(result.rows[q].tolist(), start=1):
            if row < 0:
                continue
            path, item = result.paths[q][rank - 1], result.ids[q][rank - 1]
            label = int(result.labels[q, rank - 1, 0])
            colour = to_hex(level_colour(int(shared[rank - 1]), levels)) if known and label >= 0 else UNKNOWN_COLOUR
            lines = [f"#{rank} · {format_value(float(result.scores[q, rank - 1]), 3)}"
                     + (" · no match" if matches is not None and not bool(matches[q, rank - 1]) else "")]
            if label >= 0:
                lines.append(str(result.label_text(label)))
            lines.append(PurePath(path).name if path else f"item {item}")
            cells.append(_cell(src(f"item{row}.png", path), colour, lines, path or f"item {item}"))
        rows.append(f"<h3>{escape(heading)}</h3>\n<div>{''.join(cells)}</div>")
    intro = (f"Top {result.k} of each of {len(result)} queries. Frames: relevance to the query when its label is "
             "known (the query lies in a folder named like a class of the index).")
    body = [_legend(levels, result.level_names), *([note(result.note)] if result.note else []), *rows]
    sections = [section("Results", Raw("\n".join(body)), intro=intro)]
    if details:
        sections.insert(0, section("Index", key_values(list(details))))
    return write_page(out, page(title, sections, subtitle=f"{len(result)} queries, top {result.k}"))
