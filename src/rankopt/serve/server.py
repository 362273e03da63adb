"""Start the service: :func:`serve` checks where it may bind, loads the index and runs uvicorn."""

from __future__ import annotations

import os

from rankopt.serve.app import Settings, create_app
from rankopt.serve.holder import IndexHolder

LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def check_host(host: str, token: str | None) -> None:
    """Binding anything but the loopback interface needs a token: a ``ValueError`` otherwise."""
    if host not in LOCAL_HOSTS and not token:
        raise ValueError(f"binding {host!r} makes the index reachable from other machines: pass --token T "
                         f"(clients then send Authorization: Bearer T), or bind 127.0.0.1")


def serve(index_dir: str | os.PathLike[str], *, host: str = "127.0.0.1", port: int = 8080,
          settings: Settings | None = None, checkpoint: str | None = None, onnx: str | None = None,
          device: str = "auto", log_level: str = "info") -> None:
    """Serve the index folder ``index_dir`` on ``host:port`` until interrupted."""
    import uvicorn

    settings = settings or Settings()
    check_host(host, settings.token)
    holder = IndexHolder(index_dir, checkpoint=checkpoint, onnx=onnx, device=device)
    index = holder.current.index
    shown = f"[{host}]" if ":" in host else host
    print(f"serving {index_dir}: {len(index)} items, {index.dim}-d, {index.backend}, fingerprint {index.fingerprint}, "
          f"queries embedded on {holder.current.embedder.device}\nopen http://{shown}:{port}/", flush=True)
    uvicorn.run(create_app(holder, settings), host=host, port=port, log_level=log_level, access_log=False)
