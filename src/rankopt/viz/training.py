"""Training diagnostics of a run: loss terms and learning rates per step, metrics per
evaluation, AP per hierarchy level, and the step function a rank loss replaces with its surrogate.

``steps`` arguments are the columns of a run's ``steps.csv`` as ``{column: (n,) float array}``
(``step``, ``epoch``, ``loss``, ``term/<name>``, ``lr/<group>``, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator

from rankopt.viz._common import new_figure, note_few_points, save_figure, titled
from rankopt.viz.curves import _history_series

PANEL = (4.6, 3.4)
"""Size of one small panel (inches); loss terms get one panel each, up to three per row."""
WIDE = (8.0, 4.2)
"""Size of the one-panel figures (learning rates, metrics, AP per level)."""
_MAX_COLUMNS = 3
Steps = Mapping[str, np.ndarray]


def moving_average(values: np.ndarray, window: int) -> np.ndarray:
    """Centred moving average over ``window`` values (shrinking at the ends), ignoring NaNs."""
    y = np.asarray(values, dtype=float)
    finite = np.isfinite(y)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, y, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    idx = np.arange(y.size)
    lo = np.clip(idx - window // 2, 0, y.size)
    hi = np.clip(idx + (window - 1) // 2 + 1, 0, y.size)
    n = counts[hi] - counts[lo]
    return np.where(n > 0, (sums[hi] - sums[lo]) / np.maximum(n, 1), np.nan)


def _x_steps(steps: Steps) -> np.ndarray:
    if "step" in steps:
        return np.asarray(steps["step"], dtype=float)
    return np.arange(1, len(next(iter(steps.values()))) + 1, dtype=float)


def _epoch_boundaries(ax: Axes, steps: Steps) -> None:
    """Integer step ticks, and light vertical lines where the ``epoch`` column changes."""
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if "epoch" not in steps:
        return
    epoch, x = np.asarray(steps["epoch"], dtype=float), _x_steps(steps)
    for i in np.flatnonzero(np.diff(epoch) != 0):
        ax.axvline(0.5 * (x[i] + x[i + 1]), color="0.75", linewidth=0.7, zorder=0)


def loss_columns(steps: Steps) -> list[str]:
    """``loss`` then every ``term/...`` column holding a finite value."""
    names = (["loss"] if "loss" in steps else []) + [k for k in steps if k.startswith("term/")]
    return [k for k in names if np.isfinite(np.asarray(steps[k], dtype=float)).any()]


def plot_loss_terms(steps: Steps, out_path: str | Path, *, title_note: str | None = None) -> Path:
    """One panel per loss column (:func:`loss_columns`): the raw value per step as a thin line
    and, on runs of 36 steps or more, its moving average (window: 1/12 of the run) as a thick
    one; epochs are marked."""
    names = loss_columns(steps)
    if not names:
        raise ValueError("steps has no loss or term/... column with a finite value")
    x = _x_steps(steps)
    window = x.size // 12  # a moving average from 36 steps on (window >= 3)
    cols = min(len(names), _MAX_COLUMNS)
    rows = -(-len(names) // cols)
    fig = new_figure(PANEL[0] * cols, PANEL[1] * rows + 0.4)
    axes = fig.subplots(rows, cols, squeeze=False).flatten()
    for i, (ax, name) in enumerate(zip(axes, names)):
        y = np.asarray(steps[name], dtype=float)
        colour = f"C{i}"
        if window >= 3:
            ax.plot(x, y, color=colour, linewidth=0.6, alpha=0.35, label="per step")
            ax.plot(x, moving_average(y, window), color=colour, linewidth=2.0, label=f"moving average ({window} steps)")
        else:
            ax.plot(x, y, color=colour, linewidth=1.5, marker="o", markersize=3, label="per step")
        _epoch_boundaries(ax, steps)
        ax.set_title("total loss" if name == "loss" else f"term {name.removeprefix('term/')} (unweighted)", fontsize=11)
        ax.set_xlabel("step", fontsize=10)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=9)
        if i == 0:
            ax.legend(fontsize=8, loc="best")
    for ax in axes[len(names):]:
        ax.set_visible(False)
    fig.suptitle(titled("Loss per training step", title_note, max_chars=None), fontsize=12)
    fig.tight_layout()
    return save_figure(fig, out_path)


def plot_learning_rates(steps: Steps, out_path: str | Path, *, title_note: str | None = None) -> Path:
    """Every ``lr/<group>`` column against the step (log axis when they span >= 2 decades)."""
    names = [k for k in steps if k.startswith("lr/")]
    if not names:
        raise ValueError("steps has no lr/... column")
    x = _x_steps(steps)
    fig = new_figure(*WIDE)
    ax = fig.add_subplot()
    styles = ("-", "--", ":", "-.")
    for i, name in enumerate(names):
        ax.plot(x, np.asarray(steps[name], dtype=float), linestyle=styles[i % len(styles)], linewidth=1.8,
                label=name.removeprefix("lr/"))
    values = np.concatenate([np.asarray(steps[k], dtype=float) for k in names])
    positive = values[np.isfinite(values) & (values > 0)]
    if positive.size and positive.max() / positive.min() >= 100:
        ax.set_yscale("log")
    _epoch_boundaries(ax, steps)
    ax.set(xlabel="step", ylabel="learning rate")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, title="parameter group", title_fontsize=8)
    ax.set_title(titled("Learning rate per step", title_note), fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_path)


def plot_metric_history(history: Sequence[Mapping[str, object]], out_path: str | Path, *,
                        best_epoch: int | None = None, title_note: str | None = None) -> Path:
    """The metrics of each evaluation (``metrics.json`` records; epoch 0 = untrained) against
    the epoch, the best epoch marked, a note when a metric has fewer than ``MIN_CURVE_POINTS`` evaluations.
    Loss, learning-rate and bookkeeping keys are left out."""
    x, xlabel, series = _history_series(history)
    metrics = {k: v for k, v in series.items() if "loss" not in k.lower() and not k.lower().startswith("lr")}
    if not metrics:
        raise ValueError("history has no metric to plot")
    fig = new_figure(*WIDE)
    ax = fig.add_subplot()
    markers = "osD^vP*Xh"
    for i, (name, values) in enumerate(metrics.items()):
        ax.plot(x, values, marker=markers[i % len(markers)], markersize=4, linewidth=1.6, label=name)
    if best_epoch is not None:
        ax.axvline(best_epoch, color="0.4", linestyle=":", linewidth=1.2, label=f"best (epoch {best_epoch})")
    ax.set(xlabel=xlabel, ylabel="metric value")
    note_few_points(ax, min(int(np.isfinite(v).sum()) for v in metrics.values()))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title(titled("Metrics per evaluation (epoch 0 = untrained)", title_note), fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_path)


def plot_ap_per_level(values: Mapping[str, Sequence[float]], level_names: Sequence[str], out_path: str | Path, *,
                      title_note: str | None = None) -> Path:
    """Grouped bars: AP at each label level (finest first), one bar per model (e.g.
    ``{"untrained": [...], "trained": [...]}``), each bar labelled with its value."""
    if not values:
        raise ValueError("values is empty: nothing to plot")
    n = len(level_names)
    bad = [name for name, v in values.items() if len(v) != n]
    if bad:
        raise ValueError(f"values {bad} do not have one entry per level ({n} levels: {list(level_names)})")
    fig = new_figure(*WIDE)
    ax = fig.add_subplot()
    width = 0.8 / len(values)
    positions = np.arange(n)
    for i, (name, v) in enumerate(values.items()):
        bars = ax.bar(positions + (i - (len(values) - 1) / 2) * width, np.asarray(v, dtype=float), width, label=name,
                      color=f"C{i}")
        ax.bar_label(bars, fmt="%.3f", fontsize=8, padding=2)
    ax.set_xticks(positions, [f"{name}\n(level {c})" for c, name in enumerate(level_names)])
    ax.set(ylabel="AP", ylim=(0, 1.08))
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    ax.set_title(titled("AP per label level (positives: same label at that level)", title_note), fontsize=10)
    fig.tight_layout()
    return save_figure(fig, out_path)


@dataclass(frozen=True)
class Surrogate:
    """A function of the score difference ``d`` drawn next to the Heaviside step."""

    label: str
    function: Callable[[np.ndarray], np.ndarray]
    linestyle: str = "-"


def _draw_steps(ax: Axes, surrogates: Sequence[Surrogate], lo: float, hi: float, y_max: float,
                band: tuple[float, float] | None, median: float | None) -> bool:
    """One panel over ``[lo, hi]``; returns whether a surrogate was clipped at ``y_max``."""
    d = np.linspace(lo, hi, 2001)
    if band is not None:
        ax.axvspan(*band, color="C0", alpha=0.10, label="5–95% of d in training")
    if median is not None:
        ax.axvline(median, color="C0", linestyle="--", linewidth=1.0, label=f"median d = {median:.3g}")
    ax.plot(d, (d >= 0).astype(float), color="black", linewidth=1.4, drawstyle="steps-post", label="step H(d)")
    clipped = False
    for i, s in enumerate(surrogates):
        y = np.asarray(s.function(d), dtype=float)
        clipped |= bool(np.nanmax(y) > y_max)
        ax.plot(d, np.minimum(y, y_max), color=f"C{i + 1}", linestyle=s.linestyle, linewidth=1.8, label=s.label)
    ax.set_xlim(lo, hi)
    ax.set_ylim(-0.08, y_max + 0.08)
    ax.grid(alpha=0.3)
    ax.set_xlabel("d = s_k − s_j  (other item minus positive)", fontsize=9)
    ax.tick_params(labelsize=8)
    return clipped


def plot_surrogates(surrogates: Sequence[Surrogate], out_path: str | Path, *, d_range: tuple[float, float],
                    band: tuple[float, float] | None = None, median: float | None = None, zoom: float | None = None,
                    y_max: float = 1.1, title: str = "Step function and surrogate",
                    title_note: str | None = None) -> Path:
    """The Heaviside step ``H(d)`` and ``surrogates`` over ``d_range`` (the differences met in
    training: ``band`` shaded, ``median`` marked), plus a panel over ``[-zoom, zoom]`` when given.
    Values above ``y_max`` are clipped (said in the panel)."""
    lo, hi = (float(v) for v in d_range)
    if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"d_range must be finite with lo < hi, got {d_range}")
    panels = [(lo, hi, "over the differences met in training")]
    if zoom is not None:
        panels.append((-zoom, zoom, f"zoom on |d| ≤ {zoom:.3g}"))
    fig = new_figure(max(8.0, 6.0 * len(panels)), 5.2)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for i, (ax, (a, b, what)) in enumerate(zip(axes, panels)):
        clipped = _draw_steps(ax, surrogates, a, b, y_max, band, median)
        ax.set_title(what, fontsize=10)
        if clipped:
            ax.text(0.02, 0.97, f"values above {y_max:g} clipped", transform=ax.transAxes, fontsize=8,
                    va="top", color="0.35")
        if i == 0:
            ax.set_ylabel("contribution to rank(j)", fontsize=9)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2 if len(labels) > 2 else len(labels), fontsize=9,
               frameon=False)
    fig.suptitle(titled(title, title_note, max_chars=None), fontsize=11)
    rows = -(-len(labels) // 2)
    fig.tight_layout(rect=(0, (0.25 + 0.22 * rows) / fig.get_figheight(), 1, 1))
    return save_figure(fig, out_path)
