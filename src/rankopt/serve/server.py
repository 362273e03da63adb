"""Start the service: :func:`serve` checks where it may bind, loads the index and runs uvicorn.

HTTP is parsed by httptools where it is installed (the ``serve`` extra installs it), else by h11 (pure Python);
uvicorn runs its event loop on uvloop where that is installed (also in the extra, not on Windows). One uploaded
query's latency with both, against h11 on asyncio: 0.16-0.51 ms lower at a p50 of about 12.5 ms in three runs of
requests alternating between the servers (``benchmarks/results/serve_ab.md``).

Connections are bounded: a request must arrive whole (headers and body) within ``request_timeout_s`` of the
connection opening or of the previous answer, else the connection is closed (a client trickling bytes holds
nothing for long); an idle keep-alive connection closes after 5 s; at most ``max_connections`` are open at
once (uvicorn answers 503 beyond).
"""

from __future__ import annotations

import os
from typing import Any

from rankopt.runtime import settle_heap
from rankopt.serve.app import create_app
from rankopt.serve.batcher import default_threads
from rankopt.serve.holder import IndexHolder
from rankopt.serve.settings import HTTP_PARSERS, LOCAL_NAMES, Settings

KEEP_ALIVE_S = 5


def check_host(host: str, token: str | None) -> None:
    """Binding anything but the loopback interface needs a token: a ``ValueError`` otherwise."""
    if host not in LOCAL_NAMES and not token:
        raise ValueError(f"binding {host!r} makes the index reachable from other machines: pass --token T "
                         f"(clients then send Authorization: Bearer T), or bind 127.0.0.1")


def http_parser(choice: str = "auto") -> str:
    """The HTTP/1.1 parser ``choice`` names; ``auto``: httptools where it imports, else h11. An ``ImportError`` with
    the install line when httptools is asked for and missing."""
    if choice not in HTTP_PARSERS:
        raise ValueError(f"the HTTP parser is one of {', '.join(HTTP_PARSERS)}, not {choice!r}")
    if choice == "h11":
        return choice
    try:
        import httptools  # noqa: F401, PLC0415 - optional
    except ImportError:
        if choice == "httptools":
            raise ImportError("--http httptools needs httptools: pip install httptools (or 'rankopt[serve]')") from None
        return "h11"
    return "httptools"


def event_loop() -> str:
    """The event loop uvicorn runs (its ``loop="auto"``): uvloop where it imports, else asyncio's."""
    try:
        import uvloop  # noqa: F401, PLC0415 - optional
    except ImportError:
        return "asyncio"
    return "uvloop"


def timed_protocol(request_timeout_s: float, parser: str = "auto") -> type:
    """uvicorn's HTTP/1.1 protocol (:func:`http_parser`'s) closing a connection whose request is not whole
    ``request_timeout_s`` after the connection opened or its previous answer was sent."""
    if http_parser(parser) == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Protocol
    else:
        from uvicorn.protocols.http.h11_impl import H11Protocol as Protocol

    class TimedProtocol(Protocol):  # type: ignore[valid-type, misc]
        _deadline: Any = None

        def connection_made(self, transport: Any) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(request_timeout_s, self._too_slow)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _receiving(self) -> bool:
            """Still reading a request: none begun since the last answer, or its body unfinished."""
            return self.cycle is None or self.cycle.response_complete or self.cycle.more_body

        def _disarm_when_whole(self) -> None:
            if not self._receiving():
                self._disarm()  # the request is whole: the route may take the time it needs

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._disarm_when_whole()

        def on_response_complete(self) -> None:
            self._arm()  # then the next pipelined request is handled (which may be whole already)
            super().on_response_complete()
            self._disarm_when_whole()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _too_slow(self) -> None:
            self._deadline = None
            if self._receiving() and not self.transport.is_closing():
                self.transport.close()

    return TimedProtocol


def serve(index_dir: str | os.PathLike[str], settings: Settings | None = None, *, checkpoint: str | None = None,
          onnx: str | None = None, device: str = "auto", log_level: str = "info") -> None:
    """Serve the index folder ``index_dir`` on ``settings.hosts.bound``, port ``settings.port``, until interrupted."""
    import uvicorn

    settings = settings or Settings()
    host = settings.hosts.bound
    check_host(host, settings.token)
    parser = http_parser(settings.http)  # before the index loads: a missing parser fails at once
    holder = IndexHolder(index_dir, checkpoint=checkpoint, onnx=onnx, device=device,
                         threads=settings.threads or default_threads(), runtime=settings.runtime)
    index = holder.current.index
    shown = f"[{host}]" if ":" in host else host
    print(f"serving {index_dir}: {len(index)} items, {index.dim}-d, {index.backend}, fingerprint {index.fingerprint}, "
          f"queries embedded by {holder.current.embedder.active_runtime.describe()}, HTTP parsed by {parser} on "
          f"{event_loop()}\n"
          f"open http://{shown}:{settings.port}/",
          flush=True)
    settle_heap()
    uvicorn.run(create_app(holder, settings), host=host, port=settings.port, log_level=log_level, access_log=False,
                http=timed_protocol(settings.request_timeout_s, parser), timeout_keep_alive=KEEP_ALIVE_S,
                limit_concurrency=settings.max_connections)
