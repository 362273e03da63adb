"""The model a sub-command embeds with: a rankopt checkpoint (the positional argument) or an ONNX export
(``--onnx MODEL.onnx``, ``rankopt export``) run by onnxruntime; one of them, never both."""

from __future__ import annotations

import argparse
from typing import Any


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``[CHECKPOINT]`` and ``--onnx MODEL.onnx``."""
    parser.add_argument("checkpoint", nargs="?", help="a rankopt checkpoint (e.g. RUN/checkpoints/best.ckpt), "
                                                      "unless --onnx is given")
    parser.add_argument("--onnx", metavar="MODEL.onnx",
                        help="embed with this ONNX export (rankopt export) through onnxruntime instead of a "
                             "checkpoint (same fingerprint as its checkpoint)")


def embedder_from_args(args: argparse.Namespace, **options: Any) -> Any:
    """The :class:`rankopt.search.Embedder` of ``CHECKPOINT`` or ``--onnx`` (``options``: device, batch size, ...)."""
    from rankopt.search import Embedder

    if (args.checkpoint is None) == (args.onnx is None):
        raise ValueError("give the model as a CHECKPOINT or as --onnx MODEL.onnx (one of them)")
    if args.onnx is not None:
        return Embedder.from_onnx(args.onnx, **options)
    return Embedder.from_checkpoint(args.checkpoint, **options)


def add_index_argument(parser: argparse.ArgumentParser) -> None:
    """The positional ``INDEX_DIR``."""
    parser.add_argument("index", metavar="INDEX_DIR", help="an index folder written by `rankopt index`")


def add_index_model_options(parser: argparse.ArgumentParser, *, batches: bool = True) -> None:
    """``--checkpoint``/``--onnx`` (default: the index's checkpoint) and ``--device``; with ``batches``,
    ``--batch-size`` and ``--no-progress`` too."""
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--checkpoint", metavar="CKPT", help="the model (default: the index's checkpoint)")
    model.add_argument("--onnx", metavar="MODEL.onnx", help="embed with this ONNX export instead (rankopt export)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: auto)")
    if batches:
        parser.add_argument("--batch-size", type=int, default=256, metavar="B", help="embedding batch size (256)")
        parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def index_embedder(index: Any, args: argparse.Namespace) -> Any:
    """The embedder of :func:`add_index_model_options`' model for ``index`` (its pipeline and fingerprint,
    :meth:`rankopt.search.Index.embedder_for`); without an index, the ``--checkpoint`` alone."""
    from rankopt.search import Embedder

    options = {"device": args.device, "batch_size": args.batch_size, "progress": not args.no_progress}
    source = args.onnx or args.checkpoint
    if index is None:
        return Embedder.from_checkpoint(source, **options)
    return index.embedder_for(checkpoint=source, **options)
