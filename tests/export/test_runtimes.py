"""The runtime of every frozen forward (:mod:`rankopt.export.runtimes`): ``auto`` runs onnxruntime where it is
installed and the export keeps parity, cached by fingerprint and checked once; it falls back to PyTorch with the
reason otherwise; ``onnx`` refuses instead. The embedder, the index, the service and ``fit``'s trunk pass use it.
Real photos: Caltech-101 with the released MobileNetV2 (RANKOPT_CALTECH101 and RANKOPT_WEIGHTS_MOBILENETV2;
skipped when unset). The rest of the suite runs on PyTorch (``RANKOPT_RUNTIME=torch`` in tests/conftest.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from helpers.checkpoints import write_checkpoint  # noqa: E402 - after the optional imports
from helpers.images import class_tree  # noqa: E402 - after the optional imports

from .test_onnx import _real  # noqa: E402

from rankopt.data.reader import read_ahead  # noqa: E402
from rankopt.export import OnnxNet, row_cosines  # noqa: E402
from rankopt.export import runtimes  # noqa: E402
from rankopt.export.parity import COSINE_TOLERANCE  # noqa: E402
from rankopt.fit.trunk import flat_trunk, frozen_forwards, trunk_outputs  # noqa: E402
from rankopt.models import create_model  # noqa: E402
from rankopt.models.fingerprint import model_fingerprint  # noqa: E402
from rankopt.models.stages import cut  # noqa: E402
from rankopt.postprocess import PostProcessing, fit_supervised_whitening  # noqa: E402
from rankopt.search import Embedder, Index  # noqa: E402

PREPROCESSING = {"transform": "test", "image_size": 40}


@pytest.fixture
def net() -> torch.nn.Module:
    torch.manual_seed(3)
    return create_model("convnet_tiny", pooling="gem", layer_norm=True, embedding_dim=16).eval()


def _prepare(net, folder, runtime="auto", **kw):
    return runtimes.prepare_network(net, PREPROCESSING, model_fingerprint(net, PREPROCESSING), runtime=runtime,
                                    folder=folder, **kw)


def test_onnx_runs_a_parity_checked_export_made_once_and_reused(net, tmp_path, monkeypatch):
    said: list[str] = []
    fast, runtime = _prepare(net, tmp_path, "onnx", threads=1, say=said.append)
    assert isinstance(fast, OnnxNet) and runtime.name == "onnxruntime" and runtime.threads == 1
    assert said and "ONNX" in said[0]
    key = model_fingerprint(net, PREPROCESSING)
    verdict = json.loads((tmp_path / f"{key}.json").read_text())
    assert verdict["cosine_min"] >= COSINE_TOLERANCE and (tmp_path / f"{key}.onnx").is_file()
    for batch in (1, 7):
        images = torch.randn(batch, 3, 40, 40)
        with torch.no_grad():
            expected = net(images)
        assert float(row_cosines(expected, fast(images)).min()) >= COSINE_TOLERANCE
    # the second time: no export, no parity check, no line
    monkeypatch.setattr(runtimes, "export_onnx", lambda *a, **k: pytest.fail("exported again"))
    said.clear()
    again, runtime = _prepare(net, tmp_path, "onnx", say=said.append)
    assert isinstance(again, OnnxNet) and runtime.name == "onnxruntime" and not said


@pytest.mark.parametrize(("measured", "chosen"), [((9.0, 3.0), "onnxruntime"), ((3.0, 9.0), "pytorch")])
def test_auto_keeps_the_faster_runtime_at_the_callers_batch(net, tmp_path, monkeypatch, measured, chosen):
    asked = []
    monkeypatch.setattr(runtimes, "timings", lambda network, onnx_net, batch, verdict: asked.append(batch) or measured)
    network, runtime = _prepare(net, tmp_path, batch=8)
    assert runtime.name == chosen and asked == [8]
    assert f"at batch 8: PyTorch {measured[0]:.1f} ms, onnxruntime {measured[1]:.1f} ms" in runtime.note
    assert (network is net) == (chosen == "pytorch")


def test_the_two_runtimes_are_timed_once_per_batch(net, tmp_path, monkeypatch):
    fast, _ = _prepare(net, tmp_path, "onnx", threads=1)
    verdict = tmp_path / f"{model_fingerprint(net, PREPROCESSING)}.json"
    torch_ms, onnx_ms = runtimes.timings(net, fast, 4, verdict)
    assert 0 < torch_ms < 10_000 and 0 < onnx_ms < 10_000
    assert list(json.loads(verdict.read_text())["timings"].values()) == [[torch_ms, onnx_ms]]
    assert "cosine_min" in json.loads(verdict.read_text())  # the parity verdict is kept
    monkeypatch.setattr(fast, "forward", lambda images: pytest.fail("timed again"))
    assert runtimes.timings(net, fast, 4, verdict) == (torch_ms, onnx_ms)


def test_other_weights_never_take_a_cached_export(net, tmp_path):
    _prepare(net, tmp_path, "onnx")
    other = create_model("convnet_tiny", pooling="gem", layer_norm=True, embedding_dim=16).eval()
    fast, _ = _prepare(other, tmp_path, "onnx")
    images = torch.randn(3, 3, 40, 40)
    with torch.no_grad():
        assert float(row_cosines(other(images), fast(images)).min()) >= COSINE_TOLERANCE
    assert len(list(tmp_path.glob("*.onnx"))) == 2


def test_a_failed_or_unfaithful_export_falls_back_to_torch_and_is_remembered(net, tmp_path, monkeypatch):
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("unsupported operator\nmore lines")

    monkeypatch.setattr(runtimes, "export_onnx", broken)
    network, runtime = _prepare(net, tmp_path)
    assert network is net and runtime.name == "pytorch"
    assert "onnxruntime not used" in runtime.note and "unsupported operator" in runtime.note
    network, runtime = _prepare(net, tmp_path)
    assert network is net and len(calls) == 1  # the refusal is remembered
    with pytest.raises(ValueError, match="unsupported operator"):
        _prepare(net, tmp_path, runtime="onnx")


def test_an_export_that_does_not_reproduce_the_network_is_refused(net, tmp_path, monkeypatch):
    real = runtimes.export_onnx

    def drifted(model, preprocessing, out, **kwargs):  # the export of other weights under this key
        other = create_model("convnet_tiny", pooling="gem", layer_norm=True, embedding_dim=16).eval()
        return real(other, preprocessing, out, **kwargs)

    monkeypatch.setattr(runtimes, "export_onnx", drifted)
    network, runtime = _prepare(net, tmp_path)
    assert network is net and "does not reproduce PyTorch" in runtime.note
    assert not list(tmp_path.glob("*.onnx"))


def test_without_onnxruntime_auto_says_why_and_onnx_refuses(net, tmp_path, monkeypatch):
    monkeypatch.setattr(runtimes, "onnx_unavailable", lambda: "running ONNX models needs onnxruntime: pip install")
    network, runtime = _prepare(net, tmp_path)
    assert network is net and runtime.name == "pytorch" and "needs onnxruntime" in runtime.note
    with pytest.raises(ImportError, match="needs onnxruntime"):
        _prepare(net, tmp_path, runtime="onnx")


def test_torch_and_accelerators_keep_pytorch(net, tmp_path):
    network, runtime = _prepare(net, tmp_path, runtime="torch")
    assert network is net and runtime.name == "pytorch" and not list(tmp_path.iterdir())
    network, runtime = _prepare(net, tmp_path, device="cuda")  # not run: only the choice
    assert network is net and runtime.device == "cuda"
    with pytest.raises(ValueError, match="runs on the CPU"):
        _prepare(net, tmp_path, runtime="onnx", device="cuda")
    with pytest.raises(ValueError, match="unknown runtime"):
        _prepare(net, tmp_path, runtime="fast")


def test_the_default_runtime_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv("RANKOPT_RUNTIME", raising=False)
    assert runtimes.default_runtime() == "auto"
    monkeypatch.setenv("RANKOPT_RUNTIME", "onnx")
    assert runtimes.default_runtime() == "onnx"
    monkeypatch.setenv("RANKOPT_RUNTIME", "tensorrt")
    with pytest.raises(ValueError, match="unknown runtime 'tensorrt'"):
        runtimes.default_runtime()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("RANKOPT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_an_index_built_on_onnxruntime_answers_queries_embedded_by_pytorch(tmp_path, cache):
    tree = class_tree(tmp_path / "gallery")
    checkpoint = write_checkpoint(tmp_path / "model.ckpt", ["model.pooling=gem"])
    fast = Embedder.from_checkpoint(checkpoint, device="cpu", runtime="onnx", progress=False)
    slow = Embedder.from_checkpoint(checkpoint, device="cpu", runtime="torch", progress=False)
    assert fast.fingerprint == slow.fingerprint
    a, b = fast.embed(tree).embeddings, slow.embed(tree).embeddings
    assert fast.active_runtime.name == "onnxruntime" and slow.active_runtime.name == "pytorch"
    assert float(row_cosines(a, b).min()) >= COSINE_TOLERANCE
    index = Index.build(fast, tree, progress=False)
    queries = sorted(str(p) for p in tree.rglob("*.png"))[:4]
    by_fast = index.search(queries, k=3)
    by_slow = index.search(slow.embed(queries).embeddings, k=3)
    assert torch.equal(by_fast.rows, by_slow.rows)


def test_multiscale_and_whitening_embed_on_onnxruntime(tmp_path, cache):
    tree = class_tree(tmp_path / "gallery")
    checkpoint = write_checkpoint(tmp_path / "model.ckpt", ["model.pooling=gem"])
    post = PostProcessing(scales=(1.0, 0.75))
    fast = Embedder.from_checkpoint(checkpoint, device="cpu", runtime="onnx", progress=False).with_postprocessing(post)
    slow = Embedder.from_checkpoint(checkpoint, device="cpu", runtime="torch", progress=False).with_postprocessing(post)
    a, b = fast.embed(tree).embeddings, slow.embed(tree).embeddings
    assert fast.active_runtime.name == "onnxruntime"
    assert float(row_cosines(a, b).min()) >= COSINE_TOLERANCE


def test_every_whitening_of_a_model_shares_its_one_export(tmp_path, cache):
    tree = class_tree(tmp_path / "gallery")
    checkpoint = write_checkpoint(tmp_path / "model.ckpt", ["model.pooling=gem"])
    plain = Embedder.from_checkpoint(checkpoint, device="cpu", runtime="onnx", progress=False)
    x = plain.embed(tree).embeddings
    labels = np.arange(len(x)) % 3
    exports = sorted((cache / "onnx").glob("*.onnx"))
    assert len(exports) == 1
    for shrinkage in (0.1, 0.5):  # two whitenings: two fingerprints of the embedder, one network
        whitening = fit_supervised_whitening(x, labels, shrinkage=shrinkage)
        whitening = dataclasses.replace(whitening, model_fingerprint=plain.fingerprint)
        whitened = Embedder.from_checkpoint(checkpoint, device="cpu", runtime="onnx", progress=False)
        whitened = whitened.with_postprocessing(PostProcessing(whitening=whitening))
        assert whitened.fingerprint != plain.fingerprint
        y = whitened.embed(tree).embeddings
        assert whitened.active_runtime.name == "onnxruntime" and sorted((cache / "onnx").glob("*.onnx")) == exports
        assert float(row_cosines(y, whitening.apply(x)).min()) >= COSINE_TOLERANCE


def test_the_service_names_its_runtime_in_health(tmp_path, cache):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from rankopt.serve.app import create_app
    from rankopt.serve.settings import Settings
    from rankopt.serve.settings import HostRule
    from rankopt.serve.holder import IndexHolder

    tree = class_tree(tmp_path / "gallery")
    checkpoint = write_checkpoint(tmp_path / "model.ckpt", ["model.pooling=gem"])
    Index.build(checkpoint, tree, progress=False, runtime="torch").save(tmp_path / "idx")
    settings = Settings(reload_every_s=0, token="secret", hosts=HostRule("127.0.0.1", ("testserver",)))
    with TestClient(create_app(IndexHolder(tmp_path / "idx", device="cpu", threads=1, runtime="onnx"),
                               settings)) as client:
        public = client.get("/health").json()["runtime"]
        private = client.get("/health", headers={"Authorization": "Bearer secret"}).json()["runtime"]
    assert public == {"name": "onnxruntime", "threads": 1, "device": "cpu"}
    assert private["name"] == "onnxruntime" and str(cache) in private["note"]


def test_read_ahead_keeps_the_order_and_raises_the_failing_item():
    class Items:
        def __getitem__(self, i):
            if i == 13:
                raise ValueError("cannot read image 'item13.jpg'")
            return i

    batches = list(read_ahead(Items(), list(range(12)), 5, list, threads=3))
    assert batches == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]
    with pytest.raises(ValueError, match="item13.jpg"):
        list(read_ahead(Items(), list(range(20)), 4, list, threads=2))
    with pytest.raises(ValueError, match=">= 1"):
        list(read_ahead(Items(), [0], 4, list, threads=0))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own niceness is Linux's")
def test_read_ahead_reads_below_the_callers_priority():
    """The reading threads yield the cores to the forward's threads (``READ_NICENESS``); the caller keeps its own."""
    from rankopt.data import reader

    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    class Items:
        def __getitem__(self, i):
            return niceness()

    caller = niceness()
    seen = [value for batch in read_ahead(Items(), list(range(8)), 4, list, threads=2) for value in batch]
    assert seen == [min(caller + reader.READ_NICENESS, 19)] * 8 and niceness() == caller


def test_fit_trunk_outputs_on_onnxruntime_equal_pytorchs(tmp_path, cache):
    from rankopt.data.image_folder import folder_dataset
    from rankopt.data.transforms import build_transform

    torch.manual_seed(0)
    net = create_model("mobilenet_v2", pooling="gem", embedding_dim=16).eval()
    trunk, _ = cut(net, 10)
    preprocessing = {"transform": "test", "image_size": 64}
    dataset = folder_dataset(class_tree(tmp_path / "photos"), build_transform("test", 64))
    fast_net, fast_trunk, runtime = frozen_forwards(net, trunk, preprocessing, "onnx", torch.device("cpu"),
                                                    lambda _: None)
    assert runtime.name == "onnxruntime" and isinstance(fast_trunk, OnnxNet)
    kw = {"device": torch.device("cpu"), "batch_size": 4}
    expected, shape = trunk_outputs(trunk, dataset, **kw)
    got, same = trunk_outputs(trunk, dataset, network=fast_trunk, read_threads=2, **kw)
    assert same == shape and float(row_cosines(expected, got).min()) >= COSINE_TOLERANCE
    mirrored, _ = trunk_outputs(trunk, dataset, network=fast_trunk, mirror=True, **kw)
    flipped, _ = trunk_outputs(trunk, dataset, network=flat_trunk(trunk), mirror=True, **kw)
    assert float(row_cosines(flipped, mirrored).min()) >= COSINE_TOLERANCE


def test_real_photos_embed_alike_on_both_runtimes(tmp_path, cache):
    root, weights = _real("RANKOPT_CALTECH101"), _real("RANKOPT_WEIGHTS_MOBILENETV2")
    photos = sorted(p for c in sorted(root.iterdir())[:8] if c.is_dir() for p in sorted(c.glob("*.jpg"))[:8])
    fast = Embedder.from_checkpoint(weights, device="cpu", runtime="onnx", progress=False)
    slow = Embedder.from_checkpoint(weights, device="cpu", runtime="torch", progress=False)
    a, b = fast.embed([str(p) for p in photos]).embeddings, slow.embed([str(p) for p in photos]).embeddings
    cosines = row_cosines(a, b)
    assert len(photos) >= 32 and float(cosines.min()) >= COSINE_TOLERANCE, np.sort(cosines.numpy())[:3]
