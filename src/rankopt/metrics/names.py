"""Metric names: :func:`parse_metric` (``recall@10`` -> a :class:`MetricSpec`) and :func:`check_metrics`, which
checks a command's metric names, and the label levels they need, before any image is embedded."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from rankopt.metrics.verification import parse_far_keys
from rankopt.registries import Registry


@dataclass(frozen=True)
class MetricSpec:
    """A parsed metric name: ``family`` (e.g. ``recall``), cut-off or level ``k``, and its ``kind``."""

    name: str
    family: str
    k: int
    kind: str  # "topk", "full" (binary, whole ranking) or "hierarchical"


METRICS: Registry[MetricSpec] = Registry("metric")
_KINDS = {
    "recall": "topk", "precision": "topk", "true_recall": "topk", "map@r": "topk", "map@k": "topk",
    "map": "full", "mrr": "full",
    "h-ap": "hierarchical", "sum_wap": "hierarchical", "asi": "hierarchical", "ndcg": "hierarchical",
    "ap@level": "hierarchical",
}  # fmt: skip
for _family, _kind in _KINDS.items():
    METRICS.register(_family)(lambda name, k=0, _f=_family, _k=_kind: MetricSpec(name, _f, k, _k))

_PATTERN = re.compile(r"^(recall|precision|true_recall|map)@(\d+)$|^ap@level(\d+)$")


def parse_metric(name: str) -> MetricSpec:
    """``recall@10`` -> ``MetricSpec("recall@10", "recall", 10, "topk")``; unknown names raise ``KeyError``."""
    key = name.strip().lower()
    match = _PATTERN.match(key)
    if match and match.group(3) is not None:
        return METRICS.build("ap@level", name=key, k=int(match.group(3)))
    if match:
        family, k = match.group(1), int(match.group(2))
        if k < 1:
            raise ValueError(f"metric {name!r}: the cut-off must be >= 1")
        return METRICS.build("map@k" if family == "map" else family, name=key, k=k)
    if ("@" in key and key != "map@r") or key in ("recall", "precision", "true_recall", "map@k", "ap@level"):
        raise KeyError(f"unknown metric {name!r}; use recall@K, true_recall@K, precision@K, map@K, ap@level{{c}} or "
                       f"one of {', '.join(METRICS.names())}")
    return METRICS.build(key, name=key)


def check_metrics(names: Sequence[str], num_levels: int | None = None, *, source: str = "metrics") -> list[MetricSpec]:
    """The specs of ``names`` (``tar@far=F`` names checked and left out), each checked before any work: it parses,
    and an ``ap@level{c}`` has a label column ``c`` among ``num_levels`` (``None``: not known yet). Errors
    (``ValueError``) name the metric and ``source`` (e.g. ``eval.metrics``, ``--metrics``)."""
    try:
        others, _ = parse_far_keys(list(names))
        specs = [parse_metric(name) for name in others]
    except (KeyError, ValueError) as err:
        raise ValueError(f"{source}: {err.args[0]}") from None
    check_levels(specs, num_levels, source)
    return specs


def check_levels(specs: Sequence[MetricSpec], num_levels: int | None, source: str = "metrics") -> None:
    """Every ``ap@level{c}`` of ``specs`` has a label column ``c`` among ``num_levels`` (``None``: no check)."""
    for spec in specs:
        if num_levels is not None and spec.family == "ap@level" and spec.k >= num_levels:
            usable = "ap@level0" + (f" .. ap@level{num_levels - 1}" if num_levels > 1 else "")
            raise ValueError(f"{source}: metric {spec.name!r} needs label column {spec.k}, but the labels have "
                             f"{num_levels} level(s), columns 0..{num_levels - 1} (use {usable})")
