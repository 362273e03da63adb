"""The service's API through a test client: answers equal ``rankopt search --json``, items and
thumbnails by id only, every bad input a 4xx JSON error after which the service still answers."""

from __future__ import annotations

import base64
import io
import math

import numpy as np
import pytest
import torch
from PIL import Image

from rankopt.search import Index

from helpers.images import image_bytes
from helpers.serving import PNG, assert_same_results, cli_records, upload


def test_upload_and_base64_answer_the_records_of_rankopt_search(client, index_dir, query_files, tmp_path, capsys):
    expected = cli_records(index_dir, query_files, tmp_path)
    capsys.readouterr()
    assert len(expected) == 3
    for path, record in zip(query_files, expected):
        data = path.read_bytes()
        answer = upload(client, data, name=path.name)
        assert answer.status_code == 200, answer.text
        assert answer.json()["query"] == path.name
        assert_same_results(answer.json()["results"], record["results"])
        as_json = client.post("/search", json={"image_base64": base64.b64encode(data).decode(), "k": 5})
        assert as_json.status_code == 200 and as_json.json()["query"] == "image_base64"
        assert_same_results(as_json.json()["results"], record["results"])


def test_vector_and_id_queries(client, index_dir):
    index = Index.load(index_dir)
    vector = index.embeddings[4] + 0.05 * torch.randn(index.dim)
    answer = client.post("/search", json={"vector": vector.tolist(), "k": 3})
    assert answer.status_code == 200 and answer.json()["query"] == "vector"
    expected = index.search(vector.unsqueeze(0), 3).records()[0]["results"]
    assert_same_results(answer.json()["results"], expected)
    # "more like this": an indexed item's own vector; the item itself comes first with cosine 1
    item_id = str(expected[1]["id"])
    more = client.post("/search?k=4", json={"id": item_id})
    assert more.status_code == 200 and more.json()["query"] == item_id
    results = more.json()["results"]
    assert len(results) == 4 and str(results[0]["id"]) == item_id and math.isclose(results[0]["score"], 1, abs_tol=1e-5)
    assert all(r["match"] == (r["score"] >= 0.5) for r in results)  # the index's threshold is 0.5
    assert all(set(r["metadata"]) == {"shop", "price"} for r in results)
    # k above the index size is capped, and said
    capped = client.post("/search", json={"id": item_id, "k": 50}).json()
    assert len(capped["results"]) == len(index) and "capped to 12" in capped["note"]


def test_items_and_thumbnails_by_id_only(client, index_dir):
    index = Index.load(index_dir)
    results = client.post("/search", json={"vector": index.embeddings[7].tolist(), "k": 1}).json()["results"]
    item_id = str(results[0]["id"])
    item = client.get(f"/items/{item_id}")
    assert item.status_code == 200
    assert item.json()["path"] == results[0]["path"] and item.json()["label"] == results[0]["label"]
    assert item.json()["metadata"] == results[0]["metadata"] and item.json()["id"] == item_id
    thumb = client.get(f"/thumbnails/{item_id}")
    assert thumb.status_code == 200 and thumb.headers["content-type"] == "image/jpeg"
    with Image.open(io.BytesIO(thumb.content)) as small, Image.open(results[0]["path"]) as original:
        assert small.format == "JPEG" and max(small.size) <= 128
        mean = np.asarray(small.convert("RGB"), dtype=np.float64).mean((0, 1))
        expected = np.asarray(original.convert("RGB"), dtype=np.float64).mean((0, 1))
        assert np.allclose(mean, expected, atol=6), (mean, expected)  # the same picture, JPEG-compressed
    for bad in ("/items/999", "/thumbnails/999", "/thumbnails/not-an-id"):
        answer = client.get(bad)
        assert answer.status_code == 404 and "no item" in answer.json()["error"]
    for attack in ("/thumbnails/../../etc/passwd", "/thumbnails/..%2F..%2Fetc%2Fpasswd", "/thumbnails/%2Fetc%2Fpasswd",
                   "/thumbnails/..%252F..%252Fetc%252Fpasswd"):
        answer = client.get(attack)
        assert answer.status_code == 404 and "error" in answer.json() and b"root:" not in answer.content


def _bomb(side: int) -> bytes:
    """A side x side 1-bit PNG: megapixels in a few kilobytes."""
    buffer = io.BytesIO()
    Image.new("1", (side, side)).save(buffer, format="PNG")
    return buffer.getvalue()


def _noisy_jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (96, 96, 3), dtype=np.uint8)).save(buffer, format="JPEG")
    return buffer.getvalue()


JPEG = _noisy_jpeg()  # its scan data is most of the file: a half file has a complete header
BAD_REQUESTS = {
    "not an image": (lambda c: upload(c, b"just some text, no pixels"), 400, "not an image"),
    "truncated png": (lambda c: upload(c, PNG[: len(PNG) // 2]), 400, "cannot be decoded"),
    "truncated jpeg": (lambda c: upload(c, JPEG[: len(JPEG) // 2], name="q.jpg"), 400, "cannot be decoded"),
    "empty upload": (lambda c: upload(c, b""), 400, "is empty"),
    "decompression bomb": (lambda c: upload(c, _bomb(12000)), 413, "144000000 pixels, over the limit of 50000000"),
    "bomb past Pillow's limit": (lambda c: upload(c, _bomb(14000)), 413, "too many pixels, over the limit"),
    "bad base64": (lambda c: c.post("/search", json={"image_base64": "***"}), 400, "not valid base64"),
    "wrong-length vector": (lambda c: c.post("/search", json={"vector": [0.1] * 15}), 400, "15 values"),
    "NaN vector": (lambda c: c.post("/search", content=b'{"vector": [NaN' + b", 0.1" * 15 + b"]}",
                                    headers={"Content-Type": "application/json"}), 400, "vector[0] is nan"),
    "infinite vector": (lambda c: c.post("/search", content=b'{"vector": [0.1, Infinity' + b", 0.1" * 14 + b"]}",
                                         headers={"Content-Type": "application/json"}), 400, "vector[1] is inf"),
    "text in vector": (lambda c: c.post("/search", json={"vector": ["a"] * 16}), 400, "not a number"),
    "k = 0": (lambda c: upload(c, PNG, k=0), 400, "between 1 and 1000"),
    "k < 0": (lambda c: c.post("/search", json={"id": "0", "k": -3}), 400, "between 1 and 1000"),
    "absurd k": (lambda c: c.post("/search", json={"id": "0", "k": 10**12}), 400, "between 1 and 1000"),
    "k not a number": (lambda c: c.post("/search?k=many", json={"id": "0"}), 400, "k must be an integer"),
    "k field not a number": (lambda c: upload(c, PNG, k=None, fields={"k": "5.5"}), 400, "k must be an integer"),
    "k true": (lambda c: c.post("/search", json={"id": "0", "k": True}), 400, "k must be an integer"),
    "unknown key": (lambda c: c.post("/search", json={"id": "0", "colour": "red"}), 400, "unknown key(s) 'colour'"),
    "two queries": (lambda c: c.post("/search", json={"id": "0", "vector": [0.0] * 16}), 400, "exactly one"),
    "no query": (lambda c: c.post("/search", json={"k": 3}), 400, "exactly one"),
    "JSON array": (lambda c: c.post("/search", json=[1, 2]), 400, "must be an object"),
    "invalid JSON": (lambda c: c.post("/search", content=b"{nope", headers={"Content-Type": "application/json"}),
                     400, "not valid JSON"),
    "unknown item": (lambda c: c.post("/search", json={"id": "nope"}), 404, "no item with id 'nope'"),
    "bad filter type": (lambda c: c.post("/search", json={"id": "0", "filter": [1]}), 400, "filter must be"),
    "form without image": (lambda c: c.post("/search", data={"k": "3"}, files={"other": ("x", b"x")}), 400,
                           "unknown form field(s) 'other'"),
    "form field only": (lambda c: c.post("/search", files={"k": (None, "3")}), 400, "no file field 'image'"),
    "wrong content type": (lambda c: c.post("/search", content=b"abc", headers={"Content-Type": "text/plain"}), 415,
                           "multipart/form-data"),
    "wrong method": (lambda c: c.get("/search"), 405, "Method Not Allowed"),
    "unknown route": (lambda c: c.get("/nothing/here"), 404, "Not Found"),
}


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_input_is_a_4xx_json_error_and_the_service_keeps_serving(client, case):
    request, status, message = BAD_REQUESTS[case]
    answer = request(client)
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json" and message in answer.json()["error"]
    assert upload(client, PNG).status_code == 200


def test_filters(client, index_dir):
    index = Index.load(index_dir)
    as_object = client.post("/search", json={"vector": index.embeddings[0].tolist(), "k": 5,
                                             "filter": {"label": "beta/three"}})
    assert as_object.status_code == 200, as_object.text
    results = as_object.json()["results"]
    assert [r["label"] for r in results] == ["beta/three"] * 3 and "the filter keeps 3 of 12" in as_object.json()["note"]
    expected = index.search(index.embeddings[:1], 5, filter={"label": "beta/three"}).records()[0]["results"]
    assert_same_results(results, expected)
    as_text = upload(client, PNG, fields={"filter": "label=alpha/two"})
    assert as_text.status_code == 200 and {r["label"] for r in as_text.json()["results"]} == {"alpha/two"}
    as_json_field = upload(client, PNG, fields={"filter": '{"label": ["alpha/two", "beta/four"]}'})
    assert {r["label"] for r in as_json_field.json()["results"]} == {"alpha/two", "beta/four"}
    on_metadata = client.post("/search", json={"vector": index.embeddings[0].tolist(), "k": 12,
                                               "filter": ["shop=north", "price in [10, 30, 50]"]})
    kept = [(r["metadata"]["shop"], r["metadata"]["price"]) for r in on_metadata.json()["results"]]
    assert sorted(kept) == [("north", "10"), ("north", "30"), ("north", "50")]  # CSV values are text
    unknown = client.post("/search", json={"vector": index.embeddings[0].tolist(), "filter": {"no_such_key": 1}})
    assert unknown.status_code == 400 and "no_such_key" in unknown.json()["error"]
    assert upload(client, PNG).status_code == 200


def test_uploads_over_the_size_limit(make_client):
    from rankopt.serve.limits import Limits

    client = make_client(limits=Limits(max_upload_bytes=4000))
    big = image_bytes((10, 20, 30), "BMP", size=64)  # 12 kB uncompressed
    answer = upload(client, big)
    assert answer.status_code == 413 and "over the limit of 4000 bytes" in answer.json()["error"]

    def chunks():  # no Content-Length: the limit is enforced as the body streams in
        yield b'{"image_base64": "'
        for _ in range(100):
            yield b"A" * 100
        yield b'"}'

    streamed = client.post("/search", content=chunks(), headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413 and "over the limit" in streamed.json()["error"]
    assert upload(client, PNG).status_code == 200


def test_token_guards_the_api_but_not_the_page(make_client):
    client = make_client(token="s3cret")
    for path in ("/", "/health", "/static/app.js"):
        assert client.get(path).status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
        answer = client.post("/search", json={"id": "0"}, headers=headers)
        assert answer.status_code == 401 and answer.headers["www-authenticate"] == "Bearer"
        assert "bearer token" in answer.json()["error"]
        assert client.get("/metrics", headers=headers).status_code == 401
        assert client.get("/thumbnails/0", headers=headers).status_code == 401
    good = {"Authorization": "Bearer s3cret"}
    answer = upload(client, PNG, headers=good)
    assert answer.status_code == 200
    item_id = answer.json()["results"][0]["id"]
    assert client.post("/search", json={"id": item_id}, headers=good).status_code == 200
    assert client.get(f"/items/{item_id}", headers=good).status_code == 200
    assert client.get(f"/thumbnails/{item_id}", headers=good).status_code == 200


def test_page_and_static_files(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'src="static/app.js"' in page.text and 'id="file"' in page.text
    assert client.get("/static/style.css").status_code == 200
    assert client.get("/static/../app.py").status_code == 404
    assert "access-control-allow-origin" not in client.get("/health", headers={"Origin": "http://elsewhere"}).headers


def test_cors_when_asked(make_client):
    client = make_client(cors_origins=("http://app.example",))
    answer = client.get("/health", headers={"Origin": "http://app.example"})
    assert answer.headers["access-control-allow-origin"] == "http://app.example"
    assert "access-control-allow-origin" not in client.get("/health", headers={"Origin": "http://other"}).headers
