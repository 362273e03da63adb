"""The runtime an inference pass runs on: PyTorch, or onnxruntime where it is installed and keeps parity.

Every frozen forward of rankopt (``rankopt index``, the service, ``embed`` / ``evaluate``, ``fit``'s trunk and
multi-scale passes) goes through :func:`prepare_network`, which returns a module with the same ``(B, 3, H, W) ->
outputs`` contract as the network it is given, and the :class:`Runtime` it runs on:

- ``torch``: the network itself;
- ``onnx``: the network exported once (:func:`rankopt.export.onnx.export_onnx`) into the cache,
  ``$RANKOPT_CACHE/onnx/KEY.onnx`` with ``KEY`` the fingerprint of the weights and the preprocessing (so the file
  of one network is never taken for another's), checked against PyTorch on a synthetic batch before it is used
  (per-row cosine >= :data:`rankopt.export.parity.COSINE_TOLERANCE`), then run by onnxruntime on the CPU;
- ``auto`` (the default): on a CPU where onnxruntime and the exporter are installed and the export keeps
  parity, the faster of the two at the caller's batch size, timed once on this machine (:func:`timings`:
  onnxruntime is 2-6x faster on MobileNetV2, but slower than PyTorch on MobileFaceNet at batch 32,
  benchmarks/results/onnx_latency.md); else ``torch``; the reason in :attr:`Runtime.note`. The parity verdict, a
  failed export and the timings are remembered beside the cache key (``KEY.json``), so nothing is redone at every
  call.

Training's backward stays in PyTorch; only frozen forwards change runtime. onnxruntime runs a whole batch per
call with ``threads`` intra-op threads (default: torch's thread count, so both runtimes use the same cores).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rankopt.data.cache import cache_dir
from rankopt.export.onnx import export_onnx, import_exporter
from rankopt.export.onnx_net import OnnxNet, import_onnxruntime
from rankopt.export.parity import compare

TIMED_BATCH, TIMED_BATCH_MAX, TIMED_RUNS = 16, 32, 3
"""``auto`` times both runtimes on a batch of the caller's size (default 16, at most 32: larger batches run at the
same images/s), best of :data:`TIMED_RUNS` runs each."""
RUNTIMES = ("auto", "torch", "onnx")
"""What ``--runtime`` takes."""
AUTO, TORCH, ONNX = RUNTIMES


@dataclass(frozen=True)
class Runtime:
    """The runtime an inference pass runs on: ``name`` ``pytorch`` or ``onnxruntime``, its ``threads`` and
    ``device``, and ``note``: why it was chosen (for ``auto``, why not onnxruntime where it was not)."""

    name: str
    threads: int
    device: str
    note: str = ""

    def describe(self) -> str:
        return f"{self.name} ({self.threads} thread{'s' * (self.threads != 1)}, {self.device})"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "threads": self.threads, "device": self.device, "note": self.note}


def check_runtime(runtime: str) -> str:
    if runtime not in RUNTIMES:
        raise ValueError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")
    return runtime


def default_runtime() -> str:
    """``$RANKOPT_RUNTIME`` (``auto``, ``torch`` or ``onnx``), else ``auto``: the runtime a checkpoint embeds with
    when none is asked for."""
    return check_runtime(os.environ.get("RANKOPT_RUNTIME", AUTO) or AUTO)


def onnx_unavailable() -> str | None:
    """Why onnxruntime cannot run exported networks here (``None``: it can). The exporter (onnx, onnxscript: a
    second to import) is checked only when an export is made (:func:`cached_export`)."""
    try:
        import_onnxruntime()
    except ImportError as err:
        return str(err)
    return None


def cached_export(network: nn.Module, preprocessing: Mapping[str, Any], key: str, *,
                  folder: Path | None = None, summary: Mapping[str, Any] | None = None) -> Path:
    """The ONNX file of ``network`` under cache key ``key`` (exported and parity-checked on first use); a
    ``ValueError`` with the reason when the export fails or does not reproduce ``network`` (remembered)."""
    folder = folder or cache_dir("onnx")
    path, verdict = folder / f"{key}.onnx", folder / f"{key}.json"
    if verdict.is_file():
        stored = json.loads(verdict.read_text(encoding="utf-8"))
        if stored.get("refused"):
            raise ValueError(stored["refused"])
        if path.is_file():
            return path
    import_exporter()  # an ImportError naming the install line when onnx or onnxscript is missing
    staged = folder / f".{key}.{os.getpid()}.staged.onnx"
    try:
        try:
            export_onnx(network, preprocessing, staged, fingerprint=key, summary=summary)
            report = compare(network, OnnxNet(staged, device="cpu"), preprocessing)
        except Exception as err:  # the exporter raises its own classes for unsupported graphs
            reason = f"the ONNX export failed ({type(err).__name__}: {str(err).splitlines()[0][:300]})"
            _write_json(verdict, {"refused": reason})
            raise ValueError(reason) from None
        if not report.ok:
            reason = f"the ONNX export does not reproduce PyTorch ({'; '.join(report.failures())})"
            _write_json(verdict, {"refused": reason})
            raise ValueError(reason)
        os.replace(staged, path)
        _write_json(verdict, {"cosine_min": report.cosine_min, "checked_on": report.source})
    finally:
        staged.unlink(missing_ok=True)
    return path


def _write_json(path: Path, value: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(value, indent=2), encoding="utf-8")
    os.replace(tmp, path)


def prepare_network(network: nn.Module, preprocessing: Mapping[str, Any], key: str, *, runtime: str = AUTO,
                    device: torch.device | str = "cpu", threads: int | None = None,
                    summary: Mapping[str, Any] | None = None, folder: Path | None = None,
                    say: Callable[[str], None] | None = None, batch: int = TIMED_BATCH) -> tuple[nn.Module, Runtime]:
    """``network`` on the runtime ``runtime`` asks for (module docstring): the module to call and the
    :class:`Runtime`. ``key``: the cache key of ``network`` with ``preprocessing`` (a fingerprint of both);
    ``say``: told when an export starts (it takes seconds to a minute); ``batch``: the batch size the caller runs,
    at which ``auto`` compares the two runtimes' speed (:func:`timings`) and keeps the faster."""
    check_runtime(runtime)
    device = torch.device(device)
    threads = threads or torch.get_num_threads()
    on_torch = Runtime("pytorch", torch.get_num_threads(), str(device))
    if runtime == TORCH:
        return network, on_torch
    if device.type != "cpu":
        if runtime == ONNX:
            raise ValueError(f"--runtime onnx runs on the CPU; device {device} runs PyTorch (use --runtime auto)")
        return network, dataclasses.replace(on_torch, note=f"PyTorch on {device}")
    missing = onnx_unavailable()
    if missing is not None:
        if runtime == ONNX:
            raise ImportError(missing)
        return network, dataclasses.replace(on_torch, note=f"onnxruntime not used: {missing}")
    try:
        if say is not None and not (folder or cache_dir("onnx")).joinpath(f"{key}.json").is_file():
            say("exporting the network to ONNX once for onnxruntime (cached for later runs)")
        path = cached_export(network, preprocessing, key, folder=folder, summary=summary)
    except (ValueError, ImportError) as err:
        if runtime == ONNX:
            raise
        return network, dataclasses.replace(on_torch, note=f"onnxruntime not used: {err}")
    net = OnnxNet(path, device="cpu", threads=threads)
    if hasattr(network, "embedding_dim"):
        net.embedding_dim = int(network.embedding_dim)
    chosen = Runtime("onnxruntime", threads, "cpu", f"the export {path.name}, cached in {path.parent}")
    if runtime == ONNX:
        return net, chosen
    torch_ms, onnx_ms = timings(network, net, batch, path.with_suffix(".json"))
    said = f"at batch {batch}: PyTorch {torch_ms:.1f} ms, onnxruntime {onnx_ms:.1f} ms (measured once here)"
    if torch_ms < onnx_ms:
        return network, dataclasses.replace(on_torch, note=f"faster than onnxruntime {said}")
    return net, dataclasses.replace(chosen, note=f"{chosen.note}; {said}")


def timings(network: nn.Module, net: OnnxNet, batch: int, verdict: Path) -> tuple[float, float]:
    """``(PyTorch ms, onnxruntime ms)`` of one forward of ``batch`` random images, each the best of
    :data:`TIMED_RUNS` alternated runs after a warm-up (the best, not the median: another process on the cores slows
    some runs, never speeds one up); stored in ``verdict`` (per batch and thread counts), so measured once."""
    stored = json.loads(verdict.read_text(encoding="utf-8")) if verdict.is_file() else {}
    slot = f"batch {batch}, {torch.get_num_threads()} torch threads, {net.threads} onnxruntime threads"
    if slot in stored.get("timings", {}):
        return tuple(stored["timings"][slot])  # type: ignore[return-value]
    images = torch.randn(batch, *net.input_shape, generator=torch.Generator().manual_seed(0))
    was = network.training
    network.eval()
    best = [float("inf"), float("inf")]
    with torch.inference_mode():
        for run in range(TIMED_RUNS + 1):
            for slot_index, forward in enumerate((network, net)):
                began = time.perf_counter()
                forward(images)
                if run:  # the first round warms up
                    best[slot_index] = min(best[slot_index], 1000 * (time.perf_counter() - began))
    network.train(was)
    stored.setdefault("timings", {})[slot] = best
    _write_json(verdict, stored)
    return best[0], best[1]
