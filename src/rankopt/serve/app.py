"""The HTTP search service as a FastAPI application: :func:`create_app`.

=======================  =======================================================================
route                    answer
=======================  =======================================================================
``POST /search?k=K``     a multipart upload (file field ``image``, optional fields ``k``, ``filter``)
                         or JSON ``{"image_base64" | "vector" | "id", "k", "filter"}`` (``id``: an
                         indexed item's vector, "more like this") -> the query's record as
                         ``rankopt search --json`` writes it (``query``, ``results``), ``note`` when
                         ``k`` was capped to the index size
``GET /items/{id}``      the item: id, path, label, metadata
``GET /thumbnails/{id}`` a small JPEG of an indexed item (looked up by id, never a path)
``GET /health``          status, item count, fingerprint, last reload (no token needed)
``GET /metrics``         Prometheus text (:mod:`rankopt.serve.metrics`)
``GET /``                the search page (``static/``: drop or pick an image, click a result)
=======================  =======================================================================

Errors are ``{"error": message}`` with a 4xx status (:mod:`rankopt.serve.limits`); the service keeps
serving. With a token every route but ``/``, ``/static`` and ``/health`` needs
``Authorization: Bearer TOKEN`` (compared in constant time). CORS is off unless origins are given.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import os
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from fastapi import Depends, FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException

from rankopt.serve.batcher import MicroBatcher
from rankopt.serve.holder import IndexHolder, Snapshot
from rankopt.serve.limits import (
    ApiError,
    Limits,
    check_filter,
    check_json_query,
    check_k,
    check_vector,
    decode_base64,
    decode_upload,
)
from rankopt.serve.metrics import Metrics
from rankopt.serve.thumbnails import ThumbnailCache

DEFAULT_K = 10
FORM_FIELDS = frozenset({"image", "k", "filter"})
STATIC = "static"


@dataclass(frozen=True)
class Settings:
    """``token``: required as a bearer token when set; ``cors_origins``: origins allowed by CORS (none:
    off); ``max_batch`` / ``max_wait_ms``: micro-batching (:class:`~rankopt.serve.batcher.MicroBatcher`);
    ``reload_every_s``: how often the index folder's stamp is polled (0: never); ``threads``: intra-op threads
    of the torch thread (transforms, forwards, searches; default: torch's); ``workers``: threads decoding uploads
    and thumbnails."""

    limits: Limits = Limits()
    token: str | None = None
    cors_origins: Sequence[str] = ()
    max_batch: int = 32
    max_wait_ms: float = 2.0
    reload_every_s: float = 1.0
    threads: int | None = None
    workers: int = os.cpu_count() or 1


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
        """The record of the request's query, searched in the snapshot served when it arrived."""
        snapshot = self.holder.current
        kind, value, name, k, given_filter = await self._read_query(request)
        k = check_k(DEFAULT_K if k is None else k, self.limits)
        filter_ = check_filter(given_filter)
        if kind == "image":
            with self.batcher.expecting():
                start = time.perf_counter()
                image = await self.run(decode_upload, value, self.limits, snapshot.decode_min_side, repr(name))
                self.metrics.observe_stage("decode", time.perf_counter() - start)
            record = await self.batcher.embed(  # searched on the torch thread right after the forward
                snapshot, image, then=lambda embedding: self._search(snapshot, embedding.unsqueeze(0), k, filter_))
        else:
            if kind == "vector":
                vector = check_vector(value, snapshot.index.dim)
            else:
                name = str(value)
                vector = snapshot.index.embeddings[self._row(snapshot, name)].unsqueeze(0)
            record = await self.batcher.call(self._search, snapshot, vector, k, filter_)
        record["query"] = name
        return record

    async def _read_query(self, request: Request) -> tuple[str, Any, str, Any, Any]:
        """``(kind, value, name, k, filter)`` of a multipart upload or a JSON query (``k`` from the body,
        else the query string)."""
        content_type = request.headers.get("content-type", "")
        k = request.query_params.get("k")
        if content_type.startswith("multipart/form-data"):
            form = await request.form(max_files=1, max_fields=len(FORM_FIELDS))
            try:
                unknown = sorted(set(form) - FORM_FIELDS)
                if unknown:
                    raise ApiError(400, f"unknown form field(s) {', '.join(map(repr, unknown))}; "
                                        f"an upload has {', '.join(sorted(FORM_FIELDS))}")
                upload = form.get("image")
                if not isinstance(upload, UploadFile):
                    raise ApiError(400, "the form has no file field 'image'")
                data = await upload.read()  # within the body limit (_Guard)
                given_filter = form.get("filter")
                if isinstance(given_filter, str) and given_filter.lstrip().startswith("{"):
                    given_filter = _json(given_filter.encode(), "the filter field")
                return "image", data, upload.filename or "upload", form.get("k", k), given_filter
            finally:
                await form.close()
        if content_type.startswith("application/json"):
            body = _json(await request.body(), "the JSON body")
            kind, value = check_json_query(body)
            if kind == "image_base64":
                return "image", decode_base64(value), "image_base64", body.get("k", k), body.get("filter")
            return kind, value, kind, body.get("k", k), body.get("filter")
        raise ApiError(415, f"POST /search takes multipart/form-data (an image upload) or application/json, "
                            f"not {content_type or 'a body without a content type'!r}")

    @staticmethod
    def _search(snapshot: Snapshot, vector: torch.Tensor, k: int, filter_: Any) -> dict[str, Any]:
        options = {} if filter_ is None else {"filter": filter_}
        try:
            result = snapshot.index.search(vector, k, **options)
        except ValueError as err:  # unknown filter keys, ...
            raise ApiError(400, str(err)) from None
        record = result.records()[0]
        if result.note:
            record["note"] = result.note
        return record

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

    def health(self) -> dict[str, Any]:
        snapshot = self.holder.current
        return {"status": "ok", "items": len(snapshot.index), "dim": snapshot.index.dim,
                "fingerprint": snapshot.index.fingerprint, "search": snapshot.index.backend,
                "version": snapshot.version, "loaded_utc": snapshot.loaded_utc, "reload_error": self.holder.last_error}


def _json(data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"{what} is not valid JSON: {err}") from None


class _Guard:
    """ASGI middleware: refuses request bodies over ``max_body`` bytes (413, by ``Content-Length`` or as
    they stream) and records every request's route, status and latency in ``metrics``."""

    def __init__(self, app: Any, *, metrics: Metrics, max_body: int) -> None:
        self.app, self.metrics, self.max_body = app, metrics, max_body

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status, received = time.perf_counter(), 500, 0

        async def send_status(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        async def counted() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body:
                raise ApiError(413, f"the request body is over the limit of {self.max_body} bytes")
            return message

        try:
            length = dict(scope["headers"]).get(b"content-length", b"0").decode("latin-1")
            if not length.isdigit():
                await _error_response(ApiError(400, f"bad Content-Length {length!r}"))(scope, receive, send_status)
            elif int(length) > self.max_body:
                await _error_response(ApiError(413, f"the request body ({length} bytes) is over the limit of "
                                                    f"{self.max_body} bytes"))(scope, receive, send_status)
            else:
                await self.app(scope, counted, send_status)
        finally:
            route = scope.get("route")
            self.metrics.observe_request(getattr(route, "path", "other"), scope["method"], status,
                                         time.perf_counter() - start)


def _error_response(error: ApiError) -> JSONResponse:
    return JSONResponse({"error": error.message}, status_code=error.status)


def create_app(holder: IndexHolder, settings: Settings | None = None) -> FastAPI:
    """The service of ``holder``'s index (see the module docstring for the routes)."""
    settings = settings or Settings()
    metrics = Metrics()
    service = Service(holder, settings, metrics)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with service.running():
            yield

    app = FastAPI(title="rankopt search", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service
    expected = None if settings.token is None else settings.token.encode()

    def authorize(request: Request) -> None:
        if expected is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected):
            raise ApiError(401, "a valid bearer token is required (Authorization: Bearer TOKEN)")

    guarded = [Depends(authorize)]

    @app.exception_handler(ApiError)
    async def api_error(_: Request, error: ApiError) -> JSONResponse:
        response = _error_response(error)
        if error.status == 401:
            response.headers["WWW-Authenticate"] = "Bearer"
        return response

    @app.exception_handler(HTTPException)
    async def http_error(_: Request, error: HTTPException) -> JSONResponse:
        return JSONResponse({"error": str(error.detail)}, status_code=error.status_code, headers=error.headers)

    @app.exception_handler(Exception)
    async def internal_error(_: Request, error: Exception) -> JSONResponse:  # logged by the server too
        return JSONResponse({"error": f"internal error ({type(error).__name__}): {error}"}, status_code=500)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(_static_file("index.html"))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return service.health()

    @app.get("/metrics", dependencies=guarded)
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(len(holder.current.index)),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/items/{item_id}", dependencies=guarded)
    async def item(item_id: str) -> dict[str, Any]:
        return service.item(item_id)

    @app.get("/thumbnails/{item_id}", dependencies=guarded)
    async def thumbnail(item_id: str) -> Response:
        return Response(await service.thumbnail(item_id), media_type="image/jpeg",
                        headers={"Cache-Control": "private, max-age=300"})

    @app.post("/search", dependencies=guarded)
    async def search(request: Request) -> dict[str, Any]:
        return await service.search(request)

    app.mount("/static", StaticFiles(packages=[("rankopt.serve", STATIC)]), name="static")
    if settings.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(CORSMiddleware, allow_origins=list(settings.cors_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(_Guard, metrics=metrics, max_body=settings.limits.max_upload_bytes)
    return app


def _static_file(name: str) -> str:
    from importlib.resources import files

    return str(files("rankopt.serve") / STATIC / name)
