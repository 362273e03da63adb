"""The sections of ``report.html`` made of tables: what was run (settings, data, model, loss, machine and
time) and the metrics of each evaluation (and per query category)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rankopt.layout import BEST_CKPT, CHECKPOINTS_DIR
from rankopt.report.html import Raw, code, columns, key_values, note, section, table
from rankopt.report.run_reader import RunFolder, is_finite, metric_names


def _fmt_seconds(seconds: Any) -> str | None:
    if not is_finite(seconds):
        return None
    s = float(seconds)
    if s < 60:
        return f"{s:.1f} s"
    minutes, s = divmod(round(s), 60)
    return f"{minutes} min {s:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _throughput(run: RunFolder) -> float | None:
    value = run.report.get("images_per_second")
    if is_finite(value):
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


def what_was_run(run: RunFolder) -> str:
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
        ("CPU cores / torch threads",
         f"{machine.get('cpu_count')} / {machine.get('torch_threads')}" if machine else None),
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


def column_title(record: Mapping[str, Any], run: RunFolder, best: int | None) -> str:
    epoch = record.get("epoch")
    if run.kind == "evaluate":
        return "evaluation" if epoch is None else f"evaluation (epoch {epoch})"
    if epoch == 0:
        return "untrained (epoch 0)"
    return f"epoch {epoch} ★ best" if epoch == best else f"epoch {epoch}"


def metrics_section(run: RunFolder) -> str:
    records = run.evaluations
    if not records:
        return section("Metrics", note("No evaluation was recorded (metrics.json is missing or empty): "
                                       "the run stopped before its first evaluation."), anchor="metrics")
    best = run.best_epoch()
    names = metric_names(records)
    header = ["metric", *[column_title(r, run, best) for r in records]]
    with_delta = len(records) > 1 and records[0].get("epoch") == 0
    if with_delta:
        header.append("change (last − untrained)")
    rows: list[list[object]] = []
    for name in names:
        values = [r.get(name) for r in records]
        row: list[object] = [name, *values]
        if with_delta:
            row.append(values[-1] - values[0] if is_finite(values[-1]) and is_finite(values[0]) else None)
        rows.append(row)
    counts = [("num_queries", "queries"), ("num_queries_without_positive", "queries without a positive (excluded)")]
    for key, label in counts:
        if any(key in r for r in records):
            rows.append([label, *[r.get(key) for r in records], *([None] if with_delta else [])])
    losses = [r.get("loss") for r in records]
    if any(is_finite(v) for v in losses):
        rows.append(["training loss (mean of the epoch)", *losses, *([None] if with_delta else [])])
    best_col = [i + 1 for i, r in enumerate(records) if r.get("epoch") == best]
    body = [table(header, rows, highlight_columns=best_col, caption="One column per evaluation")]
    if records[-1].get("by_category"):
        body.append(_category_table(records[-1], names))
    best_info = run.report.get("best") or {}
    if best is not None:
        metric = best_info.get("metric") or run.setting("train.best_metric")
        body.append(note(f"★ best epoch by {metric}: epoch {best}"
                         + (f" ({CHECKPOINTS_DIR}/{BEST_CKPT})" if (run.path / CHECKPOINTS_DIR / BEST_CKPT).is_file() else "")
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
    rows.append(["overall", record.get("num_queries"), record.get("num_queries_without_positive"),
                 *[record.get(n) for n in names]])
    return Raw("\n".join([table(header, rows, highlight_rows=[len(rows) - 1],
                                caption="Per query category (last evaluation)"),
                      note("Each metric averaged over the queries of a category, every query retrieving from the whole "
                           "gallery (open-metric-learning's per-category metrics); the overall row is every query.")]))
