"""An exported ONNX embedding model run by onnxruntime (the optional ``onnx`` extra, imported lazily).

:class:`OnnxNet` is an ``nn.Module`` whose forward runs an onnxruntime session, ``(B, 3, H, W)`` float32 images
(the test transform's output) -> ``(B, D)`` embeddings, so :func:`rankopt.engine.embed_and_score.embed_dataset` and
:class:`rankopt.search.Embedder` use it as they use a PyTorch model. It has no parameters: its ``fingerprint``
and ``preprocessing`` are read from the model's ``metadata_props`` (written by :mod:`rankopt.export.onnx`), the
exported checkpoint's own, so an index built through onnxruntime accepts queries embedded by the checkpoint
and the reverse.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

INSTALL_HINT = "pip install 'rankopt[onnx]'"
FORMAT = "rankopt-embedding-model"
FORMAT_VERSION = "1"
INPUT_NAME, OUTPUT_NAME = "images", "embeddings"
CHUNK = 32
"""Images per onnxruntime call: a larger batch is run in chunks of this size, so the session's memory arena stays
small and reused (``rankopt index``'s batch of 256 in one call spent 20 % of its CPU time in the kernel, 2.4 s more
on 2,000 Caltech-101 photos: benchmarks/results/runtimes.md)."""
JSON_KEYS = ("preprocessing", "input", "model")
"""metadata_props holding JSON: the fingerprint's preprocessing, the input convention, the model summary."""


def import_onnxruntime() -> Any:
    try:
        import onnxruntime  # optional dependency, imported lazily
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(f"running ONNX models needs onnxruntime: {INSTALL_HINT}") from err
    return onnxruntime


@dataclass(frozen=True)
class OnnxMetadata:
    """What :mod:`rankopt.export.onnx` stores in an exported model (``metadata_props``)."""

    fingerprint: str
    preprocessing: dict[str, Any]
    """rankopt's settings besides the weights (test transform preset, image size): the fingerprint's."""
    input: dict[str, Any]
    """The input convention for any runtime: layout, colour order, scale, height, width, mean, std, steps."""
    model: dict[str, Any]
    """``{"backbone", "embedding_dim", "parameters"}`` of the exported model."""
    properties: dict[str, str]
    """Every metadata entry as stored."""

    @classmethod
    def from_properties(cls, properties: dict[str, str], path: str | os.PathLike[str]) -> OnnxMetadata:
        """Parse ``properties``; a model not exported by rankopt is an error naming ``path``."""
        if properties.get("format") != FORMAT or "fingerprint" not in properties:
            raise ValueError(f"{str(path)!r} is not an embedding model exported by rankopt (its metadata has no "
                             f"format {FORMAT!r} and fingerprint): export one with `rankopt export CHECKPOINT "
                             "--format onnx --out MODEL.onnx`")
        if properties.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{str(path)!r}: export format version {properties.get('format_version')!r}, this "
                             f"rankopt reads version {FORMAT_VERSION}: export it again")
        try:
            parsed = {key: json.loads(properties[key]) for key in JSON_KEYS}
        except (KeyError, json.JSONDecodeError) as err:
            raise ValueError(f"{str(path)!r}: unreadable rankopt metadata ({err}); export it again") from None
        return cls(properties["fingerprint"], parsed["preprocessing"], parsed["input"], parsed["model"],
                   dict(properties))


def execution_providers(device: str, available: list[str]) -> tuple[list[Any], str]:
    """onnxruntime providers for ``device`` (``auto``: CUDA when onnxruntime has it, else CPU; ``cpu``;
    ``cuda`` / ``cuda:N``: onnxruntime-gpu required) and a short name of the one chosen."""
    cuda = "CUDAExecutionProvider"
    if device == "cpu" or (device == "auto" and cuda not in available):
        return ["CPUExecutionProvider"], "cpu"
    if device == "auto":
        return [cuda, "CPUExecutionProvider"], "cuda"
    if device == "cuda" or device.startswith("cuda:"):
        if cuda not in available:
            raise ValueError(f"device {device!r}: this onnxruntime has no CUDA provider (it has "
                             f"{', '.join(available)}); install onnxruntime-gpu or use --device cpu")
        index = int(device.partition(":")[2] or 0)
        return [(cuda, {"device_id": index}), "CPUExecutionProvider"], device
    raise ValueError(f"unknown device {device!r} for onnxruntime; use auto, cpu, cuda or cuda:N")


class OnnxNet(nn.Module):
    """``(B, 3, H, W)`` images -> ``(B, D)`` embeddings (float32, CPU) by an onnxruntime session of ``path``.

    ``threads``: onnxruntime's intra-op threads (default: its own choice, one per physical core).
    """

    def __init__(self, path: str | os.PathLike[str], *, device: str = "auto", threads: int | None = None) -> None:
        super().__init__()
        ort = import_onnxruntime()
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"ONNX model {str(self.path)!r} does not exist")
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        options = ort.SessionOptions()
        # idle intra-op threads sleep instead of spinning: the threads reading the next images share the cores
        # (measured: 251 against 219 photos/s embedding Caltech-101, benchmarks/results/runtimes.md)
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if threads is not None:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        providers, self.runtime_device = execution_providers(device, ort.get_available_providers())
        try:
            self.session = ort.InferenceSession(str(self.path), options, providers=providers)
        except Exception as err:  # onnxruntime raises its own classes for unreadable or invalid files
            raise ValueError(f"{str(self.path)!r} is not a model onnxruntime can run: {err}") from None
        self.metadata = OnnxMetadata.from_properties(self.session.get_modelmeta().custom_metadata_map, self.path)
        (first,), (output,) = self.session.get_inputs(), self.session.get_outputs()
        self.input_name, self.output_name = first.name, output.name
        self.input_shape = tuple(first.shape[1:])  # ["batch", 3, H, W]
        self.embedding_dim = int(self.metadata.model["embedding_dim"])

    @property
    def fingerprint(self) -> str:
        return self.metadata.fingerprint

    @property
    def preprocessing(self) -> dict[str, Any]:
        return dict(self.metadata.preprocessing)

    @property
    def summary(self) -> dict[str, Any]:
        """The exported model's summary, with ``runtime = "onnxruntime"``."""
        return {**self.metadata.model, "runtime": "onnxruntime"}

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if images.ndim != 4 or tuple(images.shape[1:]) != self.input_shape:
            raise ValueError(f"{self.path.name} takes (B, {', '.join(map(str, self.input_shape))}) images "
                             f"(its test transform's output), got {tuple(images.shape)}")
        x = images.detach().to("cpu", torch.float32).contiguous().numpy()
        if len(x) <= CHUNK:
            return torch.from_numpy(self.session.run([self.output_name], {self.input_name: x})[0])
        return torch.cat([torch.from_numpy(self.session.run([self.output_name], {self.input_name: x[i:i + CHUNK]})[0])
                          for i in range(0, len(x), CHUNK)])

    def extra_repr(self) -> str:
        return f"{self.path.name}, fingerprint={self.fingerprint}, {self.runtime_device}"
