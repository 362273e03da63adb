"""``rankopt.client.SearchClient`` against a real ``rankopt serve`` process: every method answers what the library
answers in-process (ids equal, scores within 1e-5; ``/embed``'s vectors and fingerprint those of the index's
embedder), and every error status comes back as its exception type."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import torch
from PIL import Image

from rankopt.client import (
    AuthError,
    BadRequestError,
    BusyError,
    Embedded,
    NotFoundError,
    SearchClient,
    ServiceError,
    TooLargeError,
    UnreachableError,
)
from rankopt.search import Index

from helpers.images import image_bytes
from helpers.servers import free_port, running_server


@pytest.fixture(scope="module")
def index(served) -> Index:
    return Index.load(served / "idx")


def ids_and_scores(record: dict) -> tuple[list[str], list[float]]:
    return [str(r["id"]) for r in record["results"]], [r["score"] for r in record["results"]]


def assert_same(got: dict, expected: dict) -> None:
    got_ids, got_scores = ids_and_scores(got)
    expected_ids, expected_scores = ids_and_scores(expected)
    assert got_ids == expected_ids
    assert np.allclose(got_scores, expected_scores, rtol=0, atol=1e-5), (got_scores, expected_scores)


def test_search_answers_as_the_index_does(live_server, index, query_files):
    with SearchClient(live_server) as service:
        assert service.health()["items"] == len(index) == 12
        for path in query_files:  # a path (PNG and JPEG: decoded as rankopt search decodes files), then its bytes
            expected = index.search([path], k=5).records()[0]
            by_path = service.search(path, k=5)
            assert by_path["query"] == path.name
            assert_same(by_path, expected)
            assert_same(service.search(str(path), k=5), expected)
            assert_same(service.search(path.read_bytes(), k=5), expected)
        png = next(p for p in query_files if p.suffix == ".png")
        with Image.open(png) as picture:  # a PIL image goes as a lossless PNG: the file's pixels
            assert_same(service.search(picture, k=5), index.search([png], k=5).records()[0])
        vector = index.embeddings[4] + 0.05 * torch.randn(index.dim)
        expected = index.search(vector.unsqueeze(0), 3).records()[0]
        for given in (vector, vector.unsqueeze(0), vector.numpy(), vector.tolist()):
            assert_same(service.search(given, k=3), expected)
        item_id = index.ids[7]
        more = service.search(id=item_id, k=4)
        assert more["query"] == item_id and more["results"][0]["id"] == item_id
        assert_same(more, index.search(index.embeddings[7:8], 4).records()[0])
        filtered = service.search(png, k=5, filter={"label": "beta/three"})
        assert_same(filtered, index.search([png], 5, filter={"label": "beta/three"}).records()[0])
        assert "the filter keeps 3 of 12" in filtered["note"]
        on_metadata = service.search(id=item_id, k=12, filter=["shop=north", "price in [10, 30, 50]"])
        assert_same(on_metadata, index.search(index.embeddings[7:8], 12,
                                              filter=["shop=north", "price in [10, 30, 50]"]).records()[0])
        assert_same(service.search(png, k=5, filter="label=alpha/two"),
                    index.search([png], 5, filter="label=alpha/two").records()[0])


def test_embed_answers_the_vectors_of_the_index_embedder(live_server, index, served, query_files):
    embedder = index.embedder_for(device="cpu", progress=False)
    files = [*query_files, *sorted((served / "gallery").rglob("*.png"))[:2]]
    expected = embedder.embed([str(path) for path in files]).embeddings.numpy()
    with SearchClient(live_server) as service:
        embedded = service.embed(files)
        assert isinstance(embedded, Embedded)
        assert embedded.fingerprint == embedder.fingerprint == index.fingerprint == service.health()["fingerprint"]
        assert embedded.dim == index.dim and embedded.names == [path.name for path in files]
        assert embedded.embeddings.dtype == np.float32 and embedded.embeddings.shape == (len(files), index.dim)
        assert np.allclose(embedded.embeddings, expected, rtol=0, atol=1e-5)
        one = service.embed(files[0].read_bytes())  # one image, as bytes
        assert one.names == ["upload"] and np.allclose(one.embeddings, expected[:1], rtol=0, atol=1e-5)
        # an embedding searched as a vector answers as its image
        assert_same(service.search(embedded.embeddings[0], k=5), service.search(files[0], k=5))


def test_items_and_thumbnails(live_server, index):
    with SearchClient(live_server) as service:
        for item_id in index.ids[:3]:
            assert service.item(item_id) == index.item(item_id)
        assert service.items(index.ids[3:6]) == [index.item(i) for i in index.ids[3:6]]
        assert service.item(int(index.ids[0])) == index.item(index.ids[0])  # an integer id as its text
        jpeg = service.thumbnail(index.ids[0])
        assert jpeg[:3] == b"\xff\xd8\xff"


def test_each_error_status_is_its_exception(live_server, index):
    with SearchClient(live_server) as service:
        errors = {
            "not an image": (lambda: service.search(b"just text"), BadRequestError, 400, "not an image"),
            "bad vector": (lambda: service.search([0.1] * (index.dim + 1)), BadRequestError, 400, "values but"),
            "bad k": (lambda: service.search(id=index.ids[0], k=0), BadRequestError, 400, "between 1 and"),
            "bad filter": (lambda: service.search(id=index.ids[0], filter={"nope": 1}), BadRequestError, 400, "nope"),
            "not embeddable": (lambda: service.embed([image_bytes((1, 2, 3)), b"text"]), BadRequestError, 400,
                               "image 1 ('upload')"),
            "unknown item": (lambda: service.item("nope"), NotFoundError, 404, "no item with id 'nope'"),
            "unknown items": (lambda: service.items([index.ids[0], "nope"]), NotFoundError, 404, "no item"),
            "unknown thumbnail": (lambda: service.thumbnail("nope"), NotFoundError, 404, "no item"),
            "a path as an id": (lambda: service.thumbnail("../../etc/passwd"), NotFoundError, 404, "Not Found"),
            "unknown query id": (lambda: service.search(id="nope"), NotFoundError, 404, "no item"),
            "too many images": (lambda: service.embed([image_bytes((9, 9, 9), size=8)] * 65), TooLargeError, 413,
                                "over the limit of 64"),
            "huge filter": (lambda: service.search(id=index.ids[0], filter={"label": ["x"] * 1001}), TooLargeError,
                            413, "over the limit of 1000"),
        }
        for case, (call, kind, status, message) in errors.items():
            with pytest.raises(kind) as raised:
                call()
            assert isinstance(raised.value, ServiceError), case
            assert raised.value.status == status and message in raised.value.message, (case, raised.value)
        assert service.health()["status"] == "ok"  # the service and the kept connection go on
    with pytest.raises(ValueError, match="give one query"):
        SearchClient(live_server).search(b"x", id="0")


def test_token_and_busy_service(served, index):
    """A token-guarded service refuses a client without the token (AuthError) and answers one with it; over its
    connection limit (uvicorn's 503) the client raises BusyError; a closed port is UnreachableError."""
    with running_server(served / "idx", "--token", "s3cret", "--max-connections", "3") as url:
        for token in (None, "wrong"):
            with SearchClient(url, token=token) as service:
                assert service.health()["status"] == "ok"  # /health needs no token
                for call in (lambda: service.search(id=index.ids[0]), lambda: service.item(index.ids[0]),
                             lambda: service.embed(image_bytes((1, 2, 3)))):
                    with pytest.raises(AuthError) as raised:
                        call()
                    assert raised.value.status == 401 and "bearer token" in raised.value.message
        with SearchClient(url, token="s3cret") as service:
            assert_same(service.search(id=index.ids[2], k=3), index.search(index.embeddings[2:3], 3).records()[0])
        address = url.removeprefix("http://").split(":")
        with socket.create_connection((address[0], int(address[1]))), \
                socket.create_connection((address[0], int(address[1]))):  # with the client's: 3 open, the limit
            with pytest.raises(BusyError) as raised, SearchClient(url, token="s3cret") as service:
                service.health()
            assert raised.value.status == 503
    with pytest.raises(UnreachableError) as raised, SearchClient(f"http://127.0.0.1:{free_port()}", timeout=5) as gone:
        gone.health()
    assert raised.value.status is None


def test_the_embed_route_takes_base64_json_and_checks_it_before_the_torch_thread(client, served, monkeypatch):
    """``POST /embed`` with ``{"images_base64": [...], "names": [...]}`` answers as the upload does; a body the
    checks refuse never reaches the torch thread."""
    import base64

    from rankopt.serve import batcher

    files = sorted((served / "gallery").rglob("*.png"))[:3]
    uploaded = client.post("/embed", files=[("image", (f.name, f.read_bytes(), "image/png")) for f in files])
    assert uploaded.status_code == 200, uploaded.text
    encoded = [base64.b64encode(f.read_bytes()).decode() for f in files]
    as_json = client.post("/embed", json={"images_base64": encoded, "names": ["a", "b", "c"]})
    assert as_json.status_code == 200 and as_json.json()["names"] == ["a", "b", "c"]
    assert np.allclose(as_json.json()["embeddings"], uploaded.json()["embeddings"], rtol=0, atol=1e-6)
    assert client.post("/embed", json={"images_base64": encoded[:1]}).json()["names"] == ["images_base64[0]"]
    embedded = []
    original = batcher.MicroBatcher.embed

    async def spy(self, *args, **kwargs):
        embedded.append(1)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(batcher.MicroBatcher, "embed", spy)
    refused = {
        "no list": ({"images_base64": encoded[0]}, 400, "non-empty list"),
        "empty list": ({"images_base64": []}, 400, "non-empty list"),
        "unknown key": ({"images_base64": encoded, "k": 3}, 400, "unknown key(s) 'k'"),
        "names not matching": ({"images_base64": encoded, "names": ["a"]}, 400, "names must be a list of 3"),
        "bad base64": ({"images_base64": [encoded[0], "***"]}, 400, "images_base64[1] is not valid base64"),
        "one not an image": ({"images_base64": [*encoded, "aGVsbG8="]}, 400, "image 3 ('images_base64[3]')"),
        "too many": ({"images_base64": [encoded[0]] * 65}, 413, "65 images, over the limit of 64"),
    }
    for case, (body, status, message) in refused.items():
        answer = client.post("/embed", json=body)
        assert answer.status_code == status and message in answer.json()["error"], (case, answer.text)
    text = client.post("/embed", content=b"x", headers={"Content-Type": "text/plain"})
    assert text.status_code == 415 and "POST /embed takes multipart/form-data" in text.json()["error"]
    assert embedded == []
