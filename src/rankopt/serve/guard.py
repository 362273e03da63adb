"""The service's front door: ASGI middleware that every request passes before any route.

In order: the ``Host`` header must name this service (:class:`HostRule`: a web page on another site that
rebinds its own name to 127.0.0.1 gets 421, so it cannot read the index through the user's browser); a
declared ``Content-Length`` over the body limit is refused (413) before the body is read, and a streamed
body is cut off at the limit; every answer carries the security headers (:data:`SECURITY_HEADERS`:
nothing may frame the page, load scripts or styles from elsewhere, or sniff a type); every request is
counted in the metrics under closed labels (its route's template, its method).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from fastapi.responses import JSONResponse

from rankopt.serve.errors import ApiError
from rankopt.serve.prometheus import OTHER, Metrics
from rankopt.serve.settings import HostRule

CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
                           "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


def error_response(error: ApiError) -> JSONResponse:
    """``{"error": message}`` with the error's status."""
    return JSONResponse({"error": error.message}, status_code=error.status)


class Guard:
    """ASGI middleware: the checks of the module docstring; ``routes``: the route templates metrics label by."""

    def __init__(self, app: Any, *, metrics: Metrics, max_body: int, hosts: HostRule, routes: Iterable[str]) -> None:
        self.app, self.metrics, self.max_body, self.hosts = app, metrics, max_body, hosts
        self.routes = frozenset(routes)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status, received = time.perf_counter(), 500, 0

        async def send_guarded(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {**message, "headers": [*message.get("headers", []), *SECURITY_HEADERS]}
            await send(message)

        async def counted() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body:
                raise ApiError(413, f"the request body is over the limit of {self.max_body} bytes")
            return message

        try:
            headers = dict(scope["headers"])
            host = headers.get(b"host")
            length = headers.get(b"content-length", b"0").decode("latin-1")
            if not self.hosts.accepts(None if host is None else host.decode("latin-1")):
                shown = host.decode("latin-1")[:100] if host is not None else ""
                error = ApiError(421, f"this service does not answer for host {shown!r}: start it with "
                                      f"--allow-host NAME to serve a name other than localhost or its address")
            elif not (length.isascii() and length.isdigit()):
                error = ApiError(400, f"bad Content-Length {length[:40]!r}")
            elif int(length) > self.max_body:
                error = ApiError(413, f"the request body ({length} bytes) is over the limit of {self.max_body} bytes")
            else:
                await self.app(scope, counted, send_guarded)
                return
            await error_response(error)(scope, receive, send_guarded)
        finally:
            route = getattr(scope.get("route"), "path", OTHER)
            self.metrics.observe_request(route if route in self.routes else OTHER, scope["method"], status,
                                         time.perf_counter() - start)
