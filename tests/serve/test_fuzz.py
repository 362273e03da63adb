"""The service's API fuzzed from its own OpenAPI description (schemathesis: hypothesis over the schema): a bounded
number of generated requests per operation, valid and invalid, asserting no 5xx, only documented status codes,
and answers of the documented content type and shape."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="the API fuzz test needs schemathesis (the test extra)")
from hypothesis import HealthCheck, given, settings  # noqa: E402 - after the skip
from hypothesis.errors import Unsatisfiable  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from rankopt.serve import IndexHolder, Settings, create_app  # noqa: E402
from rankopt.serve.limits import Limits  # noqa: E402

from .conftest import TEST_HOSTS  # noqa: E402

CASES_PER_OPERATION = 100
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzzed_app(served: Path) -> Iterator[object]:
    """The service of the test index, with a token (so 401 is exercised too) and small limits (so 413 is)."""
    app = create_app(IndexHolder(served / "idx", device="cpu"),
                     Settings(token="s3cret", hosts=TEST_HOSTS, reload_every_s=0,
                              limits=Limits(max_k=50, max_upload_bytes=64_000, max_pixels=250_000)))
    yield app


def operations(app: object) -> list:
    return [result.ok() for result in schemathesis.openapi.from_asgi("/openapi.json", app).get_all_operations()]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_the_api_answers_as_described(fuzzed_app, mode):
    """Every operation, ``CASES_PER_OPERATION`` generated requests each (seeded), with and without the token."""
    calls: list[int] = []
    fuzzed: list[str] = []
    for operation in operations(fuzzed_app):
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=CASES_PER_OPERATION, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def answers_as_described(case) -> None:
            for headers in ({"Authorization": "Bearer s3cret"}, {}):
                response = case.call_and_validate(headers=headers, checks=CHECKS)
                calls.append(response.status_code)

        try:
            answers_as_described()
        except Unsatisfiable:  # no invalid request exists (a path's string id, a route without input)
            assert mode is GenerationMode.NEGATIVE and operation.path != "/search"
            continue
        fuzzed.append(operation.path)
    print(mode.value, fuzzed, sorted(collections.Counter(calls).items()))
    assert "/search" in fuzzed and len(calls) >= 2 * CASES_PER_OPERATION and max(calls) < 500
    if mode is GenerationMode.POSITIVE:
        assert 200 in calls and 401 in calls


def test_the_description_covers_every_route(fuzzed_app):
    from fastapi.testclient import TestClient

    with TestClient(fuzzed_app) as client:
        spec = client.get("/openapi.json").json()
    assert set(spec["paths"]) == {"/search", "/embed", "/items/{item_id}", "/thumbnails/{item_id}", "/health", "/metrics"}
    body = spec["paths"]["/search"]["post"]["requestBody"]["content"]
    assert set(body) == {"multipart/form-data", "application/json"}
    assert {"400", "401", "404", "413", "415", "421"} <= set(spec["paths"]["/search"]["post"]["responses"])
