"""The service's front door: ASGI middleware that every request passes before any route.

In order: the ``Host`` header must name this service (:class:`HostRule`: a web page on another site that
rebinds its own name to 127.0.0.1 gets 421, so it cannot read the index through the user's browser); a
declared ``Content-Length`` over the body limit is refused (413) before the body is read, and a streamed
body is cut off at the limit; every answer carries the security headers (:data:`SECURITY_HEADERS`:
nothing may frame the page, load scripts or styles from elsewhere, or sniff a type); every request is
counted in the metrics under closed labels (its route's template, its method).
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse

from rankopt.serve.limits import ApiError
from rankopt.serve.metrics import OTHER, Metrics

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARDS = frozenset({"0.0.0.0", "::", ""})
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
                           "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


def host_name(header: str) -> str | None:
    """The name of a ``Host`` header (``name``, ``name:port``, ``[v6]`` or ``[v6]:port``), lower-case without a
    trailing dot; None when it is not of that form."""
    header = header.strip().lower()
    if header.startswith("["):
        name, sep, rest = header[1:].partition("]")
        return name if sep and (not rest or rest[:1] == ":" and rest[1:].isdigit()) else None
    name, _, port = header.partition(":")
    if port and not (port.isascii() and port.isdigit()) or not name:
        return None
    return name.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class HostRule:
    """The ``Host`` names a request may give: the address the service is bound to, ``localhost``, the loopback
    addresses and ``allowed`` names; bound to every interface (``0.0.0.0``, ``::``), any IP address too (a
    browser sends an IP as Host only when it was asked for that address: no name was rebound). A request
    without a ``Host`` (HTTP/1.0) is not from a browser and passes."""

    bound: str = "127.0.0.1"
    allowed: tuple[str, ...] = ()

    def names(self) -> frozenset[str]:
        bound = () if self.bound in WILDCARDS else (self.bound.strip("[]").lower(),)
        return frozenset({*LOCAL_NAMES, *bound, *(name.lower().rstrip(".") for name in self.allowed)})

    def accepts(self, header: str | None) -> bool:
        if header is None:
            return True
        name = host_name(header)
        if name is None:
            return False
        return name in self.names() or self.bound in WILDCARDS and _is_ip(name)


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
