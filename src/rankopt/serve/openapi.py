"""The service's OpenAPI description (``GET /openapi.json``): per route, its summary, the request bodies of
``POST /search`` (a multipart upload or a JSON query) and ``POST /embed`` (uploads or base64 images) and every
status code it answers with. The routes read
their requests themselves (:mod:`rankopt.serve.app`), so the bodies are described here, by hand; the API fuzz
test (``tests/serve/test_fuzz.py``) holds the service to this description.
"""

from __future__ import annotations

from typing import Any

ERROR = {"description": "an error", "content": {"application/json": {"schema": {
    "type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}}}}
ERRORS = {
    400: "malformed request: not an image, invalid JSON, bad k, bad filter, bad vector, bad Content-Length",
    401: "the bearer token is missing or wrong (only when the service has a token)",
    404: "no such item (or its image cannot be read)",
    413: "over a limit: body bytes, image pixels, JSON values, filter values, images per request",
    415: "an image format the service does not accept, or a body that is neither multipart nor JSON",
    421: "the Host header names another service (see --allow-host)",
}
RECORD = {"type": "object", "required": ["query", "results"], "properties": {
    "query": {"type": "string"}, "note": {"type": "string"},
    "results": {"type": "array", "items": {"type": "object", "required": ["rank", "id", "score"], "properties": {
        "rank": {"type": "integer"}, "id": {"type": "string"}, "score": {"type": "number"},
        "path": {"type": ["string", "null"]}, "match": {"type": "boolean"}}}}}}
FILTER = {"description": "a JSON object {column: value or [values]}, a condition 'column=value' / "
                         "'column in [a, b]' or a list of conditions", "anyOf": [
    {"type": "object", "additionalProperties": {"anyOf": [
        {"type": ["string", "number", "boolean", "null"]},
        {"type": "array", "items": {"type": ["string", "number", "boolean", "null"]}}]}},
    {"type": "string"}, {"type": "array", "items": {"type": "string"}}]}


def _responses(ok: dict[str, Any], codes: tuple[int, ...]) -> dict[int | str, dict[str, Any]]:
    return {200: ok, **{code: {**ERROR, "description": ERRORS[code]} for code in codes}}


def _json_ok(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def search_body(max_k: int) -> dict[str, Any]:
    """The ``requestBody`` of ``POST /search``."""
    k = {"type": "integer", "minimum": 1, "maximum": max_k}
    query = {"type": "object", "additionalProperties": False, "properties": {
        "image_base64": {"type": "string", "format": "byte", "description": "an image file, base64"},
        "vector": {"type": "array", "items": {"type": "number"}, "description": "an embedding of the index's size"},
        "id": {"type": "string", "description": "an indexed item's id: more like this"},
        "k": k, "filter": FILTER},
        "oneOf": [{"required": [kind]} for kind in ("image_base64", "vector", "id")]}
    upload = {"type": "object", "required": ["image"], "additionalProperties": False, "properties": {
        "image": {"type": "string", "format": "binary"}, "k": {"type": "string", "pattern": "^[0-9]+$"},
        "filter": {"type": "string"}}}
    return {"required": True, "content": {"multipart/form-data": {"schema": upload},
                                          "application/json": {"schema": query}}}


EMBEDDINGS = {"type": "object", "required": ["fingerprint", "dim", "names", "embeddings"], "properties": {
    "fingerprint": {"type": "string", "description": "the model's fingerprint (the index's)"},
    "dim": {"type": "integer"},
    "names": {"type": "array", "items": {"type": "string"}, "description": "the images' file names, in order"},
    "embeddings": {"type": "array", "items": {"type": "array", "items": {"type": "number"}},
                   "description": "one embedding of dim numbers per image, in order"}}}


def embed_body(max_images: int) -> dict[str, Any]:
    """The ``requestBody`` of ``POST /embed``."""
    images = {"type": "array", "minItems": 1, "maxItems": max_images}
    uploads = {"type": "object", "required": ["image"], "additionalProperties": False, "properties": {
        "image": {**images, "items": {"type": "string", "format": "binary"},
                  "description": "image files (the field repeated)"}}}
    encoded = {"type": "object", "required": ["images_base64"], "additionalProperties": False, "properties": {
        "images_base64": {**images, "items": {"type": "string", "format": "byte"},
                          "description": "image files, base64"},
        "names": {"type": "array", "items": {"type": "string"},
                  "description": "a name per image (default images_base64[i])"}}}
    return {"required": True, "content": {"multipart/form-data": {"schema": uploads},
                                          "application/json": {"schema": encoded}}}


def describe_routes(*, guarded: bool, max_k: int, max_images: int = 64) -> dict[str, dict[str, Any]]:
    """Keyword arguments of each route's decorator: ``summary``, ``responses`` (401 only when ``guarded``) and,
    for ``/search`` and ``/embed``, ``openapi_extra`` with the body (and ``/search``'s ``k`` query parameter)."""
    auth = (401,) if guarded else ()
    common = (400, 413, 421)
    item = {"type": "object", "required": ["id"], "properties": {"id": {"type": "string"}}}
    health = {"type": "object", "required": ["status", "items"], "properties": {
        "status": {"type": "string"}, "items": {"type": "integer"}, "reload_failed": {"type": "boolean"},
        "runtime": {"type": "object", "properties": {"name": {"type": "string"}, "threads": {"type": "integer"},
                                                      "device": {"type": "string"}, "note": {"type": "string"}}}}}
    return {
        "/search": {
            "summary": "Search with an image upload, a base64 image, a vector or an item id",
            "responses": _responses(_json_ok(RECORD, "the query's top-k, as rankopt search --json writes it"),
                                    (*common, *auth, 404, 415)),
            "openapi_extra": {"requestBody": search_body(max_k), "parameters": [
                {"name": "k", "in": "query", "required": False, "description": "results (not also in the body)",
                 "schema": {"type": "integer", "minimum": 1, "maximum": max_k}}]},
        },
        "/embed": {
            "summary": "Embed images with the served model (the vectors its searches use)",
            "responses": _responses(_json_ok(EMBEDDINGS, "the images' embeddings and the model's fingerprint"),
                                    (*common, *auth, 415)),
            "openapi_extra": {"requestBody": embed_body(max_images)},
        },
        "/items/{item_id}": {"summary": "An indexed item: id, path, labels, metadata",
                             "responses": _responses(_json_ok(item, "the item"), (*common, *auth, 404))},
        "/thumbnails/{item_id}": {"summary": "A small JPEG of an indexed item", "responses": _responses(
            {"description": "JPEG", "content": {"image/jpeg": {"schema": {"type": "string", "format": "binary"}}}},
            (*common, *auth, 404))},
        "/health": {"summary": "Status, size and fingerprint of the served index (no token needed)",
                    "responses": _responses(_json_ok(health, "status"), common)},
        "/metrics": {"summary": "Prometheus text", "responses": _responses(
            {"description": "metrics", "content": {"text/plain": {"schema": {"type": "string"}}}}, (*common, *auth))},
    }
