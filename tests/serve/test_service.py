"""The service's machinery: Prometheus metrics, micro-batching, reload on change, host and model checks."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from torch.utils._python_dispatch import TorchDispatchMode
from helpers.checkpoints import write_checkpoint

from rankopt.cli import main
from rankopt.search import Index
from rankopt.serve import IndexHolder
from rankopt.serve.server import check_host

from helpers.images import image_bytes

from .conftest import TEST_HOSTS
from helpers.serving import PNG, assert_same_results, cli_records, upload

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:[a-zA-Z_]\w*="(?:[^"\\]|\\.)*",?)*)\})? (\S+)$')


def parse_prometheus(text: str) -> dict[tuple[str, frozenset], float]:
    """``{(name, labels): value}`` of Prometheus text; every sample line must parse and every family
    have ``# HELP`` and ``# TYPE`` lines before its samples."""
    samples, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        match = SAMPLE.match(line)
        assert match, f"not a Prometheus sample line: {line!r}"
        name, labels, value = match.groups()
        assert re.sub(r"_(bucket|sum|count)$", "", name) in typed or name in typed, f"{name} has no # TYPE"
        pairs = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', labels or ""))
        samples[(name, pairs)] = float(value)
    return samples


def test_metrics_count_requests_errors_latency_batches_and_items(client):
    for _ in range(3):
        assert upload(client, PNG).status_code == 200
    for _ in range(2):
        assert upload(client, b"not an image").status_code == 400
    assert client.get("/items/nope").status_code == 404
    answer = client.get("/metrics")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    m = parse_prometheus(answer.text)
    search = {("route", "/search"), ("method", "POST")}
    assert m[("rankopt_serve_requests_total", frozenset({*search, ("code", "200")}))] == 3
    assert m[("rankopt_serve_requests_total", frozenset({*search, ("code", "400")}))] == 2
    assert m[("rankopt_serve_errors_total", frozenset({("route", "/search"), ("code", "400")}))] == 2
    assert m[("rankopt_serve_errors_total", frozenset({("route", "/items/{item_id}"), ("code", "404")}))] == 1
    route = ("route", "/search")
    buckets = sorted((float("inf") if dict(labels)["le"] == "+Inf" else float(dict(labels)["le"]), value)
                     for (name, labels), value in m.items()
                     if name == "rankopt_serve_request_duration_seconds_bucket" and route in labels)
    assert [v for _, v in buckets] == sorted(v for _, v in buckets) and buckets[-1] == (float("inf"), 5)
    assert m[("rankopt_serve_request_duration_seconds_count", frozenset({route}))] == 5
    assert m[("rankopt_serve_request_duration_seconds_sum", frozenset({route}))] > 0
    assert m[("rankopt_serve_batch_images_count", frozenset())] == 3
    assert m[("rankopt_serve_batch_images_sum", frozenset())] == 3
    assert m[("rankopt_serve_index_items", frozenset())] == 12
    # stages: 5 uploads decoded (2 failed, not timed), 3 queued, transformed and searched, 3 forwards of one image
    expected = {"decode": 3, "queue": 3, "transform": 3, "forward": 3, "search": 3}
    for stage, count in expected.items():
        labels = frozenset({("stage", stage)})
        assert m[("rankopt_serve_stage_seconds_count", labels)] == count, stage
        assert m[("rankopt_serve_stage_seconds_sum", labels)] > 0, stage
    total = m[("rankopt_serve_request_duration_seconds_sum", frozenset({route}))]
    assert sum(m[("rankopt_serve_stage_seconds_sum", frozenset({("stage", s)}))] for s in expected) < total


def test_concurrent_uploads_are_embedded_together_with_the_same_answers(make_client):
    images = [image_bytes(colour) for colour in ((200, 30, 30), (30, 200, 30), (30, 30, 200), (90, 90, 90), (250, 250, 0))]
    alone = make_client()
    expected = [upload(alone, data).json()["results"] for data in images]
    batched = make_client(max_wait_ms=1000, max_batch=8)
    with ThreadPoolExecutor(len(images)) as pool:
        answers = list(pool.map(lambda data: upload(batched, data), images))
    for answer, results in zip(answers, expected):
        assert answer.status_code == 200
        assert_same_results(answer.json()["results"], results)
    batches = batched.app.state.service.metrics.batches
    assert batches.sum == len(images) and sum(batches.counts) < len(images)  # fewer forwards than images


def test_a_batch_searches_its_queries_of_one_k_with_one_call(make_client, monkeypatch):
    """Six uploads in one batch, three with k=2 and three with k=4: two searches (one per k), each answer the one
    the query gets alone, and the search stage counted once per query."""
    from rankopt.serve.app import Service

    calls: list[int] = []
    search = Service._search

    def counted(snapshot, vectors, query):
        calls.append(1 if isinstance(vectors, int) else len(vectors))
        return search(snapshot, vectors, query)

    images = [image_bytes(colour) for colour in ((200, 30, 30), (30, 200, 30), (30, 30, 200), (90, 90, 90),
                                                 (250, 250, 0), (0, 250, 250))]
    ks = [2, 4, 2, 4, 2, 4]
    alone = make_client()
    expected = [upload(alone, data, k=k).json()["results"] for data, k in zip(images, ks)]
    monkeypatch.setattr(Service, "_search", staticmethod(counted))
    batched = make_client(max_wait_ms=2000, max_batch=8)
    # an image said to be on its way for the whole exchange: the collector, given the first upload, waits its 2 s
    # for the others (however the six requests are scheduled) instead of embedding it alone
    on_its_way = batched.app.state.service.batcher.expecting()
    batched.portal.call(on_its_way.__enter__)  # on the service's event loop, as a request does
    try:
        with ThreadPoolExecutor(len(images)) as pool:
            answers = list(pool.map(lambda pair: upload(batched, pair[0], k=pair[1]), zip(images, ks)))
    finally:
        batched.portal.call(on_its_way.__exit__, None, None, None)
    for answer, results, k in zip(answers, expected, ks):
        assert answer.status_code == 200 and len(answer.json()["results"]) == k
        assert_same_results(answer.json()["results"], results)
    metrics = batched.app.state.service.metrics
    assert metrics.batches.sum == len(images) and sum(metrics.batches.counts) == 1  # one forward for all six
    assert sorted(calls) == [3, 3]
    searched = parse_prometheus(batched.get("/metrics").text)
    assert searched[("rankopt_serve_stage_seconds_count", frozenset({("stage", "search")}))] == len(images)


class _TorchOps(TorchDispatchMode):
    """Records the aten operations dispatched while active (on the thread that entered it)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("torch_free_transform", [True, False], ids=["transform-on-workers", "transform-needs-torch"])
def test_every_torch_operation_runs_on_the_torch_thread(make_client, monkeypatch, torch_free_transform):
    """Loading, forwards, searches and the transforms that need torch run on the torch thread (torch ops on a
    second thread start a second OpenMP team, and both teams slow down); the request threads decode and, where
    the transform is the compiled kernel, make the model input there without any torch computation (wrapping
    the kernel's array, ``aten.lift_fresh``, is the one operation dispatched)."""
    from rankopt.serve.app import Service
    from rankopt.serve.holder import IndexHolder, Snapshot

    threads: dict[str, set[str]] = {"load": set(), "transform": set(), "embed": set(), "search": set()}
    worker_threads: set[str] = set()
    worker_ops: set[str] = set()

    def recorded(name, fn):
        def call(*args, **kwargs):
            threads[name].add(threading.current_thread().name)
            return fn(*args, **kwargs)
        return call

    def transform_here(self, image):
        if not torch_free_transform:
            return None
        worker_threads.add(threading.current_thread().name)
        with _TorchOps() as mode:
            out = original_here(self, image)
        worker_ops.update(mode.ops)
        assert out is not None  # the test preset is fused
        return out

    original_here = Snapshot.transform_here
    monkeypatch.setattr(IndexHolder, "_load", recorded("load", IndexHolder._load))
    monkeypatch.setattr(Snapshot, "transform", recorded("transform", Snapshot.transform))
    monkeypatch.setattr(Snapshot, "transform_here", transform_here)
    monkeypatch.setattr(Snapshot, "embed", recorded("embed", Snapshot.embed))
    monkeypatch.setattr(Service, "_search", staticmethod(recorded("search", Service._search)))
    client = make_client(max_wait_ms=50)
    images = [image_bytes(colour) for colour in ((200, 30, 30), (30, 200, 30), (30, 30, 200))]
    with ThreadPoolExecutor(len(images)) as pool:
        answers = list(pool.map(lambda data: upload(client, data), images))
    assert [answer.status_code for answer in answers] == [200] * len(images)
    assert client.post("/search", json={"id": cli_ids(answers[0])[0], "k": 2}).status_code == 200
    if torch_free_transform:
        assert not threads.pop("transform") and worker_ops == {"aten.lift_fresh.default"}
        assert worker_threads and all(name.startswith("rankopt-serve") for name in worker_threads), worker_threads
    names = set().union(*threads.values())
    assert all(threads.values()) and len(names) == 1 and names.pop().startswith("rankopt-torch"), threads


def cli_ids(answer) -> list[str]:
    return [record["id"] for record in answer.json()["results"]]


@pytest.mark.parametrize("where", ["transform_here", "transform"])
def test_a_failing_transform_fails_its_own_request_only(make_client, monkeypatch, where):
    """On a worker thread (``transform_here``) or in a batch on the torch thread (``transform``)."""
    from rankopt.serve.holder import Snapshot
    from rankopt.serve.errors import ApiError

    transform = getattr(Snapshot, where)

    def picky(self, image):
        if image.getpixel((0, 0)) == (1, 2, 3):
            raise ApiError(422, "this image cannot be transformed")
        return transform(self, image)

    if where == "transform":
        monkeypatch.setattr(Snapshot, "transform_here", lambda self, image: None)
    monkeypatch.setattr(Snapshot, where, picky)
    client = make_client(max_wait_ms=200, max_batch=8)
    images = [image_bytes((1, 2, 3)), image_bytes((200, 30, 30)), image_bytes((30, 200, 30))]
    with ThreadPoolExecutor(len(images)) as pool:
        answers = list(pool.map(lambda data: upload(client, data), images))
    assert answers[0].status_code == 422 and "cannot be transformed" in answers[0].json()["error"]
    assert [answer.status_code for answer in answers[1:]] == [200, 200]
    assert client.get("/health").status_code == 200


def _grown(index_dir, extra: int = 2) -> Index:
    """The index of ``index_dir`` with ``extra`` more items: negated vectors of the first ones, their images
    copied to new files."""
    index = Index.load(index_dir)
    paths = [str(shutil.copy(index.paths[i], index_dir.parent / f"added{i}.png")) for i in range(extra)]
    return index.add(-index.embeddings[:extra], paths=paths)


def test_reload_swaps_the_index_without_dropping_requests(make_client, index_dir):
    client = make_client()
    holder = client.app.state.service.holder
    assert holder.poll() is None  # nothing changed
    statuses, stop = [], threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            statuses.append(upload(client, PNG).status_code)

    thread = threading.Thread(target=hammer)
    thread.start()
    try:
        grown = _grown(index_dir)
        for _ in range(3):  # saves swap the folder in while requests run
            grown.save(index_dir)
            holder.poll()
    finally:
        stop.set()
        thread.join()
    assert statuses and set(statuses) == {200}
    assert client.get("/health").json()["items"] == 14
    added = client.post("/search", json={"vector": grown.embeddings[13].tolist(), "k": 1}).json()["results"][0]
    assert added["path"] == grown.paths[13] and client.get(f"/items/{added['id']}").json()["path"] == grown.paths[13]
    # a folder that fails to load keeps the served index and says why (once)
    good = (index_dir / "index.json").read_text()
    (index_dir / "index.json").write_text("{broken")
    assert holder.poll() is False and "index.json" in holder.last_error and holder.poll() is None
    health = client.get("/health").json()
    assert health["items"] == 14 and "index.json" in health["reload_error"]
    assert upload(client, PNG).status_code == 200
    (index_dir / "index.json").write_text(good)
    assert holder.poll() is None and holder.last_error is None


def test_the_watcher_reloads_by_itself(make_client, index_dir):
    client = make_client(reload_every_s=0.1)
    _grown(index_dir, extra=1).save(index_dir)
    deadline = time.monotonic() + 30
    while client.get("/health").json()["items"] != 13:
        assert time.monotonic() < deadline, "the index was not reloaded within 30 s"
        time.sleep(0.05)
    assert client.app.state.service.metrics.reloads["ok"] == 1


def test_a_rebuilt_index_with_another_model_brings_its_model(make_client, served, index_dir, query_files, tmp_path,
                                                              capsys):
    client = make_client()
    holder = client.app.state.service.holder
    other = write_checkpoint(tmp_path / "other.ckpt", seed=3)
    assert main(["index", str(other), "--images", str(served / "gallery"), "--out", str(index_dir), "--device", "cpu",
                 "--no-progress"]) == 0
    assert holder.poll() is True
    fingerprint = Index.load(index_dir).fingerprint
    assert holder.current.embedder.fingerprint == fingerprint != Index.load(served / "idx").fingerprint
    expected = cli_records(index_dir, query_files[:1], tmp_path)
    capsys.readouterr()
    assert_same_results(upload(client, query_files[0].read_bytes()).json()["results"], expected[0]["results"])


def test_a_model_of_another_fingerprint_is_refused(index_dir, tmp_path):
    other = write_checkpoint(tmp_path / "other.ckpt", seed=5)
    with pytest.raises(ValueError, match="the weights differ"):
        IndexHolder(index_dir, checkpoint=other, device="cpu")
    info = json.loads((index_dir / "index.json").read_text())
    info["checkpoint"] = None
    (index_dir / "index.json").write_text(json.dumps(info))
    with pytest.raises(ValueError, match="records no checkpoint"):
        IndexHolder(index_dir, device="cpu")


def test_only_the_loopback_without_a_token(index_dir, capsys):
    for host in ("127.0.0.1", "localhost", "::1"):
        check_host(host, None)
    check_host("0.0.0.0", "secret")
    for host in ("0.0.0.0", "192.168.1.20", "::"):
        with pytest.raises(ValueError, match="pass --token"):
            check_host(host, None)
    assert main(["serve", str(index_dir), "--host", "0.0.0.0"]) == 1
    err = capsys.readouterr().err
    assert "--token" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_failing_forward_is_a_json_500_and_the_service_goes_on(index_dir, monkeypatch):
    from fastapi.testclient import TestClient

    from rankopt.serve import Settings, create_app
    from rankopt.serve.holder import Snapshot

    embed, calls = Snapshot.embed, []

    def fail_once(self, images):
        calls.append(len(images))
        if len(calls) == 1:
            raise RuntimeError("out of memory, say")
        return embed(self, images)

    monkeypatch.setattr(Snapshot, "embed", fail_once)
    app = create_app(IndexHolder(index_dir, device="cpu"), Settings(reload_every_s=0, hosts=TEST_HOSTS))
    with TestClient(app, raise_server_exceptions=False) as client:
        failed = upload(client, PNG)
        assert failed.status_code == 500 and "out of memory, say" in failed.json()["error"]
        assert upload(client, PNG).status_code == 200 and calls == [1, 1]


def test_queries_embedded_by_the_onnx_export(served, index_dir, client, tmp_path):
    pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
    pytest.importorskip("onnxscript", reason="the onnx extra is not installed")
    from fastapi.testclient import TestClient

    from rankopt.export import export_checkpoint
    from rankopt.serve import Settings, create_app

    onnx = export_checkpoint(served / "model.ckpt", tmp_path / "model.onnx", progress=False).path
    holder = IndexHolder(index_dir, onnx=onnx, device="cpu")
    assert type(holder.current.embedder.model).__name__ == "OnnxNet"
    one = IndexHolder(index_dir, onnx=onnx, device="cpu", threads=1)  # rankopt serve --onnx M --threads 1
    assert one.current.embedder.model.session.get_session_options().intra_op_num_threads == 1
    with TestClient(create_app(holder, Settings(reload_every_s=0, hosts=TEST_HOSTS))) as by_onnx:
        for data in (PNG, image_bytes((30, 140, 150), "JPEG", size=120)):
            got, want = upload(by_onnx, data).json()["results"], upload(client, data).json()["results"]
            assert [r["id"] for r in got] == [r["id"] for r in want]
            assert all(abs(a["score"] - b["score"]) <= 1e-4 for a, b in zip(got, want))


def test_a_missing_extra_is_one_line_with_the_install_hint(index_dir, monkeypatch, capsys):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else find_spec(name, *a))
    assert main(["serve", str(index_dir)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "rankopt serve: error: rankopt serve needs uvicorn: pip install 'rankopt[serve]'"


def test_the_http_parser_is_httptools_where_it_imports_else_h11(monkeypatch):
    import sys

    from uvicorn.protocols.http.h11_impl import H11Protocol

    from rankopt.serve.server import http_parser, timed_protocol

    assert http_parser("h11") == "h11" and issubclass(timed_protocol(1.0, "h11"), H11Protocol)
    with pytest.raises(ValueError, match="one of auto, httptools, h11"):
        http_parser("picohttp")
    monkeypatch.setitem(sys.modules, "httptools", None)  # not installed: auto falls back, asking for it fails
    assert http_parser("auto") == "h11"
    with pytest.raises(ImportError, match="pip install httptools"):
        http_parser("httptools")
    monkeypatch.undo()
    pytest.importorskip("httptools")
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    assert http_parser("auto") == "httptools" and issubclass(timed_protocol(1.0), HttpToolsProtocol)
