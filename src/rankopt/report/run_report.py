"""``RUN/report.html``: the page a person reads about one run, built from the run folder alone.

Reads ``config.yaml``, ``run.json``, ``report.json``, ``metrics.json``, ``steps.csv`` and the
figures already in ``figures/``; draws the training diagnostics (``loss_terms.png``,
``learning_rates.png``, ``metrics_per_eval.png``, ``ap_per_level.png``, ``surrogates.png``)
with :mod:`rankopt.viz`; never loads a model. Any missing piece (older runs, ``rankopt
evaluate`` runs, flat labels, a run stopped before its first evaluation) leaves a note in its
section instead of failing.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from rankopt import __version__
from rankopt.layout import (CONFIG_YAML, FIGURES_DIR, METRICS_CSV, METRICS_JSON, REPORT_HTML, REPORT_JSON, RUN_JSON,
                            STEPS_CSV)
from rankopt.report.html import Raw, code, escape, figure, link, note, page, section, write_page
from rankopt.report.loss_surrogates import surrogates_for
from rankopt.report.run_reader import RunFolder, read_run
from rankopt.report.run_tables import column_title, metrics_section, what_was_run

__all__ = ["write_run_report"]



# ---------------------------------------------------------------- figures

def _quantile_summary(steps: Mapping[str, np.ndarray] | None) -> tuple[tuple[float, float], tuple[float, float] | None,
                                                                      float | None]:
    """``(x range, 5-95% band, median)`` of the score differences of training: the range from the
    smallest 1% to the largest 99% quantile over the steps, band and median as the median over
    steps of each batch's quantiles; ``((-1, 1), None, None)`` when ``steps`` has no ``diff/`` column."""
    def column(name: str) -> np.ndarray:
        values = np.asarray(steps.get(name, []) if steps else [], dtype=float)
        return values[np.isfinite(values)]

    q01, q99 = column("diff/q01"), column("diff/q99")
    if q01.size == 0 or q99.size == 0:
        return (-1.0, 1.0), None, None
    lo, hi = min(float(q01.min()), 0.0), max(float(q99.max()), 0.0)
    pad = 0.05 * (hi - lo) or 0.05
    q05, q50, q95 = column("diff/q05"), column("diff/q50"), column("diff/q95")
    band = (float(np.median(q05)), float(np.median(q95))) if q05.size and q95.size else None
    return (lo - pad, hi + pad), band, float(np.median(q50)) if q50.size else None


@dataclass
class _Figures:
    """Draws into ``RUN/figures``; keeps the sentence of any figure it could not draw."""

    run: RunFolder
    drawn: list[Path]
    problems: dict[str, str]

    @property
    def folder(self) -> Path:
        return self.run.path / FIGURES_DIR

    def draw(self, name: str, plot: Callable[[Path], Path]) -> None:
        """``plot(path)``; on bad or empty data, the reason is kept and any older copy removed."""
        try:
            self.drawn.append(plot(self.folder / name))
        except (ValueError, TypeError) as err:
            self.problems[name] = str(err)
            (self.folder / name).unlink(missing_ok=True)


def _note_text(run: RunFolder) -> str | None:
    return "SYNTHETIC data" if run.synthetic else None


def _figure_or_note(figs: _Figures, name: str, caption: str, missing: str) -> str:
    if (figs.folder / name).is_file():
        return figure(f"{FIGURES_DIR}/{name}", caption)
    return note(missing + (f" ({figs.problems[name]})" if name in figs.problems else ""))


# ---------------------------------------------------------------- sections

def _training_section(run: RunFolder, figs: _Figures) -> str | None:
    """Loss terms, learning rates and metrics per evaluation; ``None`` for an evaluate run (nothing trained)."""
    # matplotlib (slow import): only when the figures are drawn
    from rankopt.viz import plot_learning_rates, plot_loss_terms, plot_metric_history

    if run.kind == "evaluate":
        return None
    tn = _note_text(run)
    body = []
    if run.steps is None:
        body.append(note("No per-step log: steps.csv is missing (run from an older rankopt, or stopped before "
                         "its first checkpoint)."))
        if (figs.folder / "training_curves.png").is_file():
            body.append(figure(f"{FIGURES_DIR}/training_curves.png", "Loss, learning rates and metrics per evaluation "
                                                                   "(written by the trainer)"))
    else:
        figs.draw("loss_terms.png", lambda p: plot_loss_terms(run.steps, p, title_note=tn))
        figs.draw("learning_rates.png", lambda p: plot_learning_rates(run.steps, p, title_note=tn))
        body.append(_figure_or_note(figs, "loss_terms.png", "The loss and each of its terms (unweighted) per step, "
                                    "with a moving average (thick) on longer runs; grey lines separate epochs.",
                                    "No loss column in steps.csv."))
        body.append(_figure_or_note(figs, "learning_rates.png", "Learning rate of each parameter group per step.",
                                    "No lr/... column in steps.csv."))
    if run.evaluations:
        best = run.best_epoch()
        figs.draw("metrics_per_eval.png",
                  lambda p: plot_metric_history(run.evaluations, p, best_epoch=best, title_note=tn))
        body.append(_figure_or_note(figs, "metrics_per_eval.png", "Metrics at each evaluation (epoch 0: untrained).",
                                    "The metrics could not be drawn."))
    else:
        body.append(note("No evaluation recorded: no metric curve."))
    return section("Training curves", "\n".join(body), anchor="training-curves")


def _retrieval_section(run: RunFolder, figs: _Figures) -> str:
    levels = list((run.report.get("data") or {}).get("level_names") or [])
    coarsest = levels[-1] if len(levels) > 1 else "coarsest level"
    grid = "Top-k results of sampled queries with the final model. Frame colours: green = same finest class, " \
           "orange = shares only a coarser label level (darker: more levels shared), red = unrelated."
    emb = (("t-SNE map of the gallery embeddings; left: coloured by the finest class, right: by the "
            f"coarsest level ({coarsest}).") if len(levels) > 1
           else "t-SNE map of the gallery embeddings, coloured by class.")
    missing = "Not in figures/ (figures were off, or the run ended before them)."
    body = [_figure_or_note(figs, "retrieval_grid.png", grid, f"No retrieval grid. {missing}"),
            _figure_or_note(figs, "pr_curves.png", "Mean interpolated precision–recall curves, one per label level "
                            "(positives: same label at that level or "
                            "finer).", f"No precision–recall curves. {missing}"),
            _figure_or_note(figs, "embedding_map.png", emb, f"No embedding map. {missing}")]
    return section("Retrieval", "\n".join(body), anchor="retrieval")


def _ap_level_section(run: RunFolder, figs: _Figures) -> str:
    from rankopt.viz import plot_ap_per_level  # matplotlib (slow import): only when the figure is drawn

    title, anchor = "AP per label level", "ap-per-level"
    level_names = list((run.report.get("data") or {}).get("level_names") or [])
    records = run.evaluations
    keys = sorted({int(k.removeprefix("ap@level")) for r in records for k in r
                   if k.startswith("ap@level") and k.removeprefix("ap@level").isdigit()})
    if len(level_names) == 1 or (not level_names and keys == [0]):
        return section(title, note("Flat labels (one level): AP per level is the plain AP."), anchor=anchor)
    if not records or not keys:
        return section(title, note("No ap@level{c} metric was computed: add ap@level0, ap@level1, ... to "
                                   "eval.metrics to see how each level of the hierarchy is retrieved."), anchor=anchor)
    names = [level_names[c] if c < len(level_names) else f"level {c}" for c in keys]
    values = {column_title(r, run, None): [r.get(f"ap@level{c}", math.nan) for c in keys]
              for r in ([records[0], records[-1]] if len(records) > 1 else records)}
    figs.draw("ap_per_level.png", lambda p: plot_ap_per_level(values, names, p, title_note=_note_text(run)))
    body = _figure_or_note(figs, "ap_per_level.png", "AP with the positives defined at each label level "
                           "(level 0: same finest class), untrained and last evaluation.", "AP per level not drawn.")
    return section(title, body, anchor=anchor)


def _surrogate_section(run: RunFolder, figs: _Figures) -> str:
    from rankopt.viz import plot_surrogates  # matplotlib (slow import): only when the figure is drawn

    loss = run.report.get("loss") or {}
    name = loss.get("name") or run.setting("loss.name")
    title, anchor = "Step function and the loss's surrogate", "surrogate"
    if not name:
        return section(title, note("The loss is unknown (no report.json or config.yaml loss)."), anchor=anchor)
    spec = surrogates_for(str(name), loss.get("kwargs", run.setting("loss.kwargs")) or {})
    d_range, band, median = _quantile_summary(run.steps)
    figs.draw("surrogates.png", lambda p: plot_surrogates(
        spec.surrogates, p, d_range=d_range, band=band, median=median, zoom=spec.zoom, y_max=spec.y_max,
        title=f"rank(j) = 1 + Σ_k H(s_k − s_j): the step H and its surrogate in {name}", title_note=_note_text(run)))
    if band is None:
        where = note("steps.csv has no score-difference columns (diff/q01 ... diff/q99): the x axis shows [−1, 1] "
                     "instead of the differences met in training.")
    else:
        where = note(f"Score differences in training (median over steps of each batch's quantiles): 5–95% in "
                     f"[{band[0]:.3g}, {band[1]:.3g}], median {median:.3g}; x axis from the smallest 1% to the "
                     f"largest 99% quantile of any step.")
    body = [Raw(f"<p>{escape(spec.description)}</p>"), where,
            _figure_or_note(figs, "surrogates.png", "Shaded: where the differences d = s_k − s_j of training fall.",
                            "The surrogate figure could not be drawn.")]
    return section(title, "\n".join(body), anchor=anchor)


def _footer(run: RunFolder) -> str:
    files = (REPORT_JSON, METRICS_CSV, METRICS_JSON, STEPS_CSV, CONFIG_YAML, RUN_JSON)
    items = [link(f, f) if (run.path / f).is_file() else Raw(f"{escape(f)} (absent)") for f in files]
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return Raw(f"<footer>rankopt {escape(__version__)} · page generated {when} from the run folder "
               f"{code(str(run.path))} · files: {' · '.join(items)}</footer>")


def _update_report_json(run: RunFolder, drawn: Sequence[Path]) -> None:
    """Add the figures drawn to ``report.json``'s ``figures`` list, keeping every key (atomic write)."""
    path = run.path / REPORT_JSON
    if not path.is_file():
        return
    report = dict(run.report)
    figures = list(report.get("figures") or [])
    known = {Path(f).name for f in figures}
    figures += [str(p) for p in drawn if p.name not in known]
    if figures != report.get("figures"):
        report["figures"] = figures
        write_page(path, json.dumps(report, indent=2))


def write_run_report(run_dir: str | os.PathLike[str]) -> Path:
    """Draw the training diagnostics into ``RUN/figures`` and write ``RUN/report.html``;
    returns the page's path. See the module docstring for what is read."""
    run = read_run(run_dir)
    figs = _Figures(run, [], {})
    sections = [what_was_run(run), metrics_section(run), _training_section(run, figs), _retrieval_section(run, figs),
                _ap_level_section(run, figs), _surrogate_section(run, figs)]
    sections = [part for part in sections if part is not None]
    if run.synthetic:
        sections.insert(0, note("SYNTHETIC data: rankopt's generated shapes. The numbers show that training works, "
                                "not how a method ranks on a benchmark.", warning=True))
    name = run.report.get("name") or run.setting("name") or run.path.name
    dataset = run.report.get("dataset") or run.setting("data.name") or "?"
    subtitle = f"{run.kind} run on {dataset}{' (SYNTHETIC data)' if run.synthetic else ''} · folder {run.path.name}"
    html_text = page(f"rankopt run: {name}", [*sections, _footer(run)], subtitle=subtitle)
    _update_report_json(run, figs.drawn)
    return write_page(run.path / REPORT_HTML, html_text)
