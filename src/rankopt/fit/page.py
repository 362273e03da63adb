"""``RUN/report.html`` of a fit: before/after on the validation classes, what was chosen and why, retrieval
examples before and after, and the time per stage (one self-contained page, figures beside it)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rankopt.fit.photos import Photos
from rankopt.fit.post import SELECT_ON, per_class_gain
from rankopt.report.html import figure, key_values, note, page, section, table, write_page
from rankopt.viz.comparison import GroupNeighbours, plot_retrieval_rows
from rankopt.viz.retrieval_grid import retrieval_neighbours

EXAMPLE_QUERIES = 4
EXAMPLE_K = 6


def class_spread(by_class: Mapping[str, Mapping[str, float]], metric: str) -> tuple[float, float]:
    """Mean and sample sd over the classes of their ``metric``."""
    values = np.array([m[metric] for m in by_class.values() if not math.isnan(m.get(metric, math.nan))])
    return (float(values.mean()), float(values.std(ddof=1))) if values.size > 1 else (float("nan"), float("nan"))


# (row, its key in record and record["per_class"], the row its gain per class is paired with): fitted against the
# features, alone and each with its post-processing (the gain the served pipeline is chosen by: post.served_pipeline)
PIPELINE_ROWS = (("pretrained features", "features", None), ("fitted model", "fitted", "features"),
                 ("features + post-processing", "features_post", None),
                 ("fitted + post-processing", "fitted_post", "features_post"))


def validation_table(record: Mapping[str, Any], post_steps: Mapping[str, str]) -> str:
    """The before/after table: each pipeline's validation mAP@R and R@1, its mean ± sd over the classes, and its
    gain per class over the paired row, mean ± standard error (``post_steps``: each model's post-processing in
    words); the served pipeline highlighted."""
    per_class, rows = record["per_class"], []
    for name, key, base in PIPELINE_ROWS:
        metrics, by_class = record.get(key), per_class.get(key)
        if not metrics:
            continue
        mean, sd = class_spread(by_class, SELECT_ON) if by_class else (math.nan, math.nan)
        gain, se, _ = per_class_gain(per_class[base], by_class) if by_class and base in per_class else \
            (math.nan, math.nan, False)
        model = key.removesuffix("_post")
        rows.append([f"{name} ({post_steps[model]})" if key.endswith("_post") else name, metrics["map@r"],
                     "" if math.isnan(mean) else f"{mean:.4f} ± {sd:.4f}", metrics["recall@1"],
                     f"{gain:+.4f} ± {se:.4f}" if math.isfinite(se) else "–"])
    served = record["chosen"]["model"]
    if record["chosen"].get("multiscale"):  # multi-scale kept: its own row, the steps chosen again for it
        rows.append([f"served: {record['chosen']['pipeline']}", record["served"]["map@r"], "",
                     record["served"]["recall@1"], ""])
        highlight = [len(rows) - 1]
    else:
        highlight = [i for i, r in enumerate(rows) if str(r[0]).startswith(f"{served} + ")] or [0]
    v = record["validation"]
    return table(["pipeline", "mAP@R", "mAP@R per class (mean ± sd)", "R@1", "Δ mAP@R per class (± se)"], rows,
                 highlight_rows=highlight,
                 caption=f"{v['classes']} validation classes ({v['photos']} photos) held out from training, each "
                         "photo a query (self-retrieval); Δ: the fitted model against the features, alone and each "
                         "with its post-processing; the served pipeline highlighted")


def _examples(folder: Path, photos: Photos, val_rows: np.ndarray, before: torch.Tensor,
              after: torch.Tensor | None) -> Path | None:
    labels = torch.as_tensor(photos.labels[val_rows])
    picks = np.random.default_rng(0).choice(len(val_rows), min(EXAMPLE_QUERIES, len(val_rows)), replace=False)
    groups = []
    for name, x in (("pretrained features", before), ("fitted model", after)):
        if x is None:
            continue
        found = retrieval_neighbours(x, labels, query_indices=picks.tolist(), top_k=EXAMPLE_K)
        paths = [[photos.dataset.paths[val_rows[j]] for j in row] for row in found.indices.tolist()]
        groups.append(GroupNeighbours(name, paths, found.levels.numpy(), found.scores.numpy()))
    queries = [photos.dataset.paths[val_rows[q]] for q in picks]
    titles = [photos.class_names[photos.labels[val_rows[q]]] for q in picks]
    return plot_retrieval_rows(folder / "figures" / "examples.png", queries, groups, num_levels=1,
                               query_titles=titles, title_note="validation classes")


def write_report(folder: Path, record: Mapping[str, Any], photos: Photos, val_rows: np.ndarray,
                 features_val: torch.Tensor, fitted_val: torch.Tensor | None, choices: Mapping[str, Any]) -> Path:
    """Write ``folder/report.html`` (and ``folder/figures/examples.png``)."""
    results = validation_table(record, {name: choice.describe() for name, choice in choices.items()})
    v = record["validation"]
    candidates = [[c["loss"], c["lr"], c["steps"], max((h["map@r"] for h in c["history"]), default=None)]
                  for c in record["chosen"]["candidates"]]
    chosen = [section("What was chosen and why", "\n".join(
        [table(["loss", "learning rate", "steps", "best validation mAP@R"], candidates),
         *(note(line) for line in record["chosen"]["why"])]))]
    examples = _examples(folder, photos, val_rows, features_val, fitted_val)
    pictures = [] if examples is None else [section("Retrieval examples, before and after", figure(
        "figures/examples.png", "top results of validation queries: green frame = same class, red = another"))]
    seconds = record["seconds"]
    timing = table(["stage", "seconds"], [[k, v] for k, v in seconds.items()], digits=1)
    summary = key_values([("photos", record["photos"]), ("backbone", f"{record['backbone']} ({record['weights']})"),
                          ("training classes", f"{v['train_classes']} ({v['train_photos']} photos)"),
                          ("served", record["chosen"]["pipeline"]), ("index", "index/ (rankopt serve "
                                                                                         f"{folder})")])
    html = page("rankopt fit", [section("Summary", summary), section("Before and after, on validation", results),
                                *chosen, *pictures, section("Time per stage", timing)],
                subtitle=f"{record['photos']} on {record['machine'].get('device', '')}")
    return write_page(folder / "report.html", html)
