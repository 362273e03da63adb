"""Small JPEG thumbnails of indexed items, cached in memory.

Only the index's own item paths are ever opened: the service looks an item up by its id and passes
that item's recorded path here; nothing from a request becomes a path.
"""

from __future__ import annotations

import io
import os
import threading
from collections import OrderedDict

from PIL import Image

from rankopt.viz.pictures import thumbnail

JPEG_QUALITY = 85


class ThumbnailCache:
    """``get(path) -> JPEG bytes`` (at most 128 px a side, :func:`rankopt.viz.pictures.thumbnail`), the
    ``capacity`` most recent kept; an entry is redrawn when its file's size or mtime changed."""

    def __init__(self, capacity: int = 2048) -> None:
        self.capacity = capacity
        self._cache: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str) -> bytes:
        """The thumbnail of the image file ``path``; ``FileNotFoundError`` when it cannot be read."""
        try:
            stat = os.stat(path)
            key = (path, stat.st_mtime_ns, stat.st_size)
        except OSError:
            key = (path, -1, -1)  # a zip member (archive.zip/member.png) or a missing file: thumbnail() decides
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        buffer = io.BytesIO()
        Image.fromarray(thumbnail(path)).save(buffer, format="JPEG", quality=JPEG_QUALITY)
        data = buffer.getvalue()
        with self._lock:
            self._cache[key] = data
            while len(self._cache) > self.capacity:
                self._cache.popitem(last=False)
        return data
