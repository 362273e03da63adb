"""What runs a sub-command's forwards: ``--runtime`` (PyTorch or onnxruntime) and ``--threads``."""

from __future__ import annotations

import argparse


def add_runtime_argument(parser: argparse.ArgumentParser) -> None:
    """``--runtime auto|torch|onnx`` (:mod:`rankopt.export.runtimes`)."""
    parser.add_argument("--runtime", choices=("auto", "torch", "onnx"), default=None,
                        help="what runs the network's forward: onnx (onnxruntime, the model exported once and "
                             "checked against PyTorch, cached), torch, or auto: onnxruntime on a CPU where it is "
                             "installed and keeps parity, else PyTorch (default: $RANKOPT_RUNTIME, else auto)")


TORCH_THREADS = "torch's, one per core"


def threads_count(text: str) -> int:
    """``--threads``' value: an integer >= 1 (argparse type)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a number of threads >= 1, got {text!r}")
    return int(text)


def add_threads_argument(parser: argparse.ArgumentParser, default: str = TORCH_THREADS) -> None:
    """``--threads N``: torch's intra-op threads (:func:`apply_threads`)."""
    parser.add_argument("--threads", type=threads_count, metavar="N",
                        help=f"torch's intra-op threads for this command (default: {default})")


def apply_threads(args: argparse.Namespace) -> None:
    """``torch.set_num_threads(--threads)`` for the calling thread's torch operations, when given."""
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
