"""The service under attack, each attack as a security review reproduced it on 127.0.0.1 (issue 27): every one is
a 4xx JSON error that costs little (memory measured where the defect was memory, time bounded where it was a
stall), and every limit holds exactly at its edge."""

from __future__ import annotations

import base64
import gc
import json
import time
import tracemalloc

import pytest
import torch

from rankopt.search import Index
from rankopt.serve.settings import HostRule, host_name
from rankopt.serve.limits import Limits
from rankopt.serve.prometheus import OTHER

from helpers.serving import PNG, upload


def assert_refused(answer, status: int, message: str) -> None:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json", answer.headers
    assert message in answer.json()["error"] and "Traceback" not in answer.text


# ---------------------------------------------------------------------- metrics
def test_unknown_methods_do_not_grow_the_metrics(client):
    """2,000 requests with distinct 10 kB method names: before, each was a new label set kept forever (the review:
    RSS 520 -> 634 MB, /metrics 121 MB); now they are one label, ``other``."""
    client.get("/health")
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(2000):
            assert client.request(f"V{i:05d}" + "Q" * 10_000, "/health").status_code == 405
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 2_000_000, f"{kept} bytes kept after 2,000 requests with distinct methods"  # before: > 20 MB
    text = client.get("/metrics").text
    assert len(text) < 20_000 and "QQQQ" not in text
    assert f'method="{OTHER}",code="405"}} 2000' in text
    unknown_paths = [client.get(f"/no/such/path/{i}").status_code for i in range(50)]
    assert set(unknown_paths) == {404} and "/no/such" not in client.get("/metrics").text
    assert f'route="{OTHER}",method="GET",code="404"}} 50' in client.get("/metrics").text


# ---------------------------------------------------------------------- Host header
REBOUND = ("attacker.example", "attacker.example:8080", "127.0.0.1.attacker.example", "localhost.attacker.example:1")


@pytest.mark.parametrize("path", ["/items/0", "/thumbnails/0", "/health", "/", "/metrics", "/openapi.json"])
def test_a_rebound_host_is_refused_before_any_route(make_client, path):
    """DNS rebinding: a page at attacker.example rebinding its name to 127.0.0.1 sends ``Host: attacker.example``;
    before, /items returned absolute paths and /thumbnails the private image."""
    client = make_client(hosts=HostRule())
    for host in REBOUND:
        answer = client.get(path, headers={"Host": host})
        assert_refused(answer, 421, "does not answer for host")
        assert b"gallery" not in answer.content and answer.headers.get("content-type") != "image/jpeg"
    assert_refused(client.post("/search", json={"id": "0"}, headers={"Host": "attacker.example"}), 421, "--allow-host")
    for host in ("localhost", "localhost:8080", "127.0.0.1:8080", "[::1]:8080", "LOCALHOST.:9"):
        assert client.get(path, headers={"Host": host}).status_code == 200, host
    allowed = make_client(hosts=HostRule(allowed=("photos.lan",)))
    assert allowed.get(path, headers={"Host": "photos.lan:8080"}).status_code == 200
    assert allowed.get(path, headers={"Host": "attacker.example"}).status_code == 421


def test_the_host_rule():
    loopback = HostRule("127.0.0.1")
    assert all(loopback.accepts(h) for h in ("127.0.0.1", "localhost:1", "[::1]", "[::1]:80", None))
    assert not any(loopback.accepts(h) for h in ("10.0.0.2", "example.com", "", "localhost:port", "[::1", "a:1:2"))
    everywhere = HostRule("0.0.0.0", ("photos.lan",))
    assert all(everywhere.accepts(h) for h in ("10.0.0.2:8080", "[fe80::1]:8080", "photos.lan", "localhost"))
    assert not everywhere.accepts("attacker.example") and not everywhere.accepts("10.0.0.2.nip.io")
    assert HostRule("192.168.1.5").accepts("192.168.1.5:8080") and not HostRule("192.168.1.5").accepts("10.0.0.2")
    assert host_name("Photos.LAN.:8080") == "photos.lan" and host_name("[::1]:x") is None


# ---------------------------------------------------------------------- one request stalls all
def test_a_huge_filter_is_refused_before_it_is_parsed(make_client):
    """The review: a 19.9 MB JSON filter with 1.4 M keys took 6.5 s, parsed on the event loop and checked on the
    torch thread, before its unknown key was refused."""
    client = make_client()
    body = ('{"id": "0", "filter": {' + ",".join(f'"k{i}": 1' for i in range(1_400_000)) + "}}").encode()
    assert len(body) < 20 * 2**20
    start = time.perf_counter()
    answer = client.post("/search", content=body, headers={"Content-Type": "application/json"})
    assert time.perf_counter() - start < 1.0  # before: 6.5 s
    assert_refused(answer, 413, "values, over the limit of 100000")
    many = {f"k{i}": 1 for i in range(1001)}
    assert_refused(client.post("/search", json={"id": "0", "filter": many}), 413, "over the limit of 1000")
    unknown = {f"k{i}": 1 for i in range(1000)}  # within the limit: checked, off the torch thread
    assert_refused(client.post("/search", json={"id": "0", "filter": unknown}), 400, "unknown column 'k0'")
    assert_refused(client.post("/search", json={"id": "0", "filter": "a" + " " * 200_000 + "in [b]"}), 413,
                   "over 1000 characters")


def test_checks_run_before_the_torch_thread(make_client, monkeypatch):
    """A query the checks refuse never reaches the torch thread (its queue stays free for the others)."""
    from rankopt.serve import batcher

    client = make_client()
    calls = []
    original = batcher.MicroBatcher.call

    async def spy(self, fn, *args):
        calls.append(getattr(fn, "__name__", fn))
        return await original(self, fn, *args)

    monkeypatch.setattr(batcher.MicroBatcher, "call", spy)
    for body in ({"id": "0", "filter": {"nope": 1}}, {"id": "0", "k": 0}, {"id": "nope"}, {"vector": [1.0]},
                 {"id": "0", "filter": {"label": {}}}):
        assert client.post("/search", json=body).status_code in (400, 404)
    assert upload(client, PNG, fields={"filter": "nope=1"}).status_code == 400
    assert calls == []
    assert client.post("/search", json={"id": "0"}).status_code == 200 and len(calls) == 1


# ---------------------------------------------------------------------- 500s where a 4xx belongs
def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


BAD = {
    "filter value an object": ({"id": "0", "filter": {"label": {}}}, 400, "give a value or a list of values"),
    "filter value a nested list": ({"id": "0", "filter": {"label": [["a"]]}}, 400, "give a value or a list"),
    "filter key a number": ('{"id": "0", "filter": {"1": {"2": 3}}}', 400, "filter"),
    "400-digit integer in a vector": ('{"vector": [' + "9" * 400 + ", 0.1" * 15 + "]}", 400, "vector[0]"),
    "float32 overflow in a vector": ('{"vector": [1e300' + ", 0.1" * 15 + "]}", 400, "float32"),
    "5000-digit integer": ('{"id": "0", "k": ' + "9" * 5000 + "}", 400, "not valid JSON"),
    "100k-deep body": ('{"id": "0", "filter": ' + _nested(100_000) + "}", 400, "nested deeper than 8 levels"),
    "9-deep body": ('{"id": "0", "filter": ' + _nested(8) + "}", 400, "nested deeper than 8 levels"),
    "id null": ({"id": None}, 400, "id must be a string"),
    "id a list": ({"id": ["0"]}, 400, "id must be a string"),
    "k null": ({"id": "0", "k": None}, 400, "k must be an integer"),
    "k a float": ({"id": "0", "k": 3.0}, 400, "k must be an integer"),
    "k twice": ({"id": "0", "k": 3}, 400, "given twice"),
    "bad UTF-8": (b'{"id": "\xff"}', 400, "not valid JSON"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_malformed_json_is_a_4xx(client, case):
    body, status, message = BAD[case]
    params = {"k": 3} if case == "k twice" else None
    content = body if isinstance(body, bytes) else (body if isinstance(body, str) else json.dumps(body)).encode()
    answer = client.post("/search", params=params, content=content, headers={"Content-Type": "application/json"})
    assert_refused(answer, status, message)
    assert upload(client, PNG).status_code == 200


def test_malformed_form_fields_are_a_4xx(client):
    assert_refused(upload(client, PNG, fields={"filter": _nested(100_000)}), 400, "nested deeper")
    assert_refused(upload(client, PNG, fields={"filter": '{"label": {"a": 1}}'}), 400, "give a value")
    assert_refused(upload(client, PNG, fields={"filter": "[" * 2_000_000}), 400, "maximum size")  # a 1 MB field
    answer = upload(client, PNG, k=4, fields={"k": "3"})
    assert_refused(answer, 400, "given twice")


@pytest.mark.parametrize("k", ["3_0", "+3", "\uff13", " 3", "3 ", "0x3", "", "-0", "1e2"])
def test_k_is_ascii_digits_only(client, k):
    assert_refused(client.post("/search", params={"k": k}, json={"id": "0"}), 400, "k must be an integer")
    assert_refused(upload(client, PNG, k=None, fields={"k": k}), 400, "k must be an integer")


def test_limits_hold_exactly_at_their_edges(make_client, index_dir):
    client = make_client()
    capped = client.post("/search", json={"id": "0", "k": 1000})
    assert capped.status_code == 200 and "capped to 12" in capped.json()["note"]
    assert client.post("/search?k=1000", json={"id": "0"}).status_code == 200
    assert_refused(client.post("/search", json={"id": "0", "k": 1001}), 400, "between 1 and 1000")
    assert_refused(client.post("/search?k=1001", json={"id": "0"}), 400, "between 1 and 1000")
    assert client.post("/search", json={"id": "0", "k": 1}).status_code == 200
    # the body limit: exactly max_upload_bytes passes, one byte more is refused (declared or streamed)
    limit = 3000
    small = make_client(limits=Limits(max_upload_bytes=limit))
    query = b'{"id": "0", "k": 2}'
    exact = query + b" " * (limit - len(query))
    assert len(exact) == limit
    for body in (exact, iter([exact[:1000], exact[1000:]])):
        answer = small.post("/search", content=body, headers={"Content-Type": "application/json"})
        assert answer.status_code == 200, answer.text
    for body in (exact + b" ", iter([exact[:1000], exact[1000:] + b" "])):
        answer = small.post("/search", content=body, headers={"Content-Type": "application/json"})
        assert_refused(answer, 413, f"over the limit of {limit} bytes")
    # an image's base64 counts within the same limit
    image = base64.b64encode(PNG).decode()
    assert small.post("/search", json={"image_base64": image}).status_code == 200
    # vectors: the index's dimension exactly
    index = Index.load(index_dir)
    assert client.post("/search", json={"vector": [0.1] * index.dim}).status_code == 200
    assert_refused(client.post("/search", json={"vector": [0.1] * (index.dim + 1)}), 400, "values but the index")
    edge = float(torch.finfo(torch.float32).max)
    assert client.post("/search", json={"vector": [edge] + [0.0] * (index.dim - 1)}).status_code == 200


def test_json_limits_at_their_edges(make_client):
    client = make_client(limits=Limits(max_json_values=50, max_json_depth=4, max_filter_values=3))
    flat = {"id": "0", "filter": {"label": ["a", "b", "c"]}}  # 3 filter values: accepted (none matches)
    assert client.post("/search", json=flat).status_code == 200
    assert_refused(client.post("/search", json={"id": "0", "filter": {"label": ["a", "b", "c", "d"]}}), 413,
                   "4 values, over the limit of 3")
    four_deep = '{"id": "0", "filter": {"label": [["a"]]}}'  # depth 4, but a nested list is not a filter value
    assert_refused(client.post("/search", content=four_deep, headers={"Content-Type": "application/json"}), 400,
                   "give a value or a list")
    five_deep = '{"id": "0", "filter": {"label": [[["a"]]]}}'
    assert_refused(client.post("/search", content=five_deep, headers={"Content-Type": "application/json"}), 400,
                   "nested deeper than 4 levels")
    values = '{"id": "0"' + "".join(f', "x{i}": 1' for i in range(24)) + "}"  # 25 colons + 24 commas: 50 values
    assert_refused(client.post("/search", content=values, headers={"Content-Type": "application/json"}), 400,
                   "unknown key(s)")  # within the limit: parsed
    values = '{"id": "0"' + "".join(f', "x{i}": 1' for i in range(25)) + "}"  # 52 values
    assert_refused(client.post("/search", content=values, headers={"Content-Type": "application/json"}), 413,
                   "over the limit of 50")


# ---------------------------------------------------------------------- the small ones
def test_head_content_types_ids_and_headers(make_client):
    client = make_client()
    for path in ("/health", "/"):
        answer = client.head(path)
        assert answer.status_code == 200 and answer.content == b""
    upper = client.post("/search", content=b'{"id": "0"}', headers={"Content-Type": "APPLICATION/JSON; charset=UTF-8"})
    assert upper.status_code == 200, upper.text
    for media_type in ("application/jsonfoo", "application/json-seq", "text/json", "multipart/form-datax"):
        assert_refused(client.post("/search", content=b'{"id": "0"}', headers={"Content-Type": media_type}), 415,
                       "takes multipart/form-data")
    numeric = client.post("/search", json={"id": 0, "k": 1})
    assert numeric.status_code == 200 and numeric.json()["query"] == "0"
    for path in ("/", "/health", "/items/0", "/static/app.js", "/no/such"):
        headers = client.get(path).headers
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert "script-src 'self'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
        assert headers["referrer-policy"] == "no-referrer"


def test_health_shows_why_a_reload_failed_only_with_the_token(make_client, index_dir):
    client = make_client(token="s3cret")
    (index_dir / "index.json").write_text("{broken")
    holder = client.app.state.service.holder
    assert holder.poll() is False
    public = client.get("/health").json()
    assert public["reload_failed"] is True and "reload_error" not in public and str(index_dir) not in json.dumps(public)
    private = client.get("/health", headers={"Authorization": "Bearer s3cret"}).json()
    assert private["reload_failed"] is True and "index.json" in private["reload_error"]
    assert client.get("/health", headers={"Authorization": "Bearer wrong"}).json().get("reload_error") is None


def test_command_line_values_are_checked(index_dir, capsys):
    from rankopt.cli import main

    for args, message in ((["--port", "99999"], "between 1 and 65535"), (["--port", "0"], "between 1 and 65535"),
                          (["--reload-every", "-1"], ">= 0"), (["--max-k", "0"], ">= 1"), (["--max-images", "0"], ">= 1"),
                          (["--max-pixels", "many"], "expected an integer"), (["--request-timeout", "0"], ">= 0.001")):
        with pytest.raises(SystemExit) as exit_:
            main(["serve", str(index_dir), *args])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and message in err and "Traceback" not in err


# ---------------------------------------------------------------------- a rebuilt index
def test_a_folder_rebuilt_at_the_same_path_is_served_under_load(served, tmp_path, capsys):
    """The review: serve a 9-item folder, ``rm -rf`` it and build a 30-item one at the same path: the new folder is
    at version 1 again, and the service compared versions only, so it answered the old items forever."""
    import shutil
    import threading

    from fastapi.testclient import TestClient

    from rankopt.cli import main
    from rankopt.search import storage
    from rankopt.serve import IndexHolder, Settings, create_app

    from .conftest import TEST_HOSTS

    def build(images, out) -> None:
        assert main(["index", str(served / "model.ckpt"), "--images", str(images), "--out", str(out),
                     "--device", "cpu", "--no-progress"]) == 0

    folder, subset = tmp_path / "idx2", tmp_path / "subset"
    build(served / "gallery", folder)
    shutil.copytree(served / "gallery" / "alpha", subset / "alpha")
    first = storage.identity(folder)
    assert first[1] == 1 and Index.load(folder).info["uid"] == first[0]
    app = create_app(IndexHolder(folder, device="cpu"), Settings(reload_every_s=0.05, hosts=TEST_HOSTS))
    with TestClient(app) as client:
        assert client.get("/health").json()["items"] == 12
        statuses, stop = [], threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                statuses.append(upload(client, PNG).status_code)
                statuses.append(client.post("/search", json={"id": "0", "k": 3}).status_code)

        thread = threading.Thread(target=hammer)
        thread.start()
        try:
            shutil.rmtree(folder)
            build(subset, folder)  # 6 items, version 1 again
            second = storage.identity(folder)
            assert second[1] == 1 and second[0] != first[0]
            deadline = time.monotonic() + 30
            while client.get("/health").json()["items"] != 6:
                assert time.monotonic() < deadline, "the rebuilt folder was not served within 30 s"
                time.sleep(0.05)
        finally:
            stop.set()
            thread.join()
        assert statuses and set(statuses) == {200}
        paths = {r["path"] for r in client.post("/search", json={"id": "0", "k": 50}).json()["results"]}
        assert len(paths) == 6 and all("/alpha/" in p for p in paths)
    capsys.readouterr()


def test_changes_keep_the_uid_and_a_copy_gets_its_own(index_dir, tmp_path):
    from rankopt.search import storage

    uid, version = storage.identity(index_dir)
    with Index.editing(index_dir) as index:
        index.remove(ids=["0"])
    assert storage.identity(index_dir) == (uid, version + 1)
    Index.load(index_dir).save(tmp_path / "copy")
    assert storage.identity(tmp_path / "copy")[0] not in (None, uid)


# ---------------------------------------------------------------------- slow clients
@pytest.mark.parametrize("parser", ["h11", "httptools"])
def test_a_slow_client_is_cut_off(served, parser):
    """The review: slow clients were never timed out. A client trickling its headers, or its body, byte by byte
    holds its connection at most --request-timeout seconds, with either HTTP parser; the others are served
    meanwhile."""
    import socket

    import httpx

    from helpers.servers import running_server

    pytest.importorskip(parser)
    with running_server(served / "idx", "--request-timeout", "1.5", "--http", parser) as url:
        assert f"HTTP parsed by {parser}" in (served / f"server-{url.rsplit(':', 1)[1]}.log").read_text()
        port = int(url.rsplit(":", 1)[1])
        for head in (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                     b"POST /search HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                sock.sendall(head)
                start, closed = time.monotonic(), False
                while time.monotonic() - start < 8:
                    try:
                        sock.sendall(b"X" if head.endswith(b"{") else b"X-Slow: 1\r\n")
                        assert httpx.get(f"{url}/health", timeout=5).status_code == 200  # others are served
                        sock.settimeout(0.3)
                        if sock.recv(1024) == b"":
                            closed = True
                            break
                    except socket.timeout:
                        continue
                    except OSError:  # reset by the server
                        closed = True
                        break
                assert closed and time.monotonic() - start < 4, "the slow connection was not closed"
        with httpx.Client(base_url=url) as client:  # a normal keep-alive client is not cut off between requests
            for _ in range(3):
                assert client.get("/health").status_code == 200
                time.sleep(1.0)


def test_formats_option(index_dir, capsys):
    from rankopt.cli import main

    assert main(["serve", str(index_dir), "--formats", "png,EPS"]) == 1
    err = capsys.readouterr().err
    assert "EPS" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
