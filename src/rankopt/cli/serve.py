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
from rankopt.serve.limits import Limits
from rankopt.serve.settings import HTTP_PARSERS, HostRule, Settings

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
    service, limits = Settings(), Limits()
    parser.add_argument("--host", default=service.hosts.bound,
                        help=f"interface to bind ({service.hosts.bound}; others need --token)")
    parser.add_argument("--port", type=bounded(int, 1, 65535), default=service.port,
                        help=f"port, 1-65535 ({service.port})")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="also answer requests whose Host header is NAME (repeatable; by default only the bound "
                             "address, localhost and the loopback addresses: a page elsewhere cannot rebind its "
                             "name to this service)")
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                        help=f"bearer token every API request must send (default: ${TOKEN_ENV})")
    add_index_model_options(parser, batches=False, threads_default="1, steady when other processes share the cores; "
                                                                   "up to one per core on a machine of its own")
    upload_mb = limits.max_upload_bytes / 2**20
    parser.add_argument("--max-upload-mb", type=bounded(float, 1e-3), default=upload_mb, metavar="MB",
                        help=f"request body limit ({upload_mb:g})")
    parser.add_argument("--max-pixels", type=bounded(int, 1), default=limits.max_pixels, metavar="N",
                        help=f"largest image width x height accepted ({limits.max_pixels})")
    parser.add_argument("--max-k", type=bounded(int, 1), default=limits.max_k, metavar="K",
                        help=f"largest k a query may ask ({limits.max_k})")
    parser.add_argument("--max-images", type=bounded(int, 1), default=limits.max_images, metavar="N",
                        help=f"images one POST /embed may send ({limits.max_images})")
    parser.add_argument("--formats", metavar="F,F,...",
                        help=f"image formats accepted, Pillow's names (default: {','.join(limits.formats)})")
    parser.add_argument("--max-batch", type=bounded(int, 1), default=service.max_batch, metavar="B",
                        help=f"images per forward pass ({service.max_batch})")
    parser.add_argument("--batch-wait-ms", type=bounded(float, 0), default=service.max_wait_ms, metavar="MS",
                        help="how long a forward waits for uploads still being decoded, once one image is queued "
                             f"({service.max_wait_ms:g})")
    parser.add_argument("--reload-every", type=bounded(float, 0), default=service.reload_every_s, metavar="S",
                        help=f"seconds between checks of the index folder for changes ({service.reload_every_s:g}; "
                             "0: never)")
    parser.add_argument("--request-timeout", type=bounded(float, 1e-3), default=service.request_timeout_s,
                        metavar="S", help="a request must arrive whole within S seconds, else its connection is "
                                          f"closed ({service.request_timeout_s:g})")
    parser.add_argument("--http", choices=HTTP_PARSERS, default=service.http,
                        help="the HTTP parser: httptools (C) where installed, else h11 (pure Python) "
                             f"({service.http})")
    parser.add_argument("--max-connections", type=bounded(int, 1), default=service.max_connections, metavar="N",
                        help=f"open connections at most; more are answered 503 ({service.max_connections})")
    parser.add_argument("--cors", action="append", default=[], metavar="ORIGIN",
                        help="allow this origin by CORS (repeatable; default: CORS off)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankopt.serve import require_extra

    require_extra()  # else an ImportError with the install line (printed by rankopt.cli.main)
    from rankopt.runtime import freeze_imports
    from rankopt.serve.images import check_formats
    from rankopt.serve.server import serve

    freeze_imports()

    limits = Limits(max_upload_bytes=int(args.max_upload_mb * 2**20), max_pixels=args.max_pixels, max_k=args.max_k,
                    max_images=args.max_images,
                    **({} if args.formats is None else {"formats": check_formats(args.formats)}))
    settings = Settings(limits=limits, token=args.token or None, hosts=HostRule(args.host, tuple(args.allow_host)),
                        cors_origins=tuple(args.cors), max_batch=args.max_batch, max_wait_ms=args.batch_wait_ms,
                        reload_every_s=args.reload_every, threads=args.threads, runtime=args.runtime,
                        port=args.port, request_timeout_s=args.request_timeout, http=args.http,
                        max_connections=args.max_connections)
    serve(args.index, settings, checkpoint=args.checkpoint, onnx=args.onnx, device=args.device)
    return 0
