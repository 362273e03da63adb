"""Analysis plots: decomposability gap vs batch size (ROADMAP Eq. 6 and Fig. 5; TPAMI
§III-C and Fig. 6) and hyper-parameter sweeps (ROADMAP Fig. 4; TPAMI Figs. 7-8)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from rankopt.viz._common import new_figure, save_figure, titled

ANALYSIS_INCHES = (6.0, 4.5)


def _x_values(name: str, values: Sequence[float]) -> list[float]:
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError(f"{name} is empty: nothing to plot")
    if not all(math.isfinite(v) for v in xs):
        raise ValueError(f"{name} must be finite, got {xs}")
    return xs


def _lines(xs: list[float], series: Mapping[str, Sequence[float]], what: str) -> tuple[Figure, Axes]:
    """A one-panel figure with one marked line per series (each as long as ``xs``)."""
    if not series:
        raise ValueError(f"{what} is empty: nothing to plot")
    fig = new_figure(*ANALYSIS_INCHES)
    ax = fig.add_subplot()
    for name, ys in series.items():
        values = [float(v) for v in ys]
        if len(values) != len(xs):
            raise ValueError(f"{what}[{name!r}] has {len(values)} values but there are {len(xs)} x values")
        ax.plot(xs, values, marker="o", label=name)
    return fig, ax


def _finish(fig: Figure, ax: Axes, title: str, out_path: str | Path) -> Path:
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out_path)


def _set_scale(ax: Axes, xs: list[float], log_x: bool | None) -> None:
    """Log x axis when asked, or by default when the positive values span >= 2 decades
    (symlog when 0 is among them, e.g. rho = 0)."""
    positive = [v for v in xs if v > 0]
    if log_x is None:
        log_x = len(positive) >= 2 and min(v for v in xs) >= 0 and max(positive) / min(positive) >= 100
    if not log_x:
        return
    if min(xs) > 0:
        ax.set_xscale("log")
    elif min(xs) == 0 and positive:
        ax.set_xscale("symlog", linthresh=min(positive))
        ax.set_xlim(left=-0.2 * min(positive))
    else:
        raise ValueError(f"log_x needs non-negative x values, got {xs}")


def plot_decomposability_gap(
    batch_sizes: Sequence[int],
    gaps: Sequence[float] | Mapping[str, Sequence[float]],
    out_path: str | Path,
    *,
    metric: str = "AP",
    title_note: str | None = None,
) -> Path:
    """Decomposability gap ``DG = (1/K) sum_b AP^b - AP`` (ROADMAP Eq. 6) against the batch
    size on a log2 axis; ``gaps`` is one series or ``{name: series}`` (e.g. one per model)."""
    xs = _x_values("batch_sizes", batch_sizes)
    if min(xs) <= 0:
        raise ValueError(f"batch_sizes must be positive, got {xs}")
    fig, ax = _lines(xs, gaps if isinstance(gaps, Mapping) else {f"DG {metric}": gaps}, "gaps")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [f"{v:g}" for v in xs])
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set(xlabel="batch size B", ylabel=f"DG$_{{{metric}}}$ = mean batch {metric} - global {metric}")
    return _finish(fig, ax, titled(f"Decomposability gap of {metric} vs batch size", title_note), out_path)


def plot_sweep(
    param_name: str,
    values: Sequence[float],
    metrics: Mapping[str, Sequence[float]],
    out_path: str | Path,
    *,
    baselines: Mapping[str, float] | None = None,
    log_x: bool | None = None,
    title_note: str | None = None,
) -> Path:
    """One line per metric against a hyper-parameter (tau, rho, delta, lambda, alpha, batch
    size, ...); ``baselines`` are drawn as dashed horizontal lines (e.g. the loss without
    the decomposability term). ``log_x=None`` picks a log axis when values span >= 2 decades."""
    xs = _x_values("values", values)
    fig, ax = _lines(xs, metrics, "metrics")
    for i, (name, value) in enumerate((baselines or {}).items()):
        ax.axhline(float(value), linestyle="--", color=f"C{len(metrics) + i}", label=f"{name} (baseline)")
    _set_scale(ax, xs, log_x)
    ax.set(xlabel=param_name, ylabel="metric")
    return _finish(fig, ax, titled(f"Sensitivity to {param_name}", title_note), out_path)
