"""``rankopt serve``: an HTTP search service over an index folder, with a search page.

    from rankopt.serve import IndexHolder, Settings, create_app
    from rankopt.serve.settings import HostRule
    app = create_app(IndexHolder("photos.index"), Settings(token="secret", hosts=HostRule("0.0.0.0", ("photos.lan",))))
    # any ASGI server runs it; requests must name one of the hosts (else 421)

Pieces: :mod:`~rankopt.serve.app` (routes, errors, token), :mod:`~rankopt.serve.guard` (before any route: Host
rule, body limit, security headers, metrics labels), :mod:`~rankopt.serve.batcher` (micro-batching of concurrent
image queries), :mod:`~rankopt.serve.holder` (the served index and its reload when the folder changes),
:mod:`~rankopt.serve.limits` (input limits), :mod:`~rankopt.serve.requests` (request checks),
:mod:`~rankopt.serve.errors` (refusals), :mod:`~rankopt.serve.images` (image decoding within limits),
:mod:`~rankopt.serve.prometheus` (Prometheus text), :mod:`~rankopt.serve.openapi` (the API's description),
:mod:`~rankopt.serve.thumbnails`, :mod:`~rankopt.serve.server` (bind check, slow clients, uvicorn) and
``static/`` (the page). Needs the ``serve`` extra (FastAPI, uvicorn, python-multipart): :func:`require_extra`
says how to install it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankopt.serve.app import create_app
    from rankopt.serve.holder import IndexHolder
    from rankopt.serve.server import serve
    from rankopt.serve.settings import Settings

__all__ = ["IndexHolder", "Settings", "create_app", "require_extra", "serve"]
_EXPORTS = {"IndexHolder": "holder", "Settings": "settings", "create_app": "app", "serve": "server"}


def require_extra() -> None:
    """Raise an ``ImportError`` with the install line when a package of the ``serve`` extra is missing."""
    import importlib.util

    packages = {"fastapi": "fastapi", "uvicorn": "uvicorn", "python_multipart": "python-multipart"}
    missing = [package for module, package in packages.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise ImportError(f"rankopt serve needs {', '.join(missing)}: pip install 'rankopt[serve]'")


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rankopt.serve' has no attribute {name!r}")
    require_extra()
    import importlib

    return getattr(importlib.import_module(f"rankopt.serve.{_EXPORTS[name]}"), name)
