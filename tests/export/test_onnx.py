"""``rankopt export --format onnx``: every backbone family exports with a dynamic batch axis, the metadata carries
the preprocessing and the checkpoint's fingerprint, the parity check (per-row cosine, R@1 / mAP@R) is exact and
refuses an unfaithful export, and ``rankopt index --onnx`` embeds through onnxruntime interchangeably with the
checkpoint. Real photos: Caltech-101 with the released MobileNetV2 (RANKOPT_CALTECH101 and
RANKOPT_WEIGHTS_MOBILENETV2; skipped when unset)."""

from __future__ import annotations

import copy
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")
onnx = pytest.importorskip("onnx")

from helpers.checkpoints import write_checkpoint  # noqa: E402 - after the optional imports
from helpers.images import class_tree  # noqa: E402 - after the optional imports

from rankopt.cli import main  # noqa: E402
from rankopt.data import build_dataset  # noqa: E402
from rankopt.data.image_folder import folder_dataset  # noqa: E402
from rankopt.data.transforms import PRESETS  # noqa: E402
from rankopt.export import OnnxNet, export_checkpoint, export_onnx, row_cosines  # noqa: E402
from rankopt.export import onnx as export_module  # noqa: E402
from rankopt.export.parity import COSINE_TOLERANCE, METRIC_TOLERANCE, ParityReport, compare, sample  # noqa: E402
from rankopt.models import create_model  # noqa: E402
from rankopt.models.fingerprint import model_fingerprint  # noqa: E402
from rankopt.postprocess import PostProcessing  # noqa: E402
from rankopt.search import Embedder, Index  # noqa: E402


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return class_tree(tmp_path / "gallery")


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "model.ckpt", ["model.pooling=gem"])


# (backbone, create_model options, preprocessing): the head variants (GeM / avg / max pooling, LayerNorm,
# projection) spread over the families (small CNNs, ResNet, MobileNetV2, EfficientNet-Lite, MobileFaceNet, ViT)
BACKBONES = [
    ("convnet_tiny", {"pooling": "gem", "layer_norm": True, "embedding_dim": 16}, {"transform": "test", "image_size": 40}),
    ("convnet_small", {"pooling": "max"}, {"transform": "omniglot_test", "image_size": 32}),
    ("resnet18", {"pooling": "gem", "embedding_dim": 32}, {"transform": "test", "image_size": 64}),
    ("mobilenet_v2", {"pooling": "avg"}, {"transform": "test", "image_size": 64}),
    ("efficientnet_lite0", {"pooling": "gem", "embedding_dim": 24}, {"transform": "tf_lite_test", "image_size": 64}),
    ("mobilefacenet", {"pooling": "avg"}, {"transform": "mobilefacenet_test", "image_size": None}),
    ("deit_small_patch16_224", {"pooling": "avg", "img_size": 64}, {"transform": "test", "image_size": 64}),
]


@pytest.mark.parametrize(("name", "options", "preprocessing"), BACKBONES, ids=[b[0] for b in BACKBONES])
def test_backbones_export_with_a_dynamic_batch_axis(tmp_path, name, options, preprocessing):
    torch.manual_seed(1)
    model = create_model(name, **options).eval()
    path = export_onnx(model, preprocessing, tmp_path / f"{name}.onnx")
    net = OnnxNet(path, device="cpu", threads=1)
    batch_axis = net.session.get_inputs()[0].shape[0]
    assert isinstance(batch_axis, str), f"the batch axis is fixed to {batch_axis}"
    assert net.embedding_dim == model.embedding_dim
    assert net.fingerprint == model_fingerprint(model, preprocessing)
    for batch in (1, 5):
        images = torch.randn(batch, *net.input_shape)
        with torch.no_grad():
            expected = model(images)
        got = net(images)
        assert got.shape == expected.shape == (batch, model.embedding_dim)
        assert float(row_cosines(expected, got).min()) >= COSINE_TOLERANCE
        assert torch.allclose(got.norm(dim=1), torch.ones(batch), atol=1e-5)  # the L2 normalisation is in the graph


def test_metadata_holds_the_input_convention_and_preprocessing(tmp_path):
    torch.manual_seed(0)
    model = create_model("convnet_tiny").eval()
    face = {"transform": "mobilefacenet_test", "image_size": None}
    path = export_onnx(model, face, tmp_path / "face.onnx", source="face.ckpt")
    properties = {p.key: p.value for p in onnx.load(path).metadata_props}
    spec = json.loads(properties["input"])
    assert (spec["height"], spec["width"], spec["colour_order"], spec["layout"]) == (112, 96, "RGB", "NCHW")
    assert np.allclose(spec["mean"], [0.5] * 3) and np.allclose(spec["std"], [128 / 255] * 3)  # (255 x - 127.5) / 128
    assert [s["op"] for s in spec["steps"]] == ["resize", "normalize"] and spec["steps"][0]["size"] == [112, 96]
    assert json.loads(properties["preprocessing"]) == face and properties["source"] == "face.ckpt"
    assert json.loads(properties["model"])["embedding_dim"] == model.embedding_dim

    photo = {"transform": "test", "image_size": 128}  # shorter side 256/224 x 128 = 146.3 -> 146, centre crop 128
    properties = {p.key: p.value for p in onnx.load(export_onnx(model, photo, tmp_path / "p.onnx")).metadata_props}
    spec = json.loads(properties["input"])
    assert spec["steps"][0]["shorter_side"] == 146 and spec["steps"][1] == {"op": "center_crop", "size": [128, 128]}
    assert np.allclose(spec["mean"], PRESETS["test"].mean) and np.allclose(spec["std"], PRESETS["test"].std)
    with pytest.raises(ValueError, match="deterministic test transform"):
        export_onnx(model, {"transform": "train", "image_size": 64}, tmp_path / "train.onnx")


def test_row_cosines_and_report_tolerances():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
    expected = [float(np.dot(x, y) / np.sqrt(np.dot(x, x) * np.dot(y, y))) for x, y in zip(a, b)]
    assert np.allclose(row_cosines(torch.tensor(a, dtype=torch.float32), torch.tensor(b)).numpy(), expected, atol=1e-6)
    assert row_cosines(torch.zeros(1, 3), torch.ones(1, 3)).isnan().all()
    good = ParityReport("x", 3, 0.999995, 1.0, {"recall@1": (0.5, 0.5 + 0.9 * METRIC_TOLERANCE)})
    assert good.ok
    assert not ParityReport("x", 3, 0.99998, 1.0, {}).ok
    assert not ParityReport("x", 3, float("nan"), 1.0, {}).ok
    worse = ParityReport("x", 3, 1.0, 1.0, {"map@r": (0.5, 0.5 + 2 * METRIC_TOLERANCE)})
    assert worse.failures() == ["map@r 0.5020 vs PyTorch 0.5000 (tolerance 0.001)"]


def test_sample_keeps_two_images_of_each_class_it_takes():
    from rankopt.data.base import RetrievalDataset

    labels = np.repeat(np.arange(10), 5)  # 10 classes x 5 images
    dataset = RetrievalDataset([f"{i}.png" for i in range(50)], labels, "test", ("class",))
    taken = sample(dataset, 9)  # k = max(2, ceil(9 / 10)) = 2 images of 4 classes 0, 3, 6, 9
    assert taken.paths == ["0.png", "1.png", "15.png", "16.png", "30.png", "31.png", "45.png", "46.png"]
    assert [len(sample(dataset, n)) for n in (30, 50, 100)] == [30, 50, 50]  # 3 of each class; all; all
    unlabelled = RetrievalDataset([f"{i}.png" for i in range(50)], np.full(50, -1), "images", ("class",))
    assert sample(unlabelled, 3).paths == ["0.png", "24.png", "49.png"]  # evenly spaced positions (24.5 -> 24)
    with pytest.raises(ValueError, match=">= 1"):
        sample(dataset, 0)


def test_parity_tells_another_model_apart(tmp_path, tree):
    """Two models of the same architecture with different weights: the check must fail."""
    preprocessing = {"transform": "test", "image_size": 32}
    torch.manual_seed(0)
    first = create_model("convnet_tiny", embedding_dim=8).eval()
    torch.manual_seed(1)
    second = create_model("convnet_tiny", embedding_dim=8).eval()
    net = OnnxNet(export_onnx(second, preprocessing, tmp_path / "second.onnx"), device="cpu")
    report = compare(first, net, preprocessing, folder_dataset(tree), progress=False)
    assert report.images == 12 and report.cosine_min < 0.99 and not report.ok
    assert compare(second, net, preprocessing, folder_dataset(tree), progress=False).ok


def test_parity_on_the_embedded_synthetic_dataset(tmp_path, checkpoint):
    images = build_dataset("synthetic", None, "test")
    exported = export_checkpoint(checkpoint, tmp_path / "m.onnx", images=images, limit=120, progress=False)
    report = exported.parity
    assert report.images == 120 and report.cosine_min >= COSINE_TOLERANCE and report.cosine_max <= 1 + 1e-6
    assert set(report.metrics) == {"recall@1", "map@r"}
    for reference, candidate in report.metrics.values():
        assert 0 < reference <= 1 and abs(reference - candidate) <= METRIC_TOLERANCE


def test_an_unfaithful_export_is_refused_and_nothing_is_written(tmp_path, checkpoint, monkeypatch):
    real_export = export_module.export_onnx

    def perturbed(model, preprocessing, out, **kwargs):
        """Export a copy whose projection differs from the checkpoint's (metadata still claims its fingerprint)."""
        twin = copy.deepcopy(model)
        with torch.no_grad():
            twin.projection.weight.add_(0.05 * torch.randn_like(twin.projection.weight))
        return real_export(twin, preprocessing, out, **kwargs)

    monkeypatch.setattr(export_module, "export_onnx", perturbed)
    out = tmp_path / "out" / "m.onnx"
    out.parent.mkdir()
    with pytest.raises(ValueError, match="does not reproduce its embeddings.*nothing written"):
        export_checkpoint(checkpoint, out, progress=False)
    assert list(out.parent.iterdir()) == []


def test_onnx_embedder_has_the_checkpoints_fingerprint_and_indexes_interchange(tmp_path, checkpoint, tree):
    path = export_checkpoint(checkpoint, tmp_path / "m.onnx", progress=False).path
    by_torch, by_onnx = Embedder.from_checkpoint(checkpoint, progress=False), Embedder.from_onnx(path, progress=False)
    assert by_onnx.fingerprint == by_torch.fingerprint and by_onnx.preprocessing == by_torch.preprocessing
    assert Embedder.from_checkpoint(path).fingerprint == by_torch.fingerprint  # an .onnx path is run by onnxruntime
    onnx_index, torch_index = Index.build(by_onnx, tree, progress=False), Index.build(by_torch, tree, progress=False)
    assert onnx_index.fingerprint == torch_index.fingerprint
    assert float(row_cosines(onnx_index.embeddings, torch_index.embeddings).min()) >= COSINE_TOLERANCE
    query = sorted(tree.rglob("*.png"))[:2]
    for index, other in ((onnx_index, by_torch), (torch_index, by_onnx)):  # queries embedded by the other runtime
        result = index.search(query, k=4, model=other)
        assert torch.allclose(result.scores, torch_index.search(query, k=4, model=by_torch).scores, atol=1e-5)
    other_checkpoint = write_checkpoint(tmp_path / "other.ckpt", ["model.pooling=gem"], seed=5)
    other_onnx = export_checkpoint(other_checkpoint, tmp_path / "other.onnx", progress=False).path
    with pytest.raises(ValueError, match="fingerprint"):
        onnx_index.search(query, k=2, model=Embedder.from_onnx(other_onnx, progress=False))
    with pytest.raises(ValueError, match="need the PyTorch checkpoint"):
        by_onnx.with_postprocessing(PostProcessing(scales=(1.0, 0.5)))


def test_onnx_files_not_exported_by_rankopt_are_clear_errors(tmp_path):
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])])
    plain = tmp_path / "plain.onnx"
    onnx.save(helper.make_model(graph), str(plain))
    with pytest.raises(ValueError, match="not an embedding model exported by rankopt"):
        OnnxNet(plain)
    garbage = tmp_path / "garbage.onnx"
    garbage.write_text("not a model")
    with pytest.raises(ValueError, match="not a model onnxruntime can run"):
        OnnxNet(garbage)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        OnnxNet(tmp_path / "missing.onnx")
    torch.manual_seed(0)
    net = OnnxNet(export_onnx(create_model("convnet_tiny").eval(), {"transform": "test", "image_size": 32},
                              tmp_path / "m.onnx"))
    with pytest.raises(ValueError, match=r"takes \(B, 3, 32, 32\) images"):
        net(torch.zeros(2, 3, 40, 40))


def test_cli_export_then_index_and_search_with_onnx(tmp_path, checkpoint, tree, capsys):
    out = tmp_path / "m.onnx"
    assert main(["export", str(checkpoint), "--format", "onnx", "--out", str(out), "--check-images", str(tree),
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out
    cosine = float(re.search(r"per-row cosine ONNX vs PyTorch min ([0-9.]+)", printed).group(1))
    assert cosine >= COSINE_TOLERANCE and "recall@1: PyTorch" in printed and "map@r: PyTorch" in printed
    fingerprint = Embedder.from_checkpoint(checkpoint).fingerprint
    assert f"fingerprint {fingerprint} (the checkpoint's)" in printed and "dynamic batch axis" in printed

    index_dir = tmp_path / "index"
    assert main(["index", "--onnx", str(out), "--images", str(tree), "--out", str(index_dir), "--no-progress"]) == 0
    assert json.loads((index_dir / "index.json").read_text())["fingerprint"] == fingerprint
    query = sorted(tree.rglob("*.png"))[0]
    assert main(["search", str(index_dir), str(query), "--no-progress", "--top-k", "1"]) == 0  # the index's ONNX model
    assert main(["search", str(index_dir), str(query), "--no-progress", "--checkpoint", str(checkpoint)]) == 0
    capsys.readouterr()
    assert main(["index", str(checkpoint), "--onnx", str(out), "--images", str(tree), "--out", str(tmp_path / "x")]) == 1
    assert "one of them" in capsys.readouterr().err
    assert main(["index", "--images", str(tree), "--out", str(tmp_path / "y")]) == 1


def test_cli_export_without_images_checks_a_synthetic_batch(tmp_path, checkpoint, capsys):
    assert main(["export", str(checkpoint), "--out", str(tmp_path / "m.onnx"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "synthetic batch of random images" in printed and "synthetic batch of 16 random-pixel images" in printed
    assert main(["export", str(checkpoint), "--out", str(tmp_path / "n.onnx"), "--root", "x"]) == 1
    assert "--root/--split go with --dataset" in capsys.readouterr().err


def _real(variable: str) -> Path:
    value = os.environ.get(variable)
    if not value or not Path(value).exists():
        pytest.skip(f"set {variable} to the real copy to run this test")
    return Path(value)


def test_real_caltech101_mobilenet_v2_export_keeps_embeddings_and_metrics(tmp_path, capsys):
    """The released MobileNetV2 converted (ImageNet features), exported, and compared on 150 Caltech-101 test photos
    (3 per class): the same R@1 / mAP@R (random weights give R@1 near 1/50)."""
    root, weights = _real("RANKOPT_CALTECH101"), _real("RANKOPT_WEIGHTS_MOBILENETV2")
    checkpoint = tmp_path / "m.ckpt"
    assert main(["convert", "mobilenet_v2", str(weights), "--out", str(checkpoint)]) == 0
    images = build_dataset("caltech101", root, "test")
    exported = export_checkpoint(checkpoint, tmp_path / "m.onnx", images=images, limit=150, progress=False)
    report = exported.parity
    assert report.images == 150 and report.cosine_min >= COSINE_TOLERANCE
    (reference, candidate), (map_reference, map_candidate) = report.metrics["recall@1"], report.metrics["map@r"]
    assert abs(reference - candidate) <= METRIC_TOLERANCE and abs(map_reference - map_candidate) <= METRIC_TOLERANCE
    assert reference > 0.3  # real ImageNet features on real photos
    assert exported.fingerprint == Embedder.from_checkpoint(checkpoint).fingerprint


def test_a_missing_onnxruntime_is_a_one_line_install_hint(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import onnxruntime -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'rankopt\[onnx\]'"):
        OnnxNet(tmp_path / "m.onnx")
    photos = class_tree(tmp_path / "photos")  # the photos are checked first: the model's runtime is what fails
    assert main(["index", "--onnx", str(tmp_path / "m.onnx"), "--images", str(photos), "--out", str(tmp_path / "i")]) == 1
    assert "needs onnxruntime: pip install 'rankopt[onnx]'" in capsys.readouterr().err
