"""``rankopt serve INDEX_DIR [--host 127.0.0.1] [--port 8080] [--token T]``: the HTTP search service.

Serves the index folder written by ``rankopt index`` (:mod:`rankopt.serve`): ``POST /search``, ``POST /embed``,
``GET /items/{id}``, ``/thumbnails/{id}``, ``/health``, ``/metrics`` and the search page at ``/``
(:class:`rankopt.client.SearchClient` calls them from Python).
Image queries are embedded by the index's checkpoint (or ``--checkpoint`` / ``--onnx``, whose
fingerprint must be the index's); the index is reloaded when the folder changes. Binding another
host than the loopback needs ``--token`` (or ``RANKOPT_SERVE_TOKEN``). Needs ``pip install 'rankopt[serve]'``.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any

from rankopt.cli._model import add_index_argument, add_index_model_options

TOKEN_ENV = "RANKOPT_SERVE_TOKEN"


def bounded(kind: Callable[[str], float], low: float, high: float = math.inf) -> Callable[[str], Any]:
    """An argparse type: ``kind(text)`` within ``[low, high]``, else a clear usage error."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not low <= value <= high:
            shown = f"between {low} and {high}" if high < math.inf else f">= {low}"
            raise argparse.ArgumentTypeError(f"expected a value {shown}, got {text}")
        return value

    return parse


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve an index over HTTP: search API and search page",
        description="Serve an index folder (rankopt index) over HTTP: POST /search with an image upload, "
                    "JSON base64 image, vector or item id; POST /embed with images (their embeddings and the "
                    "model's fingerprint); GET /items/ID, /thumbnails/ID, /health, /metrics; the search page at /. "
                    "From Python: rankopt.client.SearchClient.")
    add_index_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1; others need --token)")
    parser.add_argument("--port", type=bounded(int, 1, 65535), default=8080, help="port, 1-65535 (8080)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="also answer requests whose Host header is NAME (repeatable; by default only the bound "
                             "address, localhost and the loopback addresses: a page elsewhere cannot rebind its "
                             "name to this service)")
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                        help=f"bearer token every API request must send (default: ${TOKEN_ENV})")
    add_index_model_options(parser, batches=False, threads_default="1, steady when other processes share the cores; "
                                                                   "up to one per core on a machine of its own")
    parser.add_argument("--max-upload-mb", type=bounded(float, 1e-3), default=20.0, metavar="MB",
                        help="request body limit (20)")
    parser.add_argument("--max-pixels", type=bounded(int, 1), default=50_000_000, metavar="N",
                        help="largest image width x height accepted (50000000)")
    parser.add_argument("--max-k", type=bounded(int, 1), default=1000, metavar="K",
                        help="largest k a query may ask (1000)")
    parser.add_argument("--max-images", type=bounded(int, 1), default=64, metavar="N",
                        help="images one POST /embed may send (64)")
    parser.add_argument("--formats", metavar="F,F,...",
                        help="image formats accepted, Pillow's names (default: JPEG,PNG,WEBP,GIF,BMP,TIFF)")
    parser.add_argument("--max-batch", type=bounded(int, 1), default=32, metavar="B",
                        help="images per forward pass (32)")
    parser.add_argument("--batch-wait-ms", type=bounded(float, 0), default=2.0, metavar="MS",
                        help="how long a forward waits for uploads still being decoded, once one image is queued (2)")
    parser.add_argument("--reload-every", type=bounded(float, 0), default=1.0, metavar="S",
                        help="seconds between checks of the index folder for changes (1; 0: never)")
    parser.add_argument("--request-timeout", type=bounded(float, 1e-3), default=30.0, metavar="S",
                        help="a request must arrive whole within S seconds, else its connection is closed (30)")
    parser.add_argument("--max-connections", type=bounded(int, 1), default=512, metavar="N",
                        help="open connections at most; more are answered 503 (512)")
    parser.add_argument("--cors", action="append", default=[], metavar="ORIGIN",
                        help="allow this origin by CORS (repeatable; default: CORS off)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankopt.serve import require_extra

    require_extra()  # else an ImportError with the install line (printed by rankopt.cli.main)
    from rankopt.serve.app import Settings
    from rankopt.serve.guard import HostRule
    from rankopt.serve.images import check_formats
    from rankopt.serve.limits import Limits
    from rankopt.serve.server import serve

    limits = Limits(max_upload_bytes=int(args.max_upload_mb * 2**20), max_pixels=args.max_pixels, max_k=args.max_k,
                    max_images=args.max_images,
                    **({} if args.formats is None else {"formats": check_formats(args.formats)}))
    settings = Settings(limits=limits, token=args.token or None, hosts=HostRule(args.host, tuple(args.allow_host)),
                        cors_origins=tuple(args.cors), max_batch=args.max_batch, max_wait_ms=args.batch_wait_ms,
                        reload_every_s=args.reload_every, threads=args.threads, runtime=args.runtime)
    serve(args.index, host=args.host, port=args.port, settings=settings, checkpoint=args.checkpoint, onnx=args.onnx,
          device=args.device, request_timeout_s=args.request_timeout, max_connections=args.max_connections)
    return 0
