"""A retrieval model exported to ONNX, its preprocessing and fingerprint in the file's metadata.

The graph maps ``(B, 3, H, W)`` float32 images, the test transform's output, to the ``(B, D)`` L2-normalised
embeddings of the PyTorch model (backbone, pooling, LayerNorm, projection, normalisation); the batch axis is
dynamic, ``H x W`` fixed by the test transform. It is written by the ``torch.export``-based exporter
(``torch.onnx.export(..., dynamo=True)``, which needs onnx and onnxscript): it exports every built-in backbone,
ViTs included (the TorchScript exporter fails on the ViT position-embedding resize).

``metadata_props`` (strings; read back by :class:`rankopt.export.onnx_net.OnnxMetadata`):

==================  ==========================================================================================
``format``          ``rankopt-embedding-model``, ``format_version`` ``1``
``fingerprint``     :func:`rankopt.models.fingerprint.model_fingerprint` of the PyTorch model and ``preprocessing``
``preprocessing``   JSON, rankopt's settings: ``{"transform": PRESET, "image_size": ...}``
``input``           JSON, the input convention for any runtime: ``layout`` NCHW, ``dtype`` float32, ``colour_order``
                    RGB, ``pixel_scale`` (pixels / 255), ``height``, ``width``, ``mean``, ``std`` (``x = (p / 255 -
                    mean) / std``) and the ``steps`` (resize, center crop, normalize) with their sizes
``model``           JSON ``{"backbone", "embedding_dim", "parameters"}``
``source``          the checkpoint's file name; ``rankopt_version``
==================  ==========================================================================================

:func:`export_checkpoint` writes the file only when the ONNX embeddings match PyTorch's
(:mod:`rankopt.export.parity`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rankopt import __version__
from rankopt.data.base import RetrievalDataset
from rankopt.data.fast_transform import CenterCropStep, NormalizeStep, ResizeStep
from rankopt.data.transforms import AreaResize, build_transform, output_size
from rankopt.describe import model_info
from rankopt.engine.assembly import inference_preprocessing, model_from_checkpoint
from rankopt.export.onnx_net import FORMAT, FORMAT_VERSION, INPUT_NAME, INSTALL_HINT, OUTPUT_NAME, OnnxNet
from rankopt.export.parity import DEFAULT_LIMIT, ParityReport, compare
from rankopt.models.fingerprint import model_fingerprint

EXAMPLE_BATCH = 2  # the traced batch; the exported batch axis is dynamic


def import_exporter() -> Any:
    """The ``onnx`` module, after checking that the exporter's dependencies (onnx, onnxscript) are installed."""
    try:
        import onnx  # optional dependencies, imported lazily
        import onnxscript  # noqa: F401 - torch.onnx's exporter needs it
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(f"exporting to ONNX needs onnx and onnxscript: {INSTALL_HINT}") from err
    return onnx


def describe_input(preprocessing: Mapping[str, Any]) -> dict[str, Any]:
    """The input convention of ``preprocessing``'s test transform, for runtimes without rankopt: the steps
    of its per-image path (:mod:`rankopt.data.fast_transform`) on an RGB image scaled to [0, 1]."""
    if "transform" not in preprocessing:
        raise ValueError(f"preprocessing {dict(preprocessing)} names no test transform preset (key 'transform')")
    transform = build_transform(preprocessing["transform"], preprocessing.get("image_size"))
    steps: list[dict[str, Any]] = []
    for step in transform.fast.steps if transform.fast is not None else (transform.ops,):  # none: refused below
        if isinstance(step, ResizeStep):
            size = {"shorter_side": step.size} if isinstance(step.size, int) else {"size": list(step.size)}
            steps.append({"op": "resize", **size, "interpolation": "bilinear", "antialias": step.antialias,
                          "align_corners": step.align_corners})
        elif isinstance(step, AreaResize):
            steps.append({"op": "resize", "size": list(step.size), "interpolation": "area"})
        elif isinstance(step, CenterCropStep):
            steps.append({"op": "center_crop", "size": list(step.size)})
        elif isinstance(step, NormalizeStep):
            mean, std = ([float(f"{v:.7g}") for v in t.flatten().tolist()] for t in (step.mean, step.std))
            steps.append({"op": "normalize", "mean": mean, "std": std, "formula": "(x - mean) / std"})
        else:
            raise ValueError(f"test transform {preprocessing.get('transform')!r} has random or unsupported ops "
                             f"({transform.ops}); an exported model needs a deterministic test transform")
    height, width = output_size(preprocessing["transform"], preprocessing.get("image_size"))
    normalize = steps[-1]
    return {"layout": "NCHW", "dtype": "float32", "colour_order": "RGB", "pixel_scale": "1/255 (0-1 before the steps)",
            "height": height, "width": width, "mean": normalize["mean"], "std": normalize["std"], "steps": steps}


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter's warnings and log lines silenced (e.g. "torchvision is not installed"); the exported
    model is checked against PyTorch afterwards."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def export_onnx(model: nn.Module, preprocessing: Mapping[str, Any], out: str | os.PathLike[str], *,
                summary: Mapping[str, Any] | None = None, source: str | None = None,
                fingerprint: str | None = None) -> Path:
    """Write ``model`` (in eval mode for the export, restored after) as ONNX to ``out`` (atomically) with the
    metadata of the module docstring; ``preprocessing`` (test transform preset and image size) sets the
    input size and joins the fingerprint (``fingerprint``: stored instead, for a network that is a part or a
    wrapper of the model the fingerprint names, :mod:`rankopt.export.runtimes`)."""
    onnx = import_exporter()
    input_spec = describe_input(preprocessing)
    height, width = output_size(preprocessing["transform"], preprocessing.get("image_size"))
    summary = dict(summary or model_info(model, type(getattr(model, "backbone", model)).__name__))
    parameter = next(model.parameters(), None)
    example = torch.rand(EXAMPLE_BATCH, 3, height, width, device=None if parameter is None else parameter.device)
    properties = {"format": FORMAT, "format_version": FORMAT_VERSION,
                  "fingerprint": fingerprint or model_fingerprint(model, preprocessing),
                  "preprocessing": json.dumps(dict(preprocessing), sort_keys=True),
                  "input": json.dumps(input_spec), "model": json.dumps(summary), "rankopt_version": __version__,
                  **({"source": source} if source else {})}
    was_training = model.training
    model.eval()
    try:
        with _quiet_exporter():
            program = torch.onnx.export(model, (example,), dynamo=True, verbose=False, input_names=[INPUT_NAME],
                                        output_names=[OUTPUT_NAME],
                                        dynamic_shapes=({0: torch.export.Dim("batch")},))
    finally:
        model.train(was_training)
    proto = program.model_proto
    onnx.helper.set_model_props(proto, properties)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        onnx.save_model(proto, str(tmp))
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


@dataclass(frozen=True)
class Exported:
    """What :func:`export_checkpoint` wrote and measured."""

    path: Path
    fingerprint: str
    summary: dict[str, Any]
    preprocessing: dict[str, Any]
    parity: ParityReport


def export_checkpoint(checkpoint: str | os.PathLike[str], out: str | os.PathLike[str], *,
                      images: RetrievalDataset | None = None, limit: int | None = DEFAULT_LIMIT,
                      batch_size: int = 64, progress: bool = True, description: str | None = None) -> Exported:
    """Export a rankopt checkpoint to ``out`` and check it (:func:`rankopt.export.parity.compare` on ``images``,
    at most ``limit`` of them (:func:`rankopt.export.parity.sample`), or a synthetic batch when ``None``;
    ``description`` names them in the report)
    before moving it into place: an ONNX
    model whose embeddings differ from the checkpoint's is refused (``ValueError``, nothing written), since it
    carries the checkpoint's fingerprint."""
    model, cfg = model_from_checkpoint(checkpoint, "cpu")
    preprocessing = inference_preprocessing(cfg)
    summary = model_info(model, cfg.model.backbone)
    out = Path(out)
    staged = out.with_name(f".{out.name}.{os.getpid()}.staged")
    try:
        export_onnx(model, preprocessing, staged, summary=summary, source=Path(checkpoint).name)
        net = OnnxNet(staged, device="cpu")
        report = compare(model, net, preprocessing, images, limit=limit, batch_size=batch_size, progress=progress,
                         description=description)
        if not report.ok:
            raise ValueError(f"the ONNX export of {checkpoint} does not reproduce its embeddings "
                             f"({'; '.join(report.failures())}); nothing written to {out}")
        os.replace(staged, out)
    finally:
        staged.unlink(missing_ok=True)
    return Exported(out, net.fingerprint, summary, preprocessing, report)
