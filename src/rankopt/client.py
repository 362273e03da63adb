"""A Python client of ``rankopt serve``: :class:`SearchClient`.

    from rankopt.client import SearchClient, NotFoundError
    with SearchClient("http://127.0.0.1:8080", token=None) as service:
        hits = service.search("query.jpg", k=5, filter={"shop": "north"})["results"]
        more = service.search(id=hits[0]["id"], k=5)                # more like this
        vectors = service.embed(["a.jpg", "b.png"]).embeddings      # (2, D) float32, the service's model
        jpeg = service.thumbnail(hits[0]["id"])

One ``httpx.Client`` per :class:`SearchClient`: its connections are kept open between calls (closed by
:meth:`SearchClient.close` or the ``with`` block). The service's answers come back as it sends them (the
records of ``rankopt search --json``, the items of ``GET /items/{id}``); each of its errors, ``{"error": message}``
with a 4xx or 5xx status, is raised as a :class:`ServiceError` subclass chosen by the status. Needs ``httpx``
(``pip install 'rankopt[serve]'``); nothing else of rankopt is imported.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

DEFAULT_TIMEOUT_S = 30.0
KEEP_ALIVE_S = 4.0
"""How long an idle connection is kept: under the service's 5 s (``rankopt.serve.server.KEEP_ALIVE_S``), so the
client never sends on a connection the service is closing."""


class ServiceError(Exception):
    """An error answer of the service: ``status`` (None when no answer came) and the service's ``message``."""

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(f"{status}: {message}" if status is not None else message)
        self.status = status
        self.message = message


class BadRequestError(ServiceError):
    """400, 405, 415, 421 and other 4xx: the request itself is wrong (not an image, a bad ``k``, vector or filter)."""


class AuthError(ServiceError):
    """401 or 403: the bearer token is missing or wrong."""


class NotFoundError(ServiceError):
    """404: no item with that id (or its image cannot be read)."""


class TooLargeError(ServiceError):
    """413: over a limit of the service (body bytes, image pixels, images per request, filter values)."""


class BusyError(ServiceError):
    """429 or 503: the service is overloaded (e.g. over ``--max-connections``); try again later."""


class UnreachableError(ServiceError):
    """No answer: the connection failed or timed out (``status`` is None)."""


def error_for(status: int, message: str) -> ServiceError:
    """The :class:`ServiceError` subclass of an error ``status``."""
    if status in (401, 403):
        return AuthError(status, message)
    if status == 404:
        return NotFoundError(status, message)
    if status == 413:
        return TooLargeError(status, message)
    if status in (429, 503):
        return BusyError(status, message)
    if 400 <= status < 500:
        return BadRequestError(status, message)
    return ServiceError(status, message)


@dataclass(frozen=True)
class Embedded:
    """What ``POST /embed`` answered: ``embeddings`` ``(N, dim)`` float32 (a numpy array), in the order of the
    images, with their ``names`` and the model's ``fingerprint`` (equal to the index's)."""

    fingerprint: str
    dim: int
    names: list[str]
    embeddings: Any


class SearchClient:
    """A synchronous client of the service at ``url`` (``http://host:port``); ``token``: sent as
    ``Authorization: Bearer TOKEN`` (a service started with ``--token`` needs it everywhere but ``/health``);
    ``timeout``: seconds per request."""

    def __init__(self, url: str, token: str | None = None, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        try:
            import httpx  # the serve extra's HTTP client, needed by this module only
        except ImportError:
            raise ImportError("rankopt.client needs httpx: pip install 'rankopt[serve]'") from None
        self._httpx = httpx
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout,
                                  limits=httpx.Limits(keepalive_expiry=KEEP_ALIVE_S))

    def __enter__(self) -> SearchClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the kept connections."""
        self._http.close()

    def __repr__(self) -> str:
        return f"SearchClient({self.url!r})"

    # ------------------------------------------------------------------ routes
    def search(self, image_or_vector: Any = None, k: int = 10, filter: Any = None, *, id: str | int | None = None
               ) -> dict[str, Any]:
        """The service's record of one query (``{"query", "results": [{"rank", "id", "path", "score", "label",
        ...}], "note"?}``): ``image_or_vector`` an image (a file path, its bytes, a PIL image) or an embedding (a 1-d
        numpy array, torch tensor or list of numbers of the index's dimension), or ``id=`` an indexed item's id
        (more like this). ``filter``: ``{column: value or [values]}``, ``"column=value"`` or a list of them."""
        if (image_or_vector is None) == (id is None):
            raise ValueError("give one query: an image, a vector, or id=ITEM_ID")
        options: dict[str, Any] = {"k": k} if filter is None else {"k": k, "filter": filter}
        if id is not None:
            return self._json("POST", "/search", json={"id": str(id), **options})
        vector = _as_vector(image_or_vector)
        if vector is not None:
            return self._json("POST", "/search", json={"vector": vector, **options})
        name, data, mime = _as_upload(image_or_vector)
        fields = {"k": str(k)}
        if filter is not None:
            fields["filter"] = filter if isinstance(filter, str) else json.dumps(filter)
        return self._json("POST", "/search", files={"image": (name, data, mime)}, data=fields)

    def embed(self, images: Any) -> Embedded:
        """The service's embeddings of ``images`` (one image or a list: file paths, bytes, PIL images), by its
        model and preprocessing, as its searches embed a query; one request (the service takes up to
        ``max_images``, 64 by default, within its body limit; more: :class:`TooLargeError`)."""
        import numpy as np

        many = images if isinstance(images, (list, tuple)) else [images]
        if not many:
            raise ValueError("give at least one image")
        files = [("image", _as_upload(image)) for image in many]
        answer = self._json("POST", "/embed", files=files)
        embeddings = np.asarray(answer["embeddings"], dtype=np.float32).reshape(len(many), answer["dim"])
        return Embedded(answer["fingerprint"], answer["dim"], list(answer["names"]), embeddings)

    def item(self, id: str | int) -> dict[str, Any]:
        """An indexed item: ``{"id", "path", "label", "metadata"?, ...}``."""
        return self._json("GET", f"/items/{_quoted(id)}")

    def items(self, ids: Any) -> list[dict[str, Any]]:
        """The items of ``ids`` in order (one ``GET /items/{id}`` each, on the kept connection; the service has no
        listing route); an unknown id raises :class:`NotFoundError`."""
        return [self.item(item_id) for item_id in ids]

    def thumbnail(self, id: str | int) -> bytes:
        """A small JPEG of an indexed item."""
        return self._request("GET", f"/thumbnails/{_quoted(id)}").content

    def health(self) -> dict[str, Any]:
        """``{"status", "items", "dim", "fingerprint", "search", "version", "loaded_utc", "runtime", "reload_failed"}``
        (no token needed)."""
        return self._json("GET", "/health")

    # ------------------------------------------------------------------ plumbing
    def _json(self, method: str, path: str, **options: Any) -> Any:
        return self._request(method, path, **options).json()

    def _request(self, method: str, path: str, **options: Any) -> Any:
        try:
            response = self._http.request(method, path, **options)
        except self._httpx.TransportError as err:
            raise UnreachableError(None, f"{method} {self.url}{path}: {type(err).__name__}: {err}") from err
        if response.status_code >= 400:
            raise error_for(response.status_code, _message(response))
        return response


def _message(response: Any) -> str:
    """The service's ``{"error": message}``, or the answer's text (a proxy's or uvicorn's page)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return body["error"]
    return response.text.strip()[:500] or response.reason_phrase


def _quoted(item_id: str | int) -> str:
    """An item id as one path segment (``/``, ``..`` and ``%`` escaped: ids are looked up, never paths)."""
    return quote(str(item_id), safe="")


def _as_vector(query: Any) -> list[float] | None:
    """``query`` as a list of float32 values when it is an embedding (a torch tensor, a numpy array, a list or
    tuple of numbers); None when it is an image."""
    if isinstance(query, (str, bytes, bytearray, memoryview, os.PathLike)):
        return None
    if hasattr(query, "detach"):  # a torch tensor (torch is not imported here)
        query = query.detach().cpu().numpy()
    elif isinstance(query, (list, tuple)):
        pass
    elif not hasattr(query, "__array_interface__") or hasattr(query, "getpixel"):  # a PIL image has one too
        return None
    import numpy as np

    array = np.asarray(query, dtype=np.float32)
    if array.ndim == 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 1:
        raise ValueError(f"a query vector is 1-d (one embedding), got shape {tuple(array.shape)} (an image held as "
                         "an array: pass PIL.Image.fromarray(array))")
    return array.astype(np.float64).tolist()  # exact float32 values as JSON numbers


def _as_upload(image: Any) -> tuple[str, bytes, str]:
    """``(file name, bytes, media type)`` of an image given as a file path, its bytes or a PIL image (sent as a
    lossless PNG)."""
    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        return path.name, path.read_bytes(), "application/octet-stream"
    if isinstance(image, (bytes, bytearray, memoryview)):
        return "upload", bytes(image), "application/octet-stream"
    if hasattr(image, "save") and hasattr(image, "getpixel"):  # a PIL image
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return "image.png", buffer.getvalue(), "image/png"
    raise TypeError(f"an image is a file path, bytes or a PIL image, not {type(image).__name__}")
