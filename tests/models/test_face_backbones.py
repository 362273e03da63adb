"""Face backbones: SENet-50 (VGGFace2 release) and IResNet (arcface_torch release).

Independent references: key layouts written here by stage rules from the released
model definitions (the Oxford ``senet50_256`` PyTorch port, insightface
``arcface_torch/backbones/iresnet.py``), the published SE-ResNet-50 parameter count,
and functional re-computations of each release's forward pass (``F.conv2d``,
``F.batch_norm``, ... read by key from a state_dict) in float64.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from rankopt.models import BACKBONES, RetrievalNet, build_backbone, build_pooling, create_model
from rankopt.models.backbones.pretrained import adapt_state_dict
from rankopt.models.backbones.vit import VIT_LAYOUTS

Layout = dict[str, tuple[int, ...]]
SENET_STAGES = ((2, 3, 64), (3, 4, 128), (4, 6, 256), (5, 3, 512))  # conv{stage}_{1..blocks}, bottleneck width
IRESNET_DEPTHS = {"iresnet50": (3, 4, 14, 3), "iresnet100": (3, 13, 30, 3)}


def _bn(name: str, channels: int) -> Layout:
    stats = {f"{name}.{k}": (channels,) for k in ("weight", "bias", "running_mean", "running_var")}
    return {**stats, f"{name}.num_batches_tracked": ()}


def senet_release_layout(descriptor_dim: int | None) -> Layout:
    """Keys of senet50_256.pth (descriptor_dim=256) / senet50_ft without its classifier (None)."""
    layout: Layout = {"conv1_7x7_s2.weight": (64, 3, 7, 7), **_bn("conv1_7x7_s2_bn", 64)}
    cin = 64
    for stage, blocks, width in SENET_STAGES:
        cout = 4 * width
        for block in range(1, blocks + 1):
            p = f"conv{stage}_{block}"
            layout |= {f"{p}_1x1_reduce.weight": (width, cin, 1, 1), **_bn(f"{p}_1x1_reduce_bn", width)}
            layout |= {f"{p}_3x3.weight": (width, width, 3, 3), **_bn(f"{p}_3x3_bn", width)}
            layout |= {f"{p}_1x1_increase.weight": (cout, width, 1, 1), **_bn(f"{p}_1x1_increase_bn", cout)}
            layout |= {f"{p}_1x1_down.weight": (cout // 16, cout, 1, 1), f"{p}_1x1_down.bias": (cout // 16,)}
            layout |= {f"{p}_1x1_up.weight": (cout, cout // 16, 1, 1), f"{p}_1x1_up.bias": (cout,)}
            if block == 1:
                layout |= {f"{p}_1x1_proj.weight": (cout, cin, 1, 1), **_bn(f"{p}_1x1_proj_bn", cout)}
            cin = cout
    if descriptor_dim is not None:
        layout["feat_extract.weight"] = (descriptor_dim, 2048, 1, 1)
    return layout


def iresnet_release_layout(depths: tuple[int, ...]) -> Layout:
    """Keys of arcface_torch's backbone.pth for IResNet with ``depths`` blocks per stage."""
    layout: Layout = {"conv1.weight": (64, 3, 3, 3), **_bn("bn1", 64), "prelu.weight": (64,)}
    cin = 64
    for stage, (depth, width) in enumerate(zip(depths, (64, 128, 256, 512)), start=1):
        for block in range(depth):
            p = f"layer{stage}.{block}"
            layout |= {**_bn(f"{p}.bn1", cin), f"{p}.conv1.weight": (width, cin, 3, 3), **_bn(f"{p}.bn2", width)}
            layout |= {f"{p}.prelu.weight": (width,), f"{p}.conv2.weight": (width, width, 3, 3)}
            layout |= _bn(f"{p}.bn3", width)
            if block == 0:
                layout |= {f"{p}.downsample.0.weight": (width, cin, 1, 1), **_bn(f"{p}.downsample.1", width)}
            cin = width
    return layout | {**_bn("bn2", 512), "fc.weight": (512, 512 * 7 * 7), "fc.bias": (512,), **_bn("features", 512)}


LAYOUTS = {
    "senet50_256": senet_release_layout(256),
    "senet50_2048": senet_release_layout(None),
    **{name: iresnet_release_layout(depths) for name, depths in IRESNET_DEPTHS.items()},
}


def random_release_state(layout: Layout, seed: int = 0) -> dict[str, Tensor]:
    """Random tensors in ``layout``: He-scaled conv/linear weights, BN statistics away from identity."""
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in layout.items():
        if key.endswith("num_batches_tracked"):
            state[key] = torch.randint(0, 1000, shape, generator=gen)
        elif key.endswith("running_var"):
            state[key] = 0.5 + torch.rand(shape, generator=gen)
        elif len(shape) > 1:
            state[key] = torch.randn(shape, generator=gen) * math.sqrt(1.0 / math.prod(shape[1:]))
        elif key.endswith(".weight") and "prelu" not in key:  # BN gamma
            state[key] = 1.0 + 0.1 * torch.randn(shape, generator=gen)
        else:  # BN beta / running_mean, conv/linear biases, PReLU slopes
            state[key] = 0.1 * torch.randn(shape, generator=gen)
    return state


def _save(state: dict[str, Tensor], path) -> None:
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save(state, path)


# ----------------------------------------------------------------------------- (a) layouts
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_state_dict_names_and_shapes_equal_the_release_layout(name: str) -> None:
    state = build_backbone(name).state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == LAYOUTS[name]


def test_layout_spot_checks_and_published_parameter_count() -> None:
    senet = build_backbone("senet50_2048")
    # SE-ResNet-50 (Hu et al.): 28,088,024 parameters with its 1000-class fc (2048 * 1000 + 1000)
    assert sum(p.numel() for p in senet.parameters()) == 28_088_024 - 2_049_000
    keys = set(build_backbone("senet50_256").state_dict())
    assert {"conv5_3_1x1_down.bias", "conv4_1_1x1_proj_bn.running_var", "feat_extract.weight"} <= keys
    assert "feat_extract.bias" not in keys and "conv2_1_3x3.bias" not in keys and "conv2_2_1x1_proj.weight" not in keys
    iresnet = build_backbone("iresnet50")
    assert iresnet.fc.weight.shape == (512, 25088) and not iresnet.features.weight.requires_grad
    assert (senet.num_features, build_backbone("senet50_256").num_features, iresnet.num_features) == (2048, 256, 512)


# ----------------------------------------------------------------------------- (b) loading release files
@pytest.mark.parametrize("name", list(LAYOUTS))
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_release_file_loads_exactly(tmp_path, name: str, suffix: str) -> None:
    state = random_release_state(LAYOUTS[name])
    path = tmp_path / f"{name}{suffix}"
    _save(state, path)
    loaded = build_backbone(name, pretrained=True, pretrained_path=path).state_dict()
    assert loaded.keys() == state.keys()
    assert all(torch.equal(loaded[k], v) for k, v in state.items())


def test_iresnet_fc_is_kept_and_classifiers_are_dropped(tmp_path) -> None:
    state = random_release_state(LAYOUTS["iresnet50"])
    torch.save(state, tmp_path / "backbone.pth")
    model = build_backbone("iresnet50", pretrained=True, pretrained_path=tmp_path / "backbone.pth")
    assert torch.equal(model.fc.weight, state["fc.weight"]) and not model.features.weight.requires_grad
    # senet50_ft carries an 8631-way classifier conv; converted files may lack num_batches_tracked
    state = random_release_state(LAYOUTS["senet50_2048"])
    state = {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")}
    state |= {"classifier.weight": torch.randn(8631, 2048, 1, 1), "classifier.bias": torch.randn(8631)}
    torch.save(state, tmp_path / "senet50_ft.pth")
    loaded = build_backbone("senet50_2048", pretrained=True, pretrained_path=tmp_path / "senet50_ft.pth").state_dict()
    assert "classifier.weight" not in loaded and all(torch.equal(loaded[k], v) for k, v in state.items() if k in loaded)


@pytest.mark.parametrize("name", BACKBONES.names())
def test_classifier_drop_keeps_exactly_the_models_own_keys(name: str) -> None:
    model = build_backbone(name, **({"depth": 1} if name in VIT_LAYOUTS else {}))
    own = model.state_dict()
    extra = {k: torch.zeros(3) for k in ("fc.weight", "fc.bias", "head.weight", "head_dist.bias", "classifier.weight")}
    adapted = adapt_state_dict({**extra, **own}, model)
    assert adapted.keys() == own.keys()
    assert all(adapted[k] is own[k] for k in own if k != "pos_embed")


@pytest.mark.parametrize(
    ("name", "edit", "message"),
    [
        ("senet50_256", lambda s: s.pop("conv5_3_1x1_up.bias"), r"missing \['conv5_3_1x1_up.bias'\]"),
        ("senet50_256", lambda s: s.update({"conv6_1_3x3.weight": torch.zeros(1)}),
         r"unexpected \['conv6_1_3x3.weight'\]"),
        ("senet50_256", lambda s: s.update({"feat_extract.weight": torch.zeros(128, 2048, 1, 1)}),
         r"shapes: \['feat_extract.weight \(128, 2048, 1, 1\), model \(256, 2048, 1, 1\)'\]"),
        ("iresnet50", lambda s: s.pop("fc.bias"), r"missing \['fc.bias'\]"),
    ],
)
def test_mismatched_release_file_is_a_clear_error(tmp_path, name: str, edit, message: str) -> None:
    state = random_release_state(LAYOUTS[name])
    edit(state)
    path = tmp_path / "w.pth"
    torch.save(state, path)
    with pytest.raises(ValueError, match=rf"weights from .*w\.pth do not match the model.*{message}"):
        build_backbone(name, pretrained=True, pretrained_path=path)


def test_iresnet100_file_does_not_load_into_iresnet50(tmp_path) -> None:
    torch.save(random_release_state(LAYOUTS["iresnet100"]), tmp_path / "r100.pth")
    with pytest.raises(ValueError, match=r"unexpected \['layer2\.4\."):
        build_backbone("iresnet50", pretrained=True, pretrained_path=tmp_path / "r100.pth")


def test_face_backbones_need_a_weights_file() -> None:
    with pytest.raises(ValueError, match="pretrained_path=FILE"):
        build_backbone("senet50_256", pretrained=True)


# ----------------------------------------------------------------------------- (c) forward passes
def _conv(state: dict[str, Tensor], name: str, x: Tensor, stride: int = 1, padding: int = 0) -> Tensor:
    return F.conv2d(x, state[f"{name}.weight"], state.get(f"{name}.bias"), stride, padding)


def _bn_eval(state: dict[str, Tensor], name: str, x: Tensor) -> Tensor:
    return F.batch_norm(x, state[f"{name}.running_mean"], state[f"{name}.running_var"],
                        state[f"{name}.weight"], state[f"{name}.bias"], training=False, eps=1e-5)


def senet_reference(state: dict[str, Tensor], images: Tensor) -> Tensor:
    """The port's forward: stride on 1x1_reduce/1x1_proj, SE gate on 1x1_increase_bn, pool5 7x7/1, feat_extract."""
    x = F.relu(_bn_eval(state, "conv1_7x7_s2_bn", _conv(state, "conv1_7x7_s2", images, 2, 3)))
    x = F.max_pool2d(x, 3, 2, ceil_mode=True)
    for stage, blocks, _ in SENET_STAGES:
        for block in range(1, blocks + 1):
            p, stride = f"conv{stage}_{block}", 2 if block == 1 and stage > 2 else 1
            r = F.relu(_bn_eval(state, f"{p}_1x1_reduce_bn", _conv(state, f"{p}_1x1_reduce", x, stride)))
            r = F.relu(_bn_eval(state, f"{p}_3x3_bn", _conv(state, f"{p}_3x3", r, 1, 1)))
            r = _bn_eval(state, f"{p}_1x1_increase_bn", _conv(state, f"{p}_1x1_increase", r))
            squeezed = F.relu(_conv(state, f"{p}_1x1_down", F.adaptive_avg_pool2d(r, 1)))
            gate = torch.sigmoid(_conv(state, f"{p}_1x1_up", squeezed))
            shortcut = x
            if block == 1:
                shortcut = _bn_eval(state, f"{p}_1x1_proj_bn", _conv(state, f"{p}_1x1_proj", x, stride))
            x = F.relu(gate * r + shortcut)
    return _conv(state, "feat_extract", F.avg_pool2d(x, 7, 1)).flatten(1)


def iresnet_reference(state: dict[str, Tensor], images: Tensor, depths: tuple[int, ...]) -> Tensor:
    """arcface_torch's forward: BN-conv-BN-PReLU-conv(stride)-BN + shortcut; bn2, flatten, fc, features."""
    x = F.prelu(_bn_eval(state, "bn1", _conv(state, "conv1", images, 1, 1)), state["prelu.weight"])
    for stage, depth in enumerate(depths, start=1):
        for block in range(depth):
            p, stride = f"layer{stage}.{block}", 2 if block == 0 else 1
            r = _conv(state, f"{p}.conv1", _bn_eval(state, f"{p}.bn1", x), 1, 1)
            r = F.prelu(_bn_eval(state, f"{p}.bn2", r), state[f"{p}.prelu.weight"])
            r = _bn_eval(state, f"{p}.bn3", _conv(state, f"{p}.conv2", r, stride, 1))
            shortcut = x
            if block == 0:
                shortcut = _bn_eval(state, f"{p}.downsample.1", _conv(state, f"{p}.downsample.0", x, stride))
            x = r + shortcut
    x = F.linear(_bn_eval(state, "bn2", x).flatten(1), state["fc.weight"], state["fc.bias"])
    return _bn_eval(state, "features", x)


@pytest.mark.parametrize(("name", "size"), [("senet50_256", 224), ("iresnet50", 112)])
def test_forward_equals_the_release_forward(tmp_path, name: str, size: int) -> None:
    state = random_release_state(LAYOUTS[name], seed=1)
    torch.save(state, tmp_path / "w.pth")
    model = build_backbone(name, pretrained=True, pretrained_path=tmp_path / "w.pth").double().eval()
    images = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    state64 = {k: v.double() if v.is_floating_point() else v for k, v in state.items()}
    with torch.no_grad():
        out = model(images)
        expected = senet_reference(state64, images) if name.startswith("senet") else iresnet_reference(
            state64, images, IRESNET_DEPTHS[name])
    assert out.shape == (1, model.num_features)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9 * expected.abs().max().item())


@pytest.mark.parametrize(("name", "size", "shape"), [
    ("senet50_256", 224, (2, 256)), ("senet50_2048", 224, (2, 2048, 7, 7)),
    ("iresnet50", 112, (2, 512)), ("iresnet100", 112, (2, 512)),
])
def test_forward_shape_finite_and_deterministic(name: str, size: int, shape: tuple[int, ...]) -> None:
    model = build_backbone(name).eval()
    images = torch.randn(2, 3, size, size)
    with torch.no_grad():
        first, second = model(images), model(images)
    assert first.shape == shape and torch.isfinite(first).all() and torch.equal(first, second)
    assert not torch.allclose(first[0], first[1])  # the two images give different outputs


def test_iresnet_rejects_other_input_sizes() -> None:
    with pytest.raises(ValueError, match="needs 112x112 inputs.*got 128x128"), torch.no_grad():
        build_backbone("iresnet50").eval()(torch.randn(1, 3, 128, 128))


# ----------------------------------------------------------------------------- (d) retrieval head
@pytest.mark.parametrize(("name", "size", "dim"), [("iresnet50", 112, 512), ("senet50_256", 224, 256)])
def test_retrieval_net_gives_unit_norm_descriptors_unprojected(name: str, size: int, dim: int) -> None:
    net = RetrievalNet(build_backbone(name), build_pooling("avg"), embedding_dim=None).eval()
    with torch.no_grad():
        out = net(torch.randn(2, 3, size, size))
        raw = net.backbone(torch.randn(1, 3, size, size))
    assert net.embedding_dim == dim and out.shape == (2, dim) and raw.shape == (1, dim)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(2, dtype=out.dtype))


def test_senet50_2048_map_is_pooled_by_the_head() -> None:
    model = create_model("senet50_2048", pooling="gem", embedding_dim=None).eval()
    with torch.no_grad():
        out = model(torch.randn(1, 3, 224, 224))
    assert out.shape == (1, 2048) and torch.allclose(out.norm(dim=1), torch.ones(1))
