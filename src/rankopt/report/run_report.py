"""``RUN/report.html``: the page a person reads about one run, built from the run folder alone.

Reads ``config.yaml``, ``run.json``, ``report.json``, ``metrics.json``, ``steps.csv`` and the
figures already in ``figures/``; draws the training diagnostics (``loss_terms.png``,
``learning_rates.png``, ``metrics_per_eval.png``, ``ap_per_level.png``, ``surrogates.png``)
with :mod:`rankopt.viz`; never loads a model. Any missing piece (older runs, ``rankopt
evaluate`` runs, flat labels, a run stopped before its first evaluation) leaves a note in its
section instead of failing.
"""

from __future__ import annotations

import csv
import inspect
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from rankopt import __version__
from rankopt.report.html import (
    Raw,
    code,
    columns,
    escape,
    figure,
    key_values,
    link,
    note,
    page,
    section,
    table,
    write_page,
)

if TYPE_CHECKING:
    from rankopt.viz import Surrogate

__all__ = ["RunFolder", "SurrogateSpec", "read_run", "surrogates_for", "write_run_report"]

REPORT_HTML = "report.html"
FIGURES = "figures"
_RUN_FILES = ("config.yaml", "run.json", "report.json", "metrics.json", "steps.csv")
_NOT_METRICS = ("epoch", "step", "loss")
_SIGMOID_LOSSES = ("smooth_ap", "smooth_recall")
_SUPRANK_LOSSES = ("sup_ap", "roadmap", "rod_ap", "sup_recall", "rod_recall", "hap", "happier", "sup_ndcg", "rod_ndcg")
_BINNING_LOSSES = ("fastap", "softbin_ap")


# ---------------------------------------------------------------- reading the run folder

@dataclass
class RunFolder:
    """What a run folder holds; absent files give empty values (``steps`` None)."""

    path: Path
    config: dict[str, Any]
    run: dict[str, Any]
    report: dict[str, Any]
    history: list[dict[str, Any]]
    steps: dict[str, np.ndarray] | None

    def setting(self, key: str, default: Any = None) -> Any:
        """The config value at dotted ``key`` (e.g. ``optim.lr``), ``default`` when absent."""
        node: Any = self.config
        for part in key.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def kind(self) -> str:
        return str(self.report.get("kind", "train"))

    @property
    def synthetic(self) -> bool:
        return "synthetic" in (self.report.get("dataset"), self.setting("data.name"), self.setting("data.eval_name"))

    @property
    def evaluations(self) -> list[dict[str, Any]]:
        """The evaluation records with at least one metric."""
        return [r for r in self.history if _metric_names([r])]

    def best_epoch(self) -> int | None:
        """``report.json`` ``best.epoch``, else the trained epoch maximising ``train.best_metric``
        (None for ``rankopt evaluate`` runs)."""
        if self.kind == "evaluate":
            return None
        best = self.report.get("best") or {}
        if isinstance(best.get("epoch"), int):
            return int(best["epoch"])
        key = self.setting("train.best_metric")
        scored = [(r[key], int(r["epoch"])) for r in self.evaluations
                  if r.get("epoch", 0) > 0 and _finite(r.get(key))]
        return max(scored)[1] if scored else None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _read_structured(path: Path, kind: type) -> Any:
    """Parse a JSON/YAML file that must hold a ``kind``; ValueError naming the file otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (UnicodeDecodeError, ValueError, yaml.YAMLError) as err:
        raise ValueError(f"{path} is not valid {path.suffix[1:].upper()}: {err}") from None
    if not isinstance(data, kind):
        raise ValueError(f"{path} must hold a {kind.__name__}, got {type(data).__name__}")
    return data


def _read_steps(path: Path) -> dict[str, np.ndarray] | None:
    """``steps.csv`` as ``{column: float array}`` (empty cells NaN); None when it has no row."""
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        rows = list(reader)
        header = reader.fieldnames or []
    if not rows:
        return None
    columns_: dict[str, np.ndarray] = {}
    for name in header:
        try:
            columns_[name] = np.array([float(r[name]) if r.get(name) not in ("", None) else math.nan for r in rows])
        except ValueError:
            raise ValueError(f"{path}: column {name!r} holds a non-number") from None
    return columns_


def read_run(run_dir: str | os.PathLike[str]) -> RunFolder:
    """Read a run folder. FileNotFoundError when it does not exist, ValueError when it holds
    none of the run files or when one of them is corrupt (the error names the file)."""
    path = Path(run_dir)
    if not path.exists():
        raise FileNotFoundError(f"run folder {path} does not exist")
    if not path.is_dir():
        raise ValueError(f"{path} is not a folder (expected a run folder)")
    if not any((path / name).is_file() for name in _RUN_FILES):
        raise ValueError(f"{path} is not a rankopt run folder: it has none of {', '.join(_RUN_FILES)}")

    def structured(name: str, kind: type) -> Any:
        file = path / name
        return _read_structured(file, kind) if file.is_file() else kind()

    history = structured("metrics.json", list)
    bad = [i for i, r in enumerate(history) if not isinstance(r, dict)]
    if bad:
        raise ValueError(f"{path / 'metrics.json'}: record {bad[0]} is not an object")
    steps_file = path / "steps.csv"
    return RunFolder(path, structured("config.yaml", dict) or {}, structured("run.json", dict),
                     structured("report.json", dict), history, _read_steps(steps_file) if steps_file.is_file() else None)


def _metric_names(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """Metric keys of evaluation records, in first-seen order (no bookkeeping, loss, lr or counts)."""
    return list(dict.fromkeys(k for r in records for k, v in r.items()
                              if k not in _NOT_METRICS and not k.startswith(("num_", "lr_")) and _finite(v)))


# ---------------------------------------------------------------- the loss's step surrogate

@dataclass(frozen=True)
class SurrogateSpec:
    """How a loss replaces the step ``H(d)``: the curves to draw and a sentence saying what they are."""

    surrogates: list[Surrogate]
    description: str
    zoom: float | None
    y_max: float = 1.1


def _defaults(*factories: Callable[..., Any]) -> dict[str, Any]:
    """Keyword defaults of the factories' signatures (classes: every ``__init__`` of the MRO); first wins."""
    out: dict[str, Any] = {}
    for factory in factories:
        inits = [c.__dict__["__init__"] for c in factory.__mro__ if "__init__" in c.__dict__] \
            if isinstance(factory, type) else [factory]
        for init in inits:
            for p in inspect.signature(init).parameters.values():
                if p.default is not inspect.Parameter.empty:
                    out.setdefault(p.name, p.default)
    return out


def _soft_binning_step(num_bins: int, lo: float, hi: float) -> Callable[[np.ndarray], np.ndarray]:
    """Weight with which an item at ``s_j + d`` counts in the binned rank of a positive at
    ``s_j`` (``sum_m c_j(m) * sum_{m' <= m} c_k(m')``, the kernels of
    :func:`rankopt.losses.histogram_ap.soft_histograms`), averaged over ``s_j`` across one bin."""
    import torch

    from rankopt.losses.histogram_ap import soft_histograms

    width = (hi - lo) / (num_bins - 1)
    centre = hi - width * ((num_bins - 1) // 2)
    offsets = torch.linspace(0.0, width, 17, dtype=torch.float64)[:-1]

    def step(d: np.ndarray) -> np.ndarray:
        dd = torch.as_tensor(d, dtype=torch.float64)
        sj = (centre - offsets).repeat_interleave(dd.numel())
        sk = sj + dd.repeat(offsets.numel())
        scores = torch.stack([sj, sk], dim=1)
        positives = torch.tensor([[True, False]]).expand_as(scores)
        hist, pos = soft_histograms(scores, torch.ones_like(positives), positives, lo, hi, num_bins)
        weight = (pos * (hist - pos).cumsum(dim=1)).sum(dim=1)
        return weight.view(offsets.numel(), -1).mean(dim=0).numpy()

    return step


def surrogates_for(name: str, kwargs: Mapping[str, Any]) -> SurrogateSpec:
    """The surrogate of the step function used by loss ``name`` with ``kwargs``; defaults
    are read from the signatures of the loss classes (rankopt.losses)."""
    import torch

    from rankopt import losses
    from rankopt.rank.surrogates import default_delta, heaviside, sup_step
    from rankopt.viz import Surrogate

    def torch_fn(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[np.ndarray], np.ndarray]:
        return lambda d: fn(torch.as_tensor(d, dtype=torch.float64)).numpy()

    factory = losses.LOSSES.get(name) if name in losses.LOSSES.names() else None
    if name in _SIGMOID_LOSSES:
        tau = float({**_defaults(factory), **kwargs}["tau"])
        curve = Surrogate(f"σ(d/τ), τ = {tau:g}", torch_fn(lambda d: torch.sigmoid(d / tau)))
        return SurrogateSpec([curve], f"{name} replaces H by the sigmoid σ(d/τ) in every term of the rank "
                             f"(τ = {tau:g}); its slope is non-negligible only for |d| < δ(τ) = "
                             f"{default_delta(tau):.3g}.", zoom=3 * default_delta(tau))
    if name in _SUPRANK_LOSSES:
        p = {**_defaults(losses.SupRankLoss), **kwargs}
        tau, rho, start = float(p["tau"]), float(p["rho"]), float(p["start"])
        delta = default_delta(tau) if p.get("delta") is None else float(p["delta"])
        curves = [Surrogate(f"rank⁻ (negatives): H⁻(d), τ={tau:g}, ρ={rho:g}, δ={delta:.3g}",
                            torch_fn(lambda d: sup_step(d, tau, rho, delta, start))),
                  Surrogate("rank⁺ (other positives): H(d) itself, no gradient", torch_fn(heaviside), ":")]
        return SurrogateSpec(curves, f"{name} ranks with SupRank (ROADMAP Eq. 4): the exact step for the other "
                             f"positives (rank⁺) and H⁻ for the negatives (rank⁻): a sigmoid of temperature "
                             f"τ = {tau:g} plus {start:g}·H(d) up to δ = {delta:.3g}, then a line of slope "
                             f"ρ = {rho:g}, so H⁻ ≥ H everywhere.", zoom=3 * delta, y_max=3.0)
    if name in _BINNING_LOSSES:
        p = {**_defaults(factory), **kwargs}
        bins = int(p["num_bins"]) + (1 if name == "fastap" else 0)
        lo, hi = (-1.0, 1.0) if name == "fastap" else (float(v) for v in p["score_range"])
        width = (hi - lo) / (bins - 1)
        curve = Surrogate(f"soft binning: {bins} triangular bins of width Δ = {width:.3g}",
                          _soft_binning_step(bins, lo, hi))
        return SurrogateSpec([curve], f"{name} does not rank items: it soft-assigns each score to {bins} triangular "
                             f"bins over [{lo:g}, {hi:g}] (half-width Δ = {width:.3g}) and counts the items of the "
                             "bins at or above a positive's bin. The curve is the weight with which an item counts "
                             "in a positive's rank, averaged over where the positive falls inside its bin.",
                             zoom=3 * width)
    if name == "blackbox_ap":
        margin = float({**_defaults(factory), **kwargs}["margin"])
        lam = float({**_defaults(factory), **kwargs}["lam"])
        curve = Surrogate(f"negatives: H(d + margin), margin = {margin:g}", torch_fn(lambda d: heaviside(d + margin)))
        return SurrogateSpec([curve], f"blackbox_ap keeps the exact, piecewise-constant step (on scores shifted by "
                             f"the margin {margin:g}); its gradient comes from the blackbox interpolation of the "
                             f"ranking (λ = {lam:g}), not from a smooth surrogate.", zoom=None)
    return SurrogateSpec([], f"{name} has no rank surrogate: it optimises pairwise, triplet or proxy terms on the "
                         "scores, never the step H(d) of the rank; the step alone is shown for reference.", zoom=None)


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
        return self.run.path / FIGURES

    def draw(self, name: str, plot: Callable[[Path], Path]) -> None:
        """``plot(path)``; on bad or empty data, the reason is kept and any older copy removed."""
        try:
            self.drawn.append(plot(self.folder / name))
        except (ValueError, TypeError) as err:
            self.problems[name] = str(err)
            (self.folder / name).unlink(missing_ok=True)


def _note_text(run: RunFolder) -> str | None:
    return "SYNTHETIC data" if run.synthetic else None


# ---------------------------------------------------------------- sections

def _fmt_seconds(seconds: Any) -> str | None:
    if not _finite(seconds):
        return None
    s = float(seconds)
    if s < 60:
        return f"{s:.1f} s"
    minutes, s = divmod(round(s), 60)
    return f"{minutes} min {s:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _throughput(run: RunFolder) -> float | None:
    value = run.report.get("images_per_second")
    if _finite(value):
        return float(value)
    steps = run.steps or {}
    if "images" in steps and "seconds" in steps and steps["seconds"][-1] > 0:
        return float(steps["images"][-1] / steps["seconds"][-1])
    return None


def _data_table(run: RunFolder) -> str:
    data = run.report.get("data") or {}
    levels = list(data.get("level_names") or [])
    splits = ([("train", data["train"])] if isinstance(data.get("train"), dict) else []) + \
        [(f"eval: {k}", v) for k, v in (data.get("eval") or {}).items() if isinstance(v, dict)]
    if not splits:
        return note("report.json has no per-split image and class counts (run from an older rankopt).")
    levels = levels or list(dict.fromkeys(k for _, s in splits for k in (s.get("classes") or {})))
    rows = [["images", *[s.get("images") for _, s in splits]]]
    rows += [[f"classes: {level}", *[(s.get("classes") or {}).get(level) for _, s in splits]] for level in levels]
    return table(["", *[split for split, _ in splits]], rows)


def _what_was_run(run: RunFolder) -> str:
    r, report, s = run.run, run.report, run.setting
    data, model, loss = report.get("data") or {}, report.get("model") or {}, report.get("loss") or {}
    overrides = r.get("overrides")
    asked = key_values([
        ("recipe", r.get("recipe") or s("name")),
        ("overrides", code(" ".join(overrides)) if overrides else "none"),
        ("command", code(r["command"]) if r.get("command") else None),
        ("kind", run.kind),
        ("started", r.get("started_utc")),
        ("description", s("description") or None),
    ])
    eval_name = data.get("eval_name") or s("data.eval_name") or data.get("name") or s("data.name")
    dataset = key_values([
        ("dataset", data.get("name") or report.get("dataset") or s("data.name")),
        ("root", data.get("root") or s("data.root") or ("rankopt's cache (generated)" if run.synthetic else None)),
        ("evaluated on", eval_name),
        ("label levels", ", ".join(data.get("level_names") or []) or None),
    ])
    model_kv = key_values([
        ("backbone", model.get("backbone") or s("model.backbone")),
        ("embedding dim", model.get("embedding_dim") or s("model.embedding_dim")),
        ("parameters", model.get("parameters")),
        ("pooling", s("model.pooling")),
        ("pretrained", s("model.pretrained")),
    ])
    loss_kwargs = loss.get("kwargs", s("loss.kwargs"))
    loss_kv = key_values([
        ("loss", loss.get("name") or s("loss.name")),
        ("kwargs", code(json.dumps(loss_kwargs)) if loss_kwargs else "none (the loss's defaults)"),
    ])
    schedule = s("schedule") or {}
    schedule_text = ", ".join(f"{k}={v}" for k, v in schedule.items() if v not in (None, [], 0, 0.0)) or None
    training = key_values([
        ("optimizer", s("optim.name")),
        ("learning rate", s("optim.lr")),
        ("weight decay", s("optim.weight_decay")),
        ("head lr multiplier", s("optim.head_lr_mult")),
        ("schedule", schedule_text),
        ("epochs", s("train.epochs")),
        ("batch size / m per class", f"{s('train.batch_size')} / {s('train.m')}" if s("train.batch_size") else None),
        ("sampler", s("train.sampler")),
        ("mixed precision", s("train.amp")),
        ("cross-batch memory", "on" if s("train.memory.enabled") else "off" if run.config else None),
        ("seed", s("train.seed")),
    ])
    machine = report.get("machine") or r.get("machine") or {}
    throughput = _throughput(run)
    timing = key_values([
        ("machine", machine.get("platform")),
        ("device", machine.get("device")),
        ("CPU cores / torch threads", f"{machine.get('cpu_count')} / {machine.get('torch_threads')}" if machine else None),
        ("torch / python", f"{machine.get('torch')} / {machine.get('python')}" if machine else None),
        ("wall time", _fmt_seconds(report.get("wall_seconds"))),
        ("training time", _fmt_seconds(report.get("train_seconds"))),
        ("steps / epochs done", f"{report.get('steps')} / {report.get('epochs')}" if "steps" in report else None),
        ("throughput", f"{throughput:,.0f} images/s" if throughput else None),
    ])
    body = [columns([f"<h3>Asked for</h3>{asked}", f"<h3>Model</h3>{model_kv}<h3>Loss</h3>{loss_kv}"]),
            columns([f"<h3>Data</h3>{dataset}", f"<h3>Images and classes</h3>{_data_table(run)}"]),
            columns([f"<h3>{'How the checkpoint was trained' if run.kind == 'evaluate' else 'Optimisation'}</h3>"
                     f"{training}", f"<h3>Machine and time</h3>{timing}"])]
    if loss.get("repr"):
        body.append(f"<h3>Loss module</h3>{code(loss['repr'] + chr(10))}")
    if not run.config:
        body.insert(0, note("config.yaml is missing: the optimisation settings are unknown."))
    return section("What was run", "\n".join(body), anchor="what-was-run")


def _column_title(record: Mapping[str, Any], run: RunFolder, best: int | None) -> str:
    epoch = record.get("epoch")
    if run.kind == "evaluate":
        return "evaluation" if epoch is None else f"evaluation (epoch {epoch})"
    if epoch == 0:
        return "untrained (epoch 0)"
    return f"epoch {epoch} ★ best" if epoch == best else f"epoch {epoch}"


def _metrics_section(run: RunFolder) -> str:
    records = run.evaluations
    if not records:
        return section("Metrics", note("No evaluation was recorded (metrics.json is missing or empty): "
                                       "the run stopped before its first evaluation."), anchor="metrics")
    best = run.best_epoch()
    names = _metric_names(records)
    header = ["metric", *[_column_title(r, run, best) for r in records]]
    with_delta = len(records) > 1 and records[0].get("epoch") == 0
    if with_delta:
        header.append("change (last − untrained)")
    rows: list[list[object]] = []
    for name in names:
        values = [r.get(name) for r in records]
        row: list[object] = [name, *values]
        if with_delta:
            row.append(values[-1] - values[0] if _finite(values[-1]) and _finite(values[0]) else None)
        rows.append(row)
    counts = [("num_queries", "queries"), ("num_queries_without_positive", "queries without a positive (excluded)")]
    for key, label in counts:
        if any(key in r for r in records):
            rows.append([label, *[r.get(key) for r in records], *([None] if with_delta else [])])
    losses = [r.get("loss") for r in records]
    if any(_finite(v) for v in losses):
        rows.append(["training loss (mean of the epoch)", *losses, *([None] if with_delta else [])])
    best_col = [i + 1 for i, r in enumerate(records) if r.get("epoch") == best]
    body = [table(header, rows, highlight_columns=best_col, caption="One column per evaluation")]
    if records[-1].get("by_category"):
        body.append(_category_table(records[-1], names))
    best_info = run.report.get("best") or {}
    if best is not None:
        metric = best_info.get("metric") or run.setting("train.best_metric")
        body.append(note(f"★ best epoch by {metric}: epoch {best}"
                         + (" (checkpoints/best.ckpt)" if (run.path / "checkpoints" / "best.ckpt").is_file() else "")
                         + ". The last column is the model at the end of training; the best epoch is chosen on "
                         "the evaluation split, so its values are optimistic."))
    return section("Metrics", "\n".join(body), anchor="metrics",
                   intro="Retrieval metrics of each evaluation; each query is excluded from its own results, "
                         "ties are pessimistic.")


def _category_table(record: Mapping[str, Any], names: Sequence[str]) -> Raw:
    """The last evaluation per query category (``record["by_category"]``: ``{category: {metric: v, "num_queries",
    "num_queries_without_positive"}}``) and overall; each query retrieved from the whole gallery."""
    header = ["category", "queries", "without a positive", *names]
    rows: list[list[object]] = [[str(category), values.get("num_queries"), values.get("num_queries_without_positive"),
                                 *[values.get(n) for n in names]] for category, values in record["by_category"].items()]
    rows.append(["overall", record.get("num_queries"), record.get("num_queries_without_positive"), *[record.get(n) for n in names]])
    return Raw("\n".join([table(header, rows, highlight_rows=[len(rows) - 1], caption="Per query category (last evaluation)"),
                      note("Each metric averaged over the queries of a category, every query retrieving from the whole "
                           "gallery (open-metric-learning's per-category metrics); the overall row is every query.")]))


def _figure_or_note(figs: _Figures, name: str, caption: str, missing: str) -> str:
    if (figs.folder / name).is_file():
        return figure(f"{FIGURES}/{name}", caption)
    return note(missing + (f" ({figs.problems[name]})" if name in figs.problems else ""))


def _training_section(run: RunFolder, figs: _Figures) -> str | None:
    """Loss terms, learning rates and metrics per evaluation; ``None`` for an evaluate run (nothing trained)."""
    from rankopt.viz import plot_learning_rates, plot_loss_terms, plot_metric_history

    if run.kind == "evaluate":
        return None
    tn = _note_text(run)
    body = []
    if run.steps is None:
        body.append(note("No per-step log: steps.csv is missing (run from an older rankopt, or stopped before "
                         "its first checkpoint)."))
        if (figs.folder / "training_curves.png").is_file():
            body.append(figure(f"{FIGURES}/training_curves.png", "Loss, learning rates and metrics per evaluation "
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
        figs.draw("metrics_per_eval.png", lambda p: plot_metric_history(run.evaluations, p, best_epoch=best, title_note=tn))
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
    emb = ("t-SNE map of the gallery embeddings; left: coloured by the finest class, right: by the "
           f"coarsest level ({coarsest}).") if len(levels) > 1 else "t-SNE map of the gallery embeddings, coloured by class."
    missing = "Not in figures/ (figures were off, or the run ended before them)."
    body = [_figure_or_note(figs, "retrieval_grid.png", grid, f"No retrieval grid. {missing}"),
            _figure_or_note(figs, "pr_curves.png", "Mean interpolated precision–recall curves, one per label level "
                            "(positives: same label at that level or finer).", f"No precision–recall curves. {missing}"),
            _figure_or_note(figs, "embedding_map.png", emb, f"No embedding map. {missing}")]
    return section("Retrieval", "\n".join(body), anchor="retrieval")


def _ap_level_section(run: RunFolder, figs: _Figures) -> str:
    from rankopt.viz import plot_ap_per_level

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
    values = {_column_title(r, run, None): [r.get(f"ap@level{c}", math.nan) for c in keys]
              for r in ([records[0], records[-1]] if len(records) > 1 else records)}
    figs.draw("ap_per_level.png", lambda p: plot_ap_per_level(values, names, p, title_note=_note_text(run)))
    body = _figure_or_note(figs, "ap_per_level.png", "AP with the positives defined at each label level "
                           "(level 0: same finest class), untrained and last evaluation.", "AP per level not drawn.")
    return section(title, body, anchor=anchor)


def _surrogate_section(run: RunFolder, figs: _Figures) -> str:
    from rankopt.viz import plot_surrogates

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
    files = ("report.json", "metrics.csv", "metrics.json", "steps.csv", "config.yaml", "run.json")
    items = [link(f, f) if (run.path / f).is_file() else Raw(f"{escape(f)} (absent)") for f in files]
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return Raw(f"<footer>rankopt {escape(__version__)} · page generated {when} from the run folder "
               f"{code(str(run.path))} · files: {' · '.join(items)}</footer>")


def _update_report_json(run: RunFolder, drawn: Sequence[Path]) -> None:
    """Add the figures drawn to ``report.json``'s ``figures`` list, keeping every key (atomic write)."""
    path = run.path / "report.json"
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
    sections = [_what_was_run(run), _metrics_section(run), _training_section(run, figs), _retrieval_section(run, figs),
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
