"""What the service is set to (:class:`Settings`, one place for every setting and its default: ``rankopt serve``'s
options read their defaults here), and which ``Host`` names it answers (:class:`HostRule`). No web framework is
imported here, so the command line can read the defaults without the ``serve`` extra."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass

from rankopt.serve.limits import Limits

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
HTTP_PARSERS = ("auto", "httptools", "h11")
"""``rankopt serve --http`` (:func:`rankopt.serve.server.http_parser`)."""
WILDCARDS = frozenset({"0.0.0.0", "::", ""})


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


@dataclass(frozen=True)
class Settings:
    """``token``: required as a bearer token when set; ``cors_origins``: origins allowed by CORS (none:
    off); ``max_batch`` / ``max_wait_ms``: micro-batching (:class:`~rankopt.serve.batcher.MicroBatcher`);
    ``reload_every_s``: how often the index folder's identity is polled (0: never); ``hosts``: the ``Host`` names
    answered (:class:`HostRule`); ``threads``: intra-op threads
    of the torch thread (transforms, forwards, searches; default: :func:`~rankopt.serve.batcher.default_threads`),
    and of onnxruntime's forward when it runs the model; ``runtime``: what runs the forward (``auto``, ``torch``,
    ``onnx``; :mod:`rankopt.export.runtimes`); ``workers``: threads decoding uploads and thumbnails; ``port``: the
    port bound (the interface is ``hosts.bound``); ``request_timeout_s``: a request must arrive whole within it,
    else its connection is closed; ``http``: the HTTP parser (``auto``: httptools where installed, else h11;
    :func:`rankopt.serve.server.http_parser`); ``max_connections``: open connections at most (more are answered
    503). The command line's defaults are these."""

    limits: Limits = Limits()
    token: str | None = None
    hosts: HostRule = HostRule()
    cors_origins: Sequence[str] = ()
    max_batch: int = 32
    max_wait_ms: float = 2.0
    reload_every_s: float = 1.0
    threads: int | None = None
    runtime: str | None = None
    workers: int = os.cpu_count() or 1
    port: int = 8080
    request_timeout_s: float = 30.0
    http: str = "auto"
    max_connections: int = 512
