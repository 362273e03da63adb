"""The ``rankopt`` command line: one sub-command per module of this package.

Each module exposes ``register(subparsers)``, which adds its sub-command(s) and
sets ``func`` to the function that runs it. Modules keep heavy imports inside
their run functions so that ``rankopt --help`` stays instant.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
from collections.abc import Sequence

SUBCOMMAND_MODULES = ("train", "convert", "evaluate", "embed", "evaluate_embeddings", "datasets", "compare", "report",
                      "benchmark", "study", "whiten", "index", "index_change", "index_transfer", "search", "calibrate",
                      "serve", "export", "weights", "fit")


def build_parser() -> argparse.ArgumentParser:
    from rankopt import __version__

    parser = argparse.ArgumentParser(
        prog="rankopt",
        description="Train and evaluate image-retrieval embeddings by directly optimizing rank metrics.",
    )
    parser.add_argument("--version", action="version", version=f"rankopt {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(f"rankopt.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from rankopt.runtime import keep_allocations

    keep_allocations()  # CNN activations reuse freed memory instead of faulting in fresh pages
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, IsADirectoryError, KeyError,
            TypeError, FloatingPointError, ImportError) as err:  # ImportError: an optional extra is missing (its install hint)
        # Bad input: a clear one-line error, no traceback. RANKOPT_DEBUG=1 shows it.
        import os

        if os.environ.get("RANKOPT_DEBUG"):
            raise
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"rankopt {args.command}: error: {msg}", file=sys.stderr)
        return 1


def console_main() -> int:
    """The ``rankopt`` command (console script, ``python -m rankopt``): :func:`main` with the garbage collector
    off until the command's long pass starts (:func:`rankopt.runtime.pause_collection`), then every live object is
    put out of the collector's reach (``gc.freeze``) before the interpreter exits, whose last collection would walk
    them all before the system frees the memory anyway (1.0 s to 0.3 s after indexing 2,000 photos:
    ``benchmarks/results/runtimes.md``). Not in :func:`main`, which a test or a program may call many times."""
    from rankopt.runtime import pause_collection

    pause_collection()
    code = main()
    gc.freeze()
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(console_main())
