"""The HTTP search service as a FastAPI application: :func:`create_app`.

=======================  =======================================================================
route                    answer
=======================  =======================================================================
``POST /search?k=K``     a multipart upload (file field ``image``, optional fields ``k``, ``filter``)
                         or JSON ``{"image_base64" | "vector" | "id", "k", "filter"}`` (``id``: an
                         indexed item's vector, "more like this") -> the query's record as
                         ``rankopt search --json`` writes it (``query``, ``results``), ``note`` when
                         ``k`` was capped to the index size
``POST /embed``          one or more images (multipart file fields ``image``, or JSON
                         ``{"images_base64": [...], "names": [...]}``) -> ``fingerprint``, ``dim``, ``names``
                         and ``embeddings``: the vectors the service searches with, made as for ``/search``
``GET /items/{id}``      the item: id, path, label, metadata
``GET /thumbnails/{id}`` a small JPEG of an indexed item (looked up by id, never a path)
``GET /health``          status, item count, fingerprint, last reload (no token needed; why it failed: with
                         the token); ``HEAD`` too
``GET /openapi.json``    the API's description (:mod:`rankopt.serve.openapi`)
``GET /metrics``         Prometheus text (:mod:`rankopt.serve.prometheus`)
``GET /``                the search page (``static/``: drop or pick an image, click a result); ``HEAD`` too
=======================  =======================================================================

Errors are ``{"error": message}`` with a 4xx status (:mod:`rankopt.serve.errors`); the service keeps
serving. Every request passes :mod:`rankopt.serve.guard` first (Host rule, body limit, security headers). With
a token every route but ``/``, ``/static``, ``/openapi.json`` and ``/health`` needs ``Authorization: Bearer TOKEN``
(compared in constant time). CORS is off unless origins are given.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from rankopt import __version__
from rankopt.serve.batcher import FollowUp, MicroBatcher
from rankopt.serve.holder import IndexHolder, Snapshot
from rankopt.serve.guard import Guard, error_response
from rankopt.serve.images import OpenedUpload, open_upload
from rankopt.serve.limits import Limits
from rankopt.serve.errors import ApiError
from rankopt.serve.requests import (
    check_embed_json,
    check_filter,
    check_json_query,
    check_k,
    check_vector,
    decode_base64,
    parse_json,
)
from rankopt.serve.prometheus import Metrics
from rankopt.serve.settings import Settings
from rankopt.serve.openapi import describe_routes
from rankopt.serve.thumbnails import ThumbnailCache

DEFAULT_K = 10
FORM_FIELDS = frozenset({"image", "k", "filter"})
EMBED_FORM_FIELDS = frozenset({"image"})
STATIC = "static"
OPENAPI_PATH = "/openapi.json"
_ABSENT = object()
"""``k`` not given in the body or form."""


@dataclass(frozen=True)
class Query:
    """A checked search request: ``kind`` ``"image"`` (``value``: the upload's bytes), ``"vector"`` (a ``(1, D)``
    tensor) or ``"id"`` (the item's row); ``name`` goes back as the record's ``query``."""

    kind: str
    value: Any
    name: str
    k: int
    filter: Any


class Service:
    """What the routes do, on the snapshot a request took when it arrived."""

    def __init__(self, holder: IndexHolder, settings: Settings, metrics: Metrics) -> None:
        self.holder = holder
        self.settings = settings
        self.limits = settings.limits
        self.metrics = metrics
        self.batcher = MicroBatcher(max_batch=settings.max_batch, max_wait_s=settings.max_wait_ms / 1000,
                                    threads=settings.threads, on_batch=metrics.observe_batch,
                                    on_stage=metrics.observe_stage)
        self.thumbnails = ThumbnailCache()
        self.heavy_lane = asyncio.Lock()
        """Held while a heavy upload decodes (:class:`~rankopt.serve.images.OpenedUpload`): one at a time."""
        self.pool: ThreadPoolExecutor | None = None

    async def run(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` on the worker threads (decoding, thumbnails: no torch, see :mod:`rankopt.serve.batcher`)."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Worker threads, the micro-batcher and the reload watcher, for the application's lifetime."""
        self.pool = ThreadPoolExecutor(self.settings.workers, thread_name_prefix="rankopt-serve")
        await self.batcher.start()
        watcher = asyncio.create_task(self._watch()) if self.settings.reload_every_s > 0 else None
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            await self.batcher.stop()
            self.pool.shutdown(wait=True)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.settings.reload_every_s)
            outcome = await loop.run_in_executor(None, self.holder.poll)
            if outcome is not None:
                self.metrics.observe_reload(outcome)

    # ------------------------------------------------------------------ search
    async def search(self, request: Request) -> dict[str, Any]:
        """The record of the request's query, searched in the snapshot served when it arrived. Every check
        (body, JSON, ``k``, filter, vector, item id) is done on a worker thread before the query reaches the
        torch thread; JSON is parsed there too, never on the event loop. A multipart upload is checked, opened and
        (unless heavy) decoded and transformed in one trip to a worker thread (each trip costs a thread's wake-up); a
        JSON image takes two, its kind known only once the body is parsed."""
        snapshot = self.holder.current
        media_type = self._media_type(request)
        k_param = request.query_params.get("k")
        if media_type == "multipart/form-data":
            files, fields = await self._read_form(request, FORM_FIELDS, ("k", "filter"), max_files=1)
            (name, data), = files
            return await self._searched(snapshot, self._form_query, snapshot, data, name, fields, k_param)
        if media_type != "application/json":
            raise self._unsupported(request, "/search", "an image upload")
        query = await self.run(self._checked_json, snapshot, await request.body(), k_param)
        if query.kind == "image":
            return await self._searched(snapshot, self._image_query, snapshot, query)
        record = (await self.batcher.call(self._search, snapshot, query.value, query))[0]
        record["query"] = query.name
        return record

    async def _searched(self, snapshot: Snapshot, prepare: Callable[..., tuple[Query, Ready]],
                        *args: Any) -> dict[str, Any]:
        """The record of an image query, ``prepare(*args)`` -> ``(query, its image Ready)`` on a worker thread:
        the image decoded, embedded with its batch, then searched right after the batch's forward."""
        with self.batcher.expecting():
            start = time.perf_counter()
            query, ready = await self.run(prepare, *args)
            image, transformed = await self._decoded(snapshot, ready, start)
        searched = FollowUp(("search", id(snapshot), query.k, repr(query.filter)),  # with the batch's like queries
                            lambda embeddings: self._search(snapshot, embeddings, query))
        record = await self.batcher.embed(snapshot, image, transformed=transformed, then=searched)
        record["query"] = query.name
        return record

    async def _decoded(self, snapshot: Snapshot, ready: Ready, start: float) -> tuple[Any, bool]:
        """The upload decoded and transformed where that needs no torch (:meth:`Snapshot.transform_here`), on a
        worker thread (``ready.decoded``, else now: a heavy one in :attr:`heavy_lane`): ``(model input, True)``,
        else ``(image, False)``. The time since ``start`` is the query's decode stage."""
        done = ready.decoded
        if done is None:
            async with self.heavy_lane if ready.upload.heavy else contextlib.nullcontext():  # waits holding no thread
                done = await self.run(_decode_and_transform, snapshot, ready.upload)
        image, decoded, transformed = done
        self.metrics.observe_stage("decode", decoded - start)
        if transformed is None:
            return image, False
        self.metrics.observe_stage("transform", time.perf_counter() - decoded)
        return transformed, True

    @staticmethod
    def _media_type(request: Request) -> str:
        return request.headers.get("content-type", "").partition(";")[0].strip().lower()

    @staticmethod
    def _unsupported(request: Request, route: str, upload: str) -> ApiError:
        shown = repr(request.headers.get("content-type", "")[:80]) or "a body without a content type"
        return ApiError(415, f"POST {route} takes multipart/form-data ({upload}) or application/json, not {shown}")

    async def _read_form(self, request: Request, fields: frozenset[str], text_fields: tuple[str, ...],
                         max_files: int, limit: str | None = None) -> tuple[list[tuple[str, bytes]], dict[str, str]]:
        """A multipart form's uploads (its file fields ``image`` as ``(file name, bytes)``: at least one, at most
        ``max_files``) and those of its ``text_fields`` given; a field outside ``fields``: 400. More files: 413 when
        ``limit`` names the limit they are over, else a malformed form (400)."""
        try:
            form = await request.form(max_files=max_files, max_fields=len(fields),
                                      max_part_size=self.limits.max_json_bytes)
        except HTTPException as err:  # Starlette's multipart limits
            if limit is not None and "too many files" in str(err.detail).lower():
                raise ApiError(413, f"the form holds more than {max_files} images, over the limit of {max_files} "
                                    f"({limit})") from None
            raise
        try:
            unknown = sorted(set(form) - fields)
            if unknown:
                raise ApiError(400, f"unknown form field(s) {', '.join(repr(f[:40]) for f in unknown[:5])}; "
                                    f"an upload has {', '.join(sorted(fields))}")
            uploads = form.getlist("image")
            if not any(isinstance(upload, UploadFile) for upload in uploads):
                raise ApiError(400, "the form has no file field 'image'")
            if not all(isinstance(upload, UploadFile) for upload in uploads):
                raise ApiError(400, "every form field 'image' must be a file (an image upload), not text")
            files = [(upload.filename or "upload", await upload.read()) for upload in uploads]  # within the body limit
            given = {key: form.get(key) for key in text_fields if key in form}
            if any(not isinstance(value, str) for value in given.values()):
                raise ApiError(400, f"the form fields {' and '.join(text_fields)} are text, not files")
            return files, given
        finally:
            await form.close()

    def _checked_form(self, snapshot: Snapshot, data: bytes, name: str, fields: dict[str, str],
                      k_param: str | None) -> Query:
        given_filter: Any = fields.get("filter")
        if isinstance(given_filter, str) and given_filter.lstrip()[:1] in ("{", "["):
            given_filter = parse_json(given_filter.encode(), self.limits, "the filter field")
        return Query("image", data, name, self._k(fields.get("k", _ABSENT), k_param),
                     check_filter(given_filter, snapshot.index, self.limits))

    def _form_query(self, snapshot: Snapshot, data: bytes, name: str, fields: dict[str, str],
                    k_param: str | None) -> tuple[Query, Ready]:
        """An upload's checked query and its image, opened and (unless heavy) decoded (:func:`_ready`)."""
        return self._image_query(snapshot, self._checked_form(snapshot, data, name, fields, k_param))

    def _image_query(self, snapshot: Snapshot, query: Query) -> tuple[Query, Ready]:
        """An image query and its image, opened and (unless heavy) decoded (:func:`_ready`)."""
        return query, _ready(snapshot, query.value, self.limits, repr(query.name))

    def _checked_json(self, snapshot: Snapshot, data: bytes, k_param: str | None) -> Query:
        body = parse_json(data, self.limits, "the JSON body", max_bytes=self.limits.max_upload_bytes)
        kind, value = check_json_query(body)
        k = self._k(body["k"] if "k" in body else _ABSENT, k_param)
        filter_ = check_filter(body.get("filter"), snapshot.index, self.limits)
        if kind == "image_base64":
            return Query("image", decode_base64(value), kind, k, filter_)
        if kind == "vector":
            return Query(kind, check_vector(value, snapshot.index.dim), kind, k, filter_)
        return Query(kind, self._row(snapshot, value), value, k, filter_)

    def _k(self, given: Any, k_param: str | None) -> int:
        """``k`` from the body or form (``given``; :data:`_ABSENT` when not there) or the query string (``k_param``),
        not both; neither: :data:`DEFAULT_K`."""
        if given is not _ABSENT and k_param is not None:
            raise ApiError(400, "k is given twice (in the query string and in the body): give it once")
        if given is _ABSENT:
            given = DEFAULT_K if k_param is None else k_param
        return check_k(given, self.limits)

    @staticmethod
    def _search(snapshot: Snapshot, vectors: torch.Tensor | int, query: Query) -> list[dict[str, Any]]:
        """The records of ``vectors`` (``(n, D)``, or an item's row) searched with ``query``'s ``k`` and filter, on
        the torch thread."""
        if isinstance(vectors, int):
            vectors = snapshot.index.embeddings[vectors].unsqueeze(0)
        options = {} if query.filter is None else {"filter": query.filter}
        try:
            result = snapshot.index.search(vectors, query.k, **options)
        except ValueError as err:  # checked before; an index reloaded meanwhile may still refuse
            raise ApiError(400, str(err)) from None
        records = result.records()
        if result.note:
            for record in records:
                record["note"] = result.note
        return records

    # ------------------------------------------------------------------ embed
    async def embed(self, request: Request) -> dict[str, Any]:
        """The embeddings of the request's images by the served model, made as a search's query embedding is:
        every image's header is checked (worker thread) before any is decoded; then they are decoded and
        micro-batched ``max_batch`` at a time, so one request holds no more decoded images than ``max_batch``
        concurrent searches do."""
        snapshot = self.holder.current
        media_type = self._media_type(request)
        if media_type == "multipart/form-data":
            images = (await self._read_form(request, EMBED_FORM_FIELDS, (), max_files=self.limits.max_images,
                                            limit="max_images"))[0]
        elif media_type == "application/json":
            images = await self.run(self._checked_embed_json, await request.body())
        else:
            raise self._unsupported(request, "/embed", "image uploads")
        start = time.perf_counter()
        uploads = await self.run(self._opened, snapshot, images)
        embeddings: list[list[float]] = []
        for chunk in _chunks(uploads, self.settings.max_batch):
            embeddings += await asyncio.gather(*(self._embedded(snapshot, upload, start) for upload in chunk))
        return {"fingerprint": snapshot.embedder.fingerprint, "dim": snapshot.index.dim,
                "names": [name for name, _ in images], "embeddings": embeddings}

    async def _embedded(self, snapshot: Snapshot, upload: OpenedUpload, start: float) -> list[float]:
        with self.batcher.expecting():
            image, transformed = await self._decoded(snapshot, Ready(upload, None), start)
        return await self.batcher.embed(snapshot, image, transformed=transformed, then=AS_LISTS)

    def _checked_embed_json(self, data: bytes) -> list[tuple[str, bytes]]:
        body = parse_json(data, self.limits, "the JSON body", max_bytes=self.limits.max_upload_bytes)
        return [(name, decode_base64(text, f"images_base64[{i}]"))
                for i, (name, text) in enumerate(check_embed_json(body, self.limits))]

    def _opened(self, snapshot: Snapshot, images: list[tuple[str, bytes]]) -> list[OpenedUpload]:
        """Every image's header read and checked (:func:`~rankopt.serve.images.open_upload`), none decoded."""
        return [open_upload(data, self.limits, snapshot.decode_min_side,
                            f"image {i} ({name!r})" if len(images) > 1 else repr(name))
                for i, (name, data) in enumerate(images)]

    # ------------------------------------------------------------------ items
    @staticmethod
    def _row(snapshot: Snapshot, item_id: str) -> int:
        row = snapshot.rows.get(item_id)
        if row is None:
            raise ApiError(404, f"no item with id {item_id!r} in the index")
        return row

    def item(self, item_id: str) -> dict[str, Any]:
        snapshot = self.holder.current
        self._row(snapshot, item_id)
        return snapshot.index.item(item_id)

    async def thumbnail(self, item_id: str) -> bytes:
        snapshot = self.holder.current
        row = self._row(snapshot, item_id)
        path = snapshot.index.paths[row] if snapshot.index.paths is not None else None
        if path is None:
            raise ApiError(404, f"item {item_id!r} has no image path in the index")
        try:
            return await self.run(self.thumbnails.get, path)
        except FileNotFoundError:
            raise ApiError(404, f"the image of item {item_id!r} cannot be read") from None

    def health(self, authorized: bool) -> dict[str, Any]:
        """Status, size, fingerprint, the model's runtime and last reload; why a reload failed and why the runtime
        was chosen (paths) only to ``authorized`` requests."""
        snapshot = self.holder.current
        out = {"status": "ok", "items": len(snapshot.index), "dim": snapshot.index.dim,
               "fingerprint": snapshot.index.fingerprint, "search": snapshot.index.backend,
               "version": snapshot.version, "loaded_utc": snapshot.loaded_utc,
               "runtime": snapshot.embedder.active_runtime.to_dict(),
               "reload_failed": self.holder.last_error is not None}
        if authorized:
            out["reload_error"] = self.holder.last_error
        else:  # why a runtime was chosen may name files
            out["runtime"].pop("note")
        return out


def create_app(holder: IndexHolder, settings: Settings | None = None) -> FastAPI:
    """The service of ``holder``'s index (see the module docstring for the routes)."""
    settings = settings or Settings()
    metrics = Metrics()
    service = Service(holder, settings, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with service.running():
            yield

    app = FastAPI(title="rankopt search", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=OPENAPI_PATH)
    app.state.service = service
    expected = None if settings.token is None else settings.token.encode()

    def authorized(request: Request) -> bool:
        if expected is None:
            return True
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected)

    async def authorize(request: Request) -> None:  # async: FastAPI would run a plain function on another thread
        if not authorized(request):
            raise ApiError(401, "a valid bearer token is required (Authorization: Bearer TOKEN)")

    guarded = [Depends(authorize)]

    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        response = error_response(error)
        if error.status == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        return response

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> JSONResponse:
        return JSONResponse({"error": str(error.detail)}, status_code=error.status_code, headers=error.headers)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, error: Exception) -> JSONResponse:  # logged by the server, with its traceback
        return JSONResponse({"error": f"internal error ({type(error).__name__}): {str(error)[:200]}"}, status_code=500)

    routes = describe_routes(guarded=settings.token is not None, max_k=settings.limits.max_k,
                             max_images=settings.limits.max_images)

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(_static_file("index.html"))

    @app.get("/health", **routes["/health"])
    async def health(request: Request) -> dict[str, Any]:
        return service.health(authorized(request))

    app.head("/health", include_in_schema=False)(health)

    @app.get("/metrics", dependencies=guarded, **routes["/metrics"])
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(len(holder.current.index)),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/items/{item_id}", dependencies=guarded, **routes["/items/{item_id}"])
    async def item(item_id: str) -> dict[str, Any]:
        return service.item(item_id)

    @app.get("/thumbnails/{item_id}", dependencies=guarded, **routes["/thumbnails/{item_id}"])
    async def thumbnail(item_id: str) -> Response:
        return Response(await service.thumbnail(item_id), media_type="image/jpeg",
                        headers={"Cache-Control": "private, max-age=300"})

    # answered as they are: already JSON-able, they need no validation or conversion by FastAPI
    @app.post("/search", dependencies=guarded, **routes["/search"])
    async def search(request: Request) -> JSONResponse:
        return JSONResponse(await service.search(request))

    @app.post("/embed", dependencies=guarded, **routes["/embed"])
    async def embed(request: Request) -> JSONResponse:
        return JSONResponse(await service.embed(request))

    app.mount("/static", StaticFiles(packages=[("rankopt.serve", STATIC)]), name="static")
    if settings.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(Guard, metrics=metrics, max_body=settings.limits.max_upload_bytes, hosts=settings.hosts,
                       routes=[getattr(route, "path", "") for route in app.routes])
    return app


AS_LISTS = FollowUp("as lists", torch.Tensor.tolist)
"""``(n, D)`` embeddings as JSON numbers, on the torch thread right after their forward."""


@dataclass(frozen=True)
class Ready:
    """An upload opened (header checked) and, when ``decoded`` is not None, decoded with it
    (:func:`_decode_and_transform`'s answer)."""

    upload: OpenedUpload
    decoded: tuple[Any, float, torch.Tensor | None] | None


def _ready(snapshot: Snapshot, data: bytes, limits: Limits, name: str) -> Ready:
    """``data`` opened (:func:`~rankopt.serve.images.open_upload`) and, unless heavy (its decode waits for the heavy
    lane), decoded and transformed at once."""
    upload = open_upload(data, limits, snapshot.decode_min_side, name)
    return Ready(upload, None if upload.heavy else _decode_and_transform(snapshot, upload))


def _decode_and_transform(snapshot: Snapshot, upload: OpenedUpload) -> tuple[Any, float, torch.Tensor | None]:
    """``(image, time decoded, its model input or None)``: ``upload`` decoded, then transformed where that needs no
    torch (on a worker thread: :meth:`Snapshot.transform_here`)."""
    image = upload.decode()
    return image, time.perf_counter(), snapshot.transform_here(image)


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def _static_file(name: str) -> str:
    from importlib.resources import files

    return str(files("rankopt.serve") / STATIC / name)
