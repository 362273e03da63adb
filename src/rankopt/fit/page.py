"""``RUN/report.html`` of a fit: every pipeline scored as the index is searched (new photos of known classes, and
photos of new classes where validated), which one is served and why, retrieval examples before and after, and the
time per stage (one self-contained page, figures beside it)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rankopt.fit.photos import Photos
from rankopt.fit.record import FitRecord
from rankopt.fit.validation import NAMES, per_class_gain
from rankopt.layout import FIGURES_DIR, REPORT_HTML
from rankopt.report.html import (
    Raw,
    figure,
    key_values,
    note,
    page,
    section,
    table,
    write_page,
)

EXAMPLE_QUERIES = 4
EXAMPLE_K = 6


def _reference(pipelines: list[dict[str, Any]], protocol: str) -> dict[str, Any]:
    """The best untrained pipeline on ``protocol``: what a fine-tuned one is compared with."""
    untrained = [p for p in pipelines if p["model"] == "features"]
    return max(untrained, key=lambda p: p["scores"][protocol]["metrics"]["map@r"])


def validation_table(record: FitRecord) -> str:
    """One row per pipeline: for each protocol its validation mAP@R (± sd over the query classes), R@1, and its
    gain per class over the best untrained pipeline (± standard error); the served pipeline highlighted."""
    protocols = record.validation["protocols"]
    references = {p: _reference(record.pipelines, p) for p in protocols}
    rows, highlight = [], []
    for i, pipeline in enumerate(record.pipelines):
        row: list[object] = [pipeline["model"], pipeline["steps"]]
        for protocol in protocols:
            scores, base = pipeline["scores"][protocol], references[protocol]["scores"][protocol]
            sd = scores["sd_over_classes"]
            row += [f"{scores['metrics']['map@r']:.4f}" + ("" if math.isnan(sd) else f" ± {sd:.4f}"),
                    scores["metrics"]["recall@1"]]
            if pipeline is references[protocol]:
                row.append("reference")
            else:
                gain, se, _ = per_class_gain(base["by_class"], scores["by_class"])
                row.append(f"{gain:+.4f} ± {se:.4f}" if math.isfinite(se) else f"{gain:+.4f}")
        rows.append(row)
        if pipeline["name"] == record.chosen["served_name"]:
            highlight.append(i)
    header = ["model", "post-processing"]
    for protocol in protocols:
        header += [f"{protocol} mAP@R (± sd)", f"{protocol} R@1", f"{protocol} Δ (± se)"]
    v = record.validation
    caption = (f"known: {v['known_queries']} new photos of the {v['train_classes']} training classes; " +
               (f"new: {v['new_queries']} photos of {v['held_out_classes']} held-out classes; "
                if "new" in protocols else "") +
               f"an index of {v['index_photos']} photos. sd: over the classes; Δ: gain per class over the reference "
               "(the best untrained pipeline), ± its standard error.")
    return table(header, rows, highlight_rows=highlight, caption=caption)


def _examples(folder: Path, photos: Photos, embeddings: Mapping[str, torch.Tensor]) -> Path | None:
    """Top results of a few validation queries of each protocol in the validation index, per model."""
    from rankopt.viz.comparison import GroupNeighbours, plot_retrieval_rows  # matplotlib: loaded when drawing
    from rankopt.viz.retrieval_grid import retrieval_neighbours

    split = photos.split
    labels = torch.as_tensor(split.labels).long()
    rng = np.random.default_rng(0)
    picks = np.concatenate([rng.choice(split.queries(p), min(EXAMPLE_QUERIES // len(split.protocols),
                                                             split.queries(p).size), replace=False)
                            for p in split.protocols])
    if picks.size == 0:
        return None
    groups = []
    for name, x in embeddings.items():
        query = x[split.positions(picks)]
        gallery = x[split.positions(split.gallery)]
        found = retrieval_neighbours(query, labels[picks], gallery, labels[split.gallery], top_k=EXAMPLE_K)
        paths = [[photos.dataset.paths[split.gallery[j]] for j in row] for row in found.indices.tolist()]
        groups.append(GroupNeighbours(name, paths, found.levels.numpy(), found.scores.numpy()))
    kinds = {int(r): "known class" for r in split.known_queries} | {int(r): "new class" for r in split.new_queries}
    titles = [f"{split.class_names[split.labels[q]]} ({kinds[int(q)]})" for q in picks]
    return plot_retrieval_rows(folder / FIGURES_DIR / "examples.png", [photos.dataset.paths[q] for q in picks], groups,
                               num_levels=1, query_titles=titles, title_note="validation queries in the index")


def write_report(folder: Path, record: FitRecord, photos: Photos, embeddings: Mapping[str, torch.Tensor]) -> Path:
    """Write ``folder/report.html`` (and ``folder/figures/examples.png``)."""
    v = record.validation
    candidates = [[c["loss"], c["lr"], c["steps"],
                   max((h[record.chosen["decided_on"]]["map@r"] for h in c["history"]), default=None)]
                  for c in record.chosen["candidates"]]
    searches = {"known": NAMES["known"], "new": NAMES["new"], "both": "both kinds of search"}[record.queries]
    chosen = section("What was chosen and why", "\n".join(
        [table(["loss", "learning rate", "steps", f"best validation mAP@R ({record.chosen['decided_on']} queries)"],
               candidates), *(note(line) for line in record.chosen["why"])]))
    examples = _examples(folder, photos, embeddings)
    pictures = [] if examples is None else [section("Retrieval examples, before and after", figure(
        "figures/examples.png", "top results of validation queries: green frame = same class, red = another"))]
    timing = table(["stage", "seconds"], [[k, s] for k, s in record.seconds.items()], digits=1)
    summary = key_values([("photos", record.photos), ("backbone", f"{record.backbone} ({record.weights})"),
                          ("optimised for", f"{searches} (--queries {record.queries})"),
                          ("training", f"{v['train_photos']} photos of {v['train_classes']} classes"),
                          ("served", record.chosen["pipeline"]),
                          ("index", f"index/ (rankopt serve {folder})")])
    if record.skipped:
        shown = "; ".join(record.skipped[:3]) + (f"; and {len(record.skipped) - 3} more" if len(record.skipped) > 3
                                                  else "")
        summary = Raw(summary + note(f"{len(record.skipped)} unreadable photo(s) were left out (listed in "
                                     f"skipped.txt): {shown}", warning=True))
    results = section("Every pipeline, searched as the index is", validation_table(record),
                      intro="Each row is a way to embed and search the photos. known: how well new photos of the "
                            "classes in the folder find their class; new: the same for classes the model never "
                            "trained on. Higher is better; the highlighted row is what rankopt serve answers with.")
    html = page("rankopt fit", [section("Summary", summary), results, chosen, *pictures,
                                section("Time per stage", timing)],
                subtitle=f"{record.photos} on {record.machine.get('device', '')}")
    return write_page(folder / REPORT_HTML, html)


def _flat_examples(folder: Path, index: Any) -> Path | None:
    """A few photos of the folder searched in its index as ``rankopt serve`` answers them (the photo itself left
    out of its results); grey frames: a flat folder has no classes to judge a result by."""
    from rankopt.viz.comparison import GroupNeighbours, plot_retrieval_rows  # matplotlib: loaded when drawing

    paths = list(index.paths)
    if len(paths) < 2:
        return None
    picks = np.linspace(0, len(paths) - 1, min(EXAMPLE_QUERIES, len(paths))).astype(int)
    k = min(EXAMPLE_K, len(paths) - 1)
    found = index.search([paths[p] for p in picks], k=k + 1)
    rows, scores = [], []
    for q, p in enumerate(picks):
        kept = [i for i, path in enumerate(found.paths[q]) if path is not None and path != paths[p]][:k]
        rows.append([found.paths[q][i] for i in kept])
        scores.append([float(found.scores[q, i]) for i in kept])
    if any(len(r) < k for r in rows):
        return None
    group = GroupNeighbours("served index", rows, np.zeros((len(picks), k), dtype=int), np.asarray(scores))
    return plot_retrieval_rows(folder / FIGURES_DIR / "examples.png", [paths[p] for p in picks], [group],
                               num_levels=0, title_note="photos of the folder searched in its index")


def write_flat_report(folder: Path, record: FitRecord, index: Any) -> Path:
    """``folder/report.html`` of a flat folder's fit (:mod:`rankopt.fit.flat`): what was served and why, a few
    photos searched in the index, the time per stage."""
    summary = key_values([("photos", f"{record.photos} ({len(index):,} photos, no class folders)"),
                          ("backbone", f"{record.backbone} ({record.weights})"),
                          ("served", record.chosen["pipeline"]),
                          ("index", f"index/ (rankopt serve {folder})")])
    if record.skipped:
        summary = Raw(summary + note(f"{len(record.skipped)} unreadable photo(s) were left out (listed in "
                                     "skipped.txt)", warning=True))
    chosen = section("What was served and why", "\n".join(note(line) for line in record.chosen["why"]))
    examples = _flat_examples(folder, index)
    pictures = [] if examples is None else [section("Searches in the index", figure(
        "figures/examples.png", "a few photos of the folder and their top results (the photo itself left out)"))]
    timing = table(["stage", "seconds"], [[k, s] for k, s in record.seconds.items()], digits=1)
    html = page("rankopt fit", [section("Summary", summary), chosen, *pictures, section("Time per stage", timing)],
                subtitle=f"{record.photos} on {record.machine.get('device', '')}")
    return write_page(folder / REPORT_HTML, html)
