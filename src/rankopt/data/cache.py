"""rankopt's own cache directory (never the user's dataset folder).

``$RANKOPT_CACHE`` if set, else ``$XDG_CACHE_HOME/rankopt``, else ``~/.cache/rankopt``.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """Return (and create) ``<cache root>/<parts...>``."""
    env = os.environ.get("RANKOPT_CACHE")
    if env:
        root = Path(env).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "rankopt"
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
