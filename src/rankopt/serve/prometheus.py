"""The service's counters in Prometheus's text exposition format (``GET /metrics``), kept by hand
(no client library): requests and errors by route and status, a request-latency histogram per
route, the time of each stage of an image query (decode, queue, transform, forward, search), the embedded
batches and their images, index reloads, and the index size.
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from collections.abc import Iterable

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds (seconds) of the latency histogram's buckets; ``+Inf`` is added."""
STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
STAGES = ("decode", "queue", "transform", "forward", "search")
"""An image query's stages: decode (request thread), queue (waiting for the torch thread), transform (per image),
forward (per batch), search (per query, right after its batch's forward)."""
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
PREFIX = "rankopt_serve"
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
OTHER = "other"
"""The label of any HTTP method outside :data:`METHODS` and of any path no route matched: every label set is
closed, so no request can grow the metrics."""


def _labels(**labels: str) -> str:
    """``{a="x",b="y"}`` with Prometheus's escaping of ``\\``, ``"`` and newlines in the values."""
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    text = ",".join(f'{key}="{escape(value)}"' for key, value in labels.items())
    return "{" + text + "}" if text else ""


class Histogram:
    """Counts per bucket (``count[i]``: observations ``<= bounds[i]``, not cumulative), sum and total."""

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def lines(self, name: str, **labels: str) -> list[str]:
        """The ``_bucket`` (cumulative, ``le`` bounds then ``+Inf``), ``_sum`` and ``_count`` samples."""
        out, total = [], 0
        for bound, count in zip([*(repr(float(b)) for b in self.bounds), "+Inf"], self.counts):
            total += count
            out.append(f"{name}_bucket{_labels(**labels, le=bound)} {total}")
        out += [f"{name}_sum{_labels(**labels)} {self.sum!r}", f"{name}_count{_labels(**labels)} {total}"]
        return out


class Metrics:
    """Thread-safe counters of the service; :meth:`render` writes them as Prometheus text."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str, str]] = Counter()
        """``(route, method, status code)`` -> answered requests."""
        self.latency: dict[str, Histogram] = {}
        self.stages = {stage: Histogram(STAGE_BUCKETS) for stage in STAGES}
        self.batches = Histogram(BATCH_BUCKETS)
        self.reloads: Counter[str] = Counter()
        """``"ok"`` / ``"failed"`` -> index reloads."""

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        """One answered request: ``route`` is a route's path template or :data:`OTHER` (never a request's path);
        ``method`` outside :data:`METHODS` and ``status`` outside 100-599 are counted as :data:`OTHER`."""
        method = method if method in METHODS else OTHER
        status = status if 100 <= status <= 599 else 0
        with self._lock:
            self.requests[(route, method, str(status))] += 1
            self.latency.setdefault(route, Histogram(LATENCY_BUCKETS)).observe(seconds)

    def observe_stage(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.stages[stage].observe(seconds)

    def observe_batch(self, images: int) -> None:
        with self._lock:
            self.batches.observe(images)

    def observe_reload(self, ok: bool) -> None:
        with self._lock:
            self.reloads["ok" if ok else "failed"] += 1

    def render(self, index_items: int) -> str:
        """All metrics as Prometheus text format 0.0.4 (``# HELP`` / ``# TYPE`` then samples)."""
        p = PREFIX
        with self._lock:
            lines = [f"# HELP {p}_requests_total HTTP requests answered, by route, method and status code.",
                     f"# TYPE {p}_requests_total counter"]
            lines += [f"{p}_requests_total{_labels(route=r, method=m, code=c)} {n}"
                      for (r, m, c), n in sorted(self.requests.items())]
            errors: Counter[tuple[str, str]] = Counter()
            for (route, _, code), n in self.requests.items():
                if int(code) >= 400:
                    errors[(route, code)] += n
            lines += [f"# HELP {p}_errors_total HTTP requests answered with a 4xx or 5xx status, by route and code.",
                      f"# TYPE {p}_errors_total counter"]
            lines += [f"{p}_errors_total{_labels(route=r, code=c)} {n}" for (r, c), n in sorted(errors.items())]
            lines += [f"# HELP {p}_request_duration_seconds Time from a request's arrival to its answer, by route.",
                      f"# TYPE {p}_request_duration_seconds histogram"]
            for route, histogram in sorted(self.latency.items()):
                lines += histogram.lines(f"{p}_request_duration_seconds", route=route)
            lines += [f"# HELP {p}_stage_seconds Time of each stage of an image query: decode, queue (waiting for the "
                      "torch thread), transform (per image), forward (per batch), search (per image query).",
                      f"# TYPE {p}_stage_seconds histogram"]
            for stage, histogram in self.stages.items():
                lines += histogram.lines(f"{p}_stage_seconds", stage=stage)
            lines += [f"# HELP {p}_batch_images Images embedded together in one forward pass (micro-batching).",
                      f"# TYPE {p}_batch_images histogram", *self.batches.lines(f"{p}_batch_images")]
            lines += [f"# HELP {p}_reloads_total Index reloads after a change on disk, by outcome.",
                      f"# TYPE {p}_reloads_total counter"]
            lines += [f"{p}_reloads_total{_labels(outcome=o)} {self.reloads[o]}" for o in ("ok", "failed")]
        lines += [f"# HELP {p}_index_items Items in the index being served.", f"# TYPE {p}_index_items gauge",
                  f"{p}_index_items {index_items}"]
        return "\n".join(lines) + "\n"
