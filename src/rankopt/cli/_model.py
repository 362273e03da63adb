"""The model a sub-command embeds with: a rankopt checkpoint (the positional argument) or an ONNX export
(``--onnx MODEL.onnx``, ``rankopt export``) run by onnxruntime; one of them, never both. ``evaluate``, ``embed``
and ``whiten`` load a checkpoint with its data through :func:`load_from_args`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from rankopt.cli._threads import TORCH_THREADS, add_runtime_argument, add_threads_argument, apply_threads
from rankopt.search.settings import EMBED

if TYPE_CHECKING:
    from rankopt.engine.inference import Inference


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``[CHECKPOINT]``, ``--onnx MODEL.onnx`` and ``--runtime``."""
    parser.add_argument("checkpoint", nargs="?", help="a rankopt checkpoint (e.g. RUN/checkpoints/best.ckpt), "
                                                      "unless --onnx is given")
    parser.add_argument("--onnx", metavar="MODEL.onnx",
                        help="embed with this ONNX export (rankopt export) through onnxruntime instead of a "
                             "checkpoint (same fingerprint as its checkpoint)")
    add_runtime_argument(parser)


def add_device_argument(parser: argparse.ArgumentParser) -> None:
    """``--device`` (:attr:`rankopt.search.settings.EmbedSettings.device`)."""
    parser.add_argument("--device", default=EMBED.device, help=f"cpu, cuda, cuda:1, ... (default: {EMBED.device})")


def embedder_from_args(args: argparse.Namespace, **options: Any) -> Any:
    """The :class:`rankopt.search.Embedder` of ``CHECKPOINT`` or ``--onnx`` (``options``: device, batch size, ...),
    with ``--threads`` applied (onnxruntime's intra-op threads too)."""
    from rankopt.search import Embedder

    if (args.checkpoint is None) == (args.onnx is None):
        raise ValueError("give the model as a CHECKPOINT or as --onnx MODEL.onnx (one of them)")
    apply_threads(args)
    if args.onnx is not None:
        return Embedder.from_onnx(args.onnx, threads=args.threads, **options)
    return Embedder.from_checkpoint(args.checkpoint, runtime=args.runtime, threads=args.threads, **options)


def add_index_argument(parser: argparse.ArgumentParser) -> None:
    """The positional ``INDEX_DIR``."""
    parser.add_argument("index", metavar="INDEX_DIR", help="an index folder written by `rankopt index`")


def add_index_model_options(parser: argparse.ArgumentParser, *, batches: bool = True,
                            threads_default: str = TORCH_THREADS) -> None:
    """``--checkpoint``/``--onnx`` (default: the index's checkpoint), ``--device`` and ``--threads`` (its default
    described as ``threads_default``); with ``batches``, ``--batch-size`` and ``--no-progress`` too."""
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--checkpoint", metavar="CKPT", help="the model (default: the index's checkpoint)")
    model.add_argument("--onnx", metavar="MODEL.onnx", help="embed with this ONNX export instead (rankopt export)")
    add_device_argument(parser)
    add_runtime_argument(parser)
    add_threads_argument(parser, threads_default)
    if batches:
        parser.add_argument("--batch-size", type=int, default=EMBED.batch_size, metavar="B",
                            help=f"embedding batch size ({EMBED.batch_size})")
        parser.add_argument("--no-progress", action="store_true", help="hide progress bars")


def index_embedder(index: Any, args: argparse.Namespace) -> Any:
    """The embedder of :func:`add_index_model_options`' model for ``index`` (its pipeline and fingerprint,
    :meth:`rankopt.search.Index.embedder_for`); without an index, the ``--checkpoint`` alone. ``--threads`` applied
    (onnxruntime's intra-op threads too)."""
    from rankopt.search import Embedder

    apply_threads(args)
    options = {"device": args.device, "batch_size": args.batch_size, "progress": not args.no_progress,
               "threads": args.threads}
    if args.onnx is None:
        options["runtime"] = args.runtime
    source = args.onnx or args.checkpoint
    if index is None:
        return Embedder.from_checkpoint(source, **options)
    return index.embedder_for(checkpoint=source, **options)


def add_model_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments shared by ``evaluate``, ``embed`` and ``whiten``: checkpoint, dataset, transform, device, threads."""
    parser.add_argument("checkpoint", help="a rankopt checkpoint (e.g. RUN/checkpoints/best.ckpt)")
    parser.add_argument("--dataset", metavar="NAME", help="dataset name (default: the checkpoint's training dataset)")
    parser.add_argument("--root", metavar="PATH", help="dataset folder (default: the checkpoint's data.root)")
    parser.add_argument("--transform", metavar="PRESET", help="test transform preset (default: the checkpoint's)")
    parser.add_argument("--image-size", metavar="S|HxW", help="test image size (default: the checkpoint's)")
    parser.add_argument("--batch-size", type=int, default=None, metavar="B", help="embedding batch size")
    parser.add_argument("--num-workers", type=int, default=EMBED.num_workers, metavar="W", help="DataLoader workers")
    add_device_argument(parser)
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    add_runtime_argument(parser)
    add_threads_argument(parser)


def load_from_args(args: argparse.Namespace, splits: list[str] | None) -> Inference:
    """:func:`rankopt.engine.inference.load_for_inference` of ``add_model_data_arguments``' values (checkpoint,
    dataset, root, transform, image size, batch size, device), after applying ``--threads``."""
    from rankopt.engine.inference import load_for_inference

    apply_threads(args)
    return load_for_inference(args.checkpoint, splits, device=args.device, dataset=args.dataset, root=args.root,
                              transform=args.transform, image_size=args.image_size, batch_size=args.batch_size)


def runtime_network(args: argparse.Namespace, network: Any, preprocessing: dict[str, Any], device: Any) -> Any:
    """``network`` on ``--runtime`` (:func:`rankopt.export.runtimes.prepare_network`, cache key: the fingerprint of
    ``network`` with ``preprocessing``), the runtime said on stderr."""
    import sys

    from rankopt.export.runtimes import default_runtime, prepare_network
    from rankopt.models.fingerprint import model_fingerprint

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    module, runtime = prepare_network(network, preprocessing, model_fingerprint(network, preprocessing),
                                      runtime=args.runtime or default_runtime(), device=device,
                                      threads=args.threads, say=say)
    say(f"runtime: {runtime.describe()}" + (f" ({runtime.note})" if runtime.note else ""))
    return module
