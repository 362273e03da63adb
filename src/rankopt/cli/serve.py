"""``rankopt serve INDEX_DIR [--host 127.0.0.1] [--port 8080] [--token T]``: the HTTP search service.

Serves the index folder written by ``rankopt index`` (:mod:`rankopt.serve`): ``POST /search``,
``GET /items/{id}``, ``/thumbnails/{id}``, ``/health``, ``/metrics`` and the search page at ``/``.
Image queries are embedded by the index's checkpoint (or ``--checkpoint`` / ``--onnx``, whose
fingerprint must be the index's); the index is reloaded when the folder changes. Binding another
host than the loopback needs ``--token`` (or ``RANKOPT_SERVE_TOKEN``). Needs ``pip install 'rankopt[serve]'``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from rankopt.cli._model import add_index_argument, add_index_model_options

TOKEN_ENV = "RANKOPT_SERVE_TOKEN"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve an index over HTTP: search API and search page",
        description="Serve an index folder (rankopt index) over HTTP: POST /search with an image upload, "
                    "JSON base64 image, vector or item id; GET /items/ID, /thumbnails/ID, /health, /metrics; "
                    "the search page at /.")
    add_index_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (127.0.0.1; others need --token)")
    parser.add_argument("--port", type=int, default=8080, help="port (8080)")
    parser.add_argument("--token", default=os.environ.get(TOKEN_ENV),
                        help=f"bearer token every API request must send (default: ${TOKEN_ENV})")
    add_index_model_options(parser, batches=False)
    parser.add_argument("--max-upload-mb", type=float, default=20.0, metavar="MB", help="request body limit (20)")
    parser.add_argument("--max-pixels", type=int, default=50_000_000, metavar="N",
                        help="largest image width x height accepted (50000000)")
    parser.add_argument("--max-k", type=int, default=1000, metavar="K", help="largest k a query may ask (1000)")
    parser.add_argument("--max-batch", type=int, default=32, metavar="B", help="images per forward pass (32)")
    parser.add_argument("--batch-wait-ms", type=float, default=2.0, metavar="MS",
                        help="how long a forward waits for uploads still being decoded, once one image is queued (2)")
    parser.add_argument("--reload-every", type=float, default=1.0, metavar="S",
                        help="seconds between checks of the index folder for changes (1; 0: never)")
    parser.add_argument("--cors", action="append", default=[], metavar="ORIGIN",
                        help="allow this origin by CORS (repeatable; default: CORS off)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankopt.serve import require_extra

    require_extra()  # else an ImportError with the install line (printed by rankopt.cli.main)
    from rankopt.serve.app import Settings
    from rankopt.serve.limits import Limits
    from rankopt.serve.server import serve

    limits = Limits(max_upload_bytes=int(args.max_upload_mb * 2**20), max_pixels=args.max_pixels, max_k=args.max_k)
    settings = Settings(limits=limits, token=args.token or None, cors_origins=tuple(args.cors), max_batch=args.max_batch,
                        max_wait_ms=args.batch_wait_ms, reload_every_s=args.reload_every)
    serve(args.index, host=args.host, port=args.port, settings=settings, checkpoint=args.checkpoint, onnx=args.onnx,
          device=args.device)
    return 0
