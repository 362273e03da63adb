"""Analysis plots: decomposability gap vs batch size (ROADMAP Eq. 6 and Fig. 5; TPAMI
§III-C and Fig. 6), hyper-parameter sweeps (ROADMAP Fig. 4; TPAMI Figs. 7-8), the AP
approximation error of surrogates during training (Smooth-AP Fig. 4) and the fraction of score
differences in the sigmoid's operating region vs batch size (Smooth-AP supp. Fig. S7)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from rankopt.viz._common import new_figure, save_figure, titled

ANALYSIS_INCHES = (6.0, 4.5)


def _x_values(name: str, values: Sequence[float]) -> list[float]:
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError(f"{name} is empty: nothing to plot")
    if not all(math.isfinite(v) for v in xs):
        raise ValueError(f"{name} must be finite, got {xs}")
    return xs


def _values(what: str, name: str, values: Sequence[float], count: int) -> list[float]:
    out = [float(v) for v in values]
    if len(out) != count:
        raise ValueError(f"{what}[{name!r}] has {len(out)} values but there are {count} x values")
    return out


def _lines(
    xs: list[float],
    series: Mapping[str, Sequence[float]],
    what: str,
    *,
    errors: Mapping[str, Sequence[float]] | None = None,
    styles: Mapping[str, Mapping[str, Any]] | None = None,
) -> tuple[Figure, Axes]:
    """A one-panel figure with one marked line per series (each as long as ``xs``); ``errors``
    gives a series ± error bars (e.g. the std over seeds; NaN: no bar), ``styles`` extra
    ``Axes.plot`` keywords per series."""
    if not series:
        raise ValueError(f"{what} is empty: nothing to plot")
    fig = new_figure(*ANALYSIS_INCHES)
    ax = fig.add_subplot()
    for name, ys in series.items():
        values = _values(what, name, ys, len(xs))
        style = {"marker": "o", **(styles or {}).get(name, {})}
        if errors is not None and name in errors:
            spread = [0.0 if math.isnan(e) else e for e in _values("errors", name, errors[name], len(xs))]
            ax.errorbar(xs, values, yerr=spread, capsize=3, label=name, **style)
        else:
            ax.plot(xs, values, label=name, **style)
    return fig, ax


def _finish(fig: Figure, ax: Axes, title: str, out_path: str | Path) -> Path:
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out_path)


def _set_scale(ax: Axes, xs: list[float], log_x: bool | None) -> None:
    """Log x axis when asked, or by default when the positive values span >= 2 decades
    (symlog when 0 is among them, e.g. rho = 0), ticked at the values."""
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
    _ticks_at(ax, xs)


def _ticks_at(ax: Axes, xs: list[float]) -> None:
    """x ticks at the values only (no minor ticks or labels in between)."""
    ax.set_xticks(xs, [f"{v:g}" for v in xs])
    ax.xaxis.set_minor_locator(NullLocator())


def _batch_sizes(batch_sizes: Sequence[int]) -> list[float]:
    xs = _x_values("batch_sizes", batch_sizes)
    if min(xs) <= 0:
        raise ValueError(f"batch_sizes must be positive, got {xs}")
    return xs


def _batch_axis(ax: Axes, xs: list[float]) -> None:
    """Batch sizes on a log2 axis, ticked at the values."""
    ax.set_xscale("log", base=2)
    _ticks_at(ax, xs)


def plot_decomposability_gap(
    batch_sizes: Sequence[int],
    gaps: Sequence[float] | Mapping[str, Sequence[float]],
    out_path: str | Path,
    *,
    metric: str = "AP",
    errors: Mapping[str, Sequence[float]] | None = None,
    title_note: str | None = None,
) -> Path:
    """Decomposability gap ``DG = (1/K) sum_b AP^b - AP`` (ROADMAP Eq. 6) against the batch
    size on a log2 axis; ``gaps`` is one series or ``{name: series}`` (e.g. one per model),
    ``errors`` optional ± bars per named series (e.g. the std over seeds)."""
    xs = _batch_sizes(batch_sizes)
    fig, ax = _lines(xs, gaps if isinstance(gaps, Mapping) else {f"DG {metric}": gaps}, "gaps", errors=errors)
    _batch_axis(ax, xs)
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
    errors: Mapping[str, Sequence[float]] | None = None,
    ylabel: str = "metric",
    title_note: str | None = None,
) -> Path:
    """One line per metric against a hyper-parameter (tau, rho, delta, lambda, alpha, batch
    size, ...); ``baselines`` are drawn as dashed horizontal lines (e.g. the loss without
    the decomposability term), ``errors`` as ± bars (e.g. the std over seeds).
    ``log_x=None`` picks a log axis when values span >= 2 decades."""
    xs = _x_values("values", values)
    fig, ax = _lines(xs, metrics, "metrics", errors=errors)
    for i, (name, value) in enumerate((baselines or {}).items()):
        ax.axhline(float(value), linestyle="--", color=f"C{len(metrics) + i}", label=f"{name} (baseline)")
    _set_scale(ax, xs, log_x)
    ax.set(xlabel=param_name, ylabel=ylabel)
    return _finish(fig, ax, titled(f"Sensitivity to {param_name}", title_note), out_path)


def plot_approximation_error(
    steps: Sequence[float],
    errors: Mapping[str, Sequence[float]],
    out_path: str | Path,
    *,
    title_note: str | None = None,
) -> Path:
    """The AP approximation error ``AP_e = |AP_pred - AP|`` (Smooth-AP Eq. 8) of each surrogate
    against the training step, on a log y axis (Smooth-AP Fig. 4); ``errors`` is ``{surrogate: series}``."""
    xs = _x_values("steps", steps)
    fig, ax = _lines(xs, errors, "errors", styles=dict.fromkeys(errors, {"marker": "." if len(xs) > 30 else "o"}))
    ax.set_yscale("log")
    ax.set(xlabel="training step", ylabel="|AP$_{pred}$ - AP| on the batch")
    return _finish(fig, ax, titled("AP approximation error during training", title_note), out_path)


def plot_operating_region(
    batch_sizes: Sequence[int],
    fractions: Mapping[str, Mapping[str, Sequence[float]]],
    out_path: str | Path,
    *,
    title_note: str | None = None,
) -> Path:
    """Fraction of score differences ``|d| < delta(tau)`` (the sigmoid's operating region) against
    the batch size (Smooth-AP supp. Fig. S7a). ``fractions`` is ``{model: {tau label: series}}``:
    one colour per temperature, one line style per model (e.g. untrained dashed, trained solid)."""
    xs = _batch_sizes(batch_sizes)
    dashes = ("-", "--", ":", "-.")
    series: dict[str, Sequence[float]] = {}
    styles: dict[str, dict[str, Any]] = {}
    for m, (model, by_tau) in enumerate(fractions.items()):
        for t, (tau, ys) in enumerate(by_tau.items()):
            series[f"{model}, {tau}"] = ys
            styles[f"{model}, {tau}"] = {"color": f"C{t}", "linestyle": dashes[m % len(dashes)]}
    fig, ax = _lines(xs, series, "fractions", styles=styles)
    _batch_axis(ax, xs)
    ax.set_yscale("log")
    ax.set(xlabel="batch size B", ylabel="fraction of differences with |d| < δ(τ)")
    return _finish(fig, ax, titled("Score differences in the sigmoid's operating region", title_note), out_path)
