"""Retrieval network, pooling, BN freezing, PCA init and backbone naming/loading.

Independent references: float64 numpy brute force (pooling), numpy SVD (PCA),
``torch.nn.MultiheadAttention`` (ViT attention) and the published torchvision/timm
key names and parameter counts (hard-coded).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from torch import nn

from rankopt.models import BACKBONES, GeM, RetrievalNet, build_pooling, create_model
from rankopt.models.backbones.vit import Attention

HAS_TIMM = importlib.util.find_spec("timm") is not None


def _num_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ----------------------------------------------------------------------------- shapes
@pytest.mark.parametrize("backbone", ["convnet_tiny", "convnet_small"])
@pytest.mark.parametrize("pooling", ["avg", "max", "gem"])
@pytest.mark.parametrize("embedding_dim", [None, 24])
def test_output_shape_and_unit_norm(backbone: str, pooling: str, embedding_dim: int | None) -> None:
    model = create_model(backbone, pooling=pooling, layer_norm=True, embedding_dim=embedding_dim)
    out = model(torch.rand(5, 3, 64, 64))
    expected = embedding_dim or model.feature_dim
    assert out.shape == (5, expected) and model.embedding_dim == expected
    assert torch.allclose(out.norm(dim=1), torch.ones(5), atol=1e-5)


def test_vit_cls_output_and_other_image_size() -> None:
    model = create_model("deit_small_patch16_224", img_size=32, depth=2)
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 384)
    assert model(torch.rand(2, 3, 48, 48)).shape == (2, 384)  # interpolated position embeddings


def test_layer_norm_has_no_parameters_and_normalises() -> None:
    model = create_model("convnet_tiny", layer_norm=True)
    images = torch.rand(4, 3, 64, 64)
    pooled = model.backbone(images).mean(dim=(2, 3)).double()
    reference = (pooled - pooled.mean(1, keepdim=True)) / (pooled.var(1, unbiased=False, keepdim=True) + 1e-5).sqrt()
    torch.testing.assert_close(model.descriptors(images).double(), reference, atol=1e-5, rtol=1e-5)
    assert not list(model.norm.parameters())


# ----------------------------------------------------------------------------- pooling
def _gem_numpy(x: np.ndarray, p: float, eps: float = 1e-6) -> np.ndarray:
    b, c = x.shape[:2]
    out = np.zeros((b, c))
    for i in range(b):
        for j in range(c):
            vals = np.maximum(x[i, j].ravel(), eps)
            out[i, j] = np.mean(vals**p) ** (1.0 / p)
    return out


def test_gem_matches_brute_force_and_limits() -> None:
    x = torch.rand(3, 4, 5, 6, dtype=torch.float64) + 0.01
    xn = x.numpy()
    for p in (1.0, 2.5, 3.0):
        gem = GeM(p).double()
        np.testing.assert_allclose(gem(x).detach().numpy(), _gem_numpy(xn, p), rtol=1e-10)
    np.testing.assert_allclose(GeM(1.0)(x).detach().numpy(), xn.mean(axis=(2, 3)), rtol=1e-10)
    mx = xn.max(axis=(2, 3))
    gaps = [mx - GeM(p, learnable=False).double()(x).numpy() for p in (10.0, 100.0, 2000.0)]
    assert all(np.all(g >= -1e-12) for g in gaps)  # the power mean never exceeds the max ...
    assert np.all(gaps[0] > gaps[1]) and np.all(gaps[1] > gaps[2]) and gaps[2].max() < 3e-3  # ... and tends to it
    np.testing.assert_allclose(build_pooling("max")(x).numpy(), xn.max(axis=(2, 3)))
    np.testing.assert_allclose(build_pooling("avg")(x).numpy(), xn.mean(axis=(2, 3)))


def test_gem_p_learnable_gets_gradient_fixed_is_buffer_and_clamped() -> None:
    model = create_model("convnet_tiny", pooling="gem", gem_p=3.0, embedding_dim=8)
    model(torch.rand(4, 3, 64, 64)).pow(3).sum().backward()
    assert model.pooling.p.grad is not None and model.pooling.p.grad.abs() > 0
    assert any(p is model.pooling.p for p in model.head_parameters())
    fixed = GeM(3.0, learnable=False)
    assert not list(fixed.parameters()) and "p" in dict(fixed.named_buffers())
    x = torch.rand(2, 3, 4, 4) + 0.1
    learnable = GeM(2.0)
    with torch.no_grad():
        learnable.p.fill_(0.3)  # an optimizer pushed p below 1: it acts as p = 1
    assert torch.allclose(learnable(x), x.mean(dim=(2, 3)), atol=1e-6)
    with pytest.raises(ValueError, match="gem_p"):
        GeM(0.5)


# ----------------------------------------------------------------------------- BN freezing
def _bn_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}


def _assert_frozen_after_train_step(model: RetrievalNet) -> None:
    before = _bn_state(model)
    model.train()
    assert model.training
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    assert bns and not any(m.training for m in bns)
    model(torch.rand(6, 3, 64, 64) * 3 + 1).sum().backward()
    after = _bn_state(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(m.weight.grad is not None and m.weight.requires_grad for m in bns)  # gamma/beta still trained


def test_frozen_bn_stays_frozen_after_train() -> None:
    model = create_model("convnet_tiny", freeze_bn=True)
    model.eval()
    _assert_frozen_after_train_step(model)


def test_frozen_bn_survives_convert_sync_batchnorm() -> None:
    model = create_model("convnet_tiny", freeze_bn=True)
    model.train()  # BN frozen before the conversion; the conversion builds new layers
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(model, RetrievalNet)
    sync = [m for m in model.modules() if isinstance(m, nn.SyncBatchNorm)]
    assert sync and not any(m.training for m in sync)
    _assert_frozen_after_train_step(model)


def test_unfrozen_bn_updates_statistics() -> None:  # control: the check above can fail
    model = create_model("convnet_tiny", freeze_bn=False)
    before = _bn_state(model)
    model.train()
    model(torch.rand(6, 3, 64, 64) * 3 + 1)
    after = _bn_state(model)
    assert not all(torch.equal(before[k], after[k]) for k in before)


# ----------------------------------------------------------------------------- PCA
def test_pca_projection_equals_numpy_principal_components() -> None:
    model = create_model("convnet_tiny", embedding_dim=5)  # 64-d descriptors
    gen = torch.Generator().manual_seed(1)
    scales = torch.linspace(3.0, 0.1, 64, dtype=torch.float64)
    feats = (torch.randn(200, 64, generator=gen, dtype=torch.float64) * scales) @ torch.linalg.qr(
        torch.randn(64, 64, generator=gen, dtype=torch.float64)
    )[0] + 2.0
    model.init_projection_pca(feats.float())
    projected = model.projection(feats.float()).detach().double().numpy()
    x = feats.numpy()
    xc = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(xc, full_matrices=False)
    reference = xc @ vt[:5].T
    signs = np.sign((projected * reference).sum(axis=0))
    np.testing.assert_allclose(projected, reference * signs, atol=1e-4)
    assert np.all(np.diff(projected.var(axis=0)) < 0)  # ordered by explained variance


def test_pca_errors() -> None:
    with pytest.raises(RuntimeError, match="embedding_dim"):
        create_model("convnet_tiny").init_projection_pca(torch.randn(10, 64))
    model = create_model("convnet_tiny", embedding_dim=16)
    with pytest.raises(ValueError, match="rows"):
        model.init_projection_pca(torch.randn(8, 64))
    with pytest.raises(ValueError, match="dimensions"):
        model.init_projection_pca(torch.randn(80, 32))
    with pytest.raises(ValueError, match="NaN"):
        model.init_projection_pca(torch.full((80, 64), float("nan")))


# ----------------------------------------------------------------------------- parameter groups
@pytest.mark.parametrize("pooling", ["avg", "gem"])
def test_parameter_groups_partition_the_model(pooling: str) -> None:
    model = create_model("convnet_small", pooling=pooling, embedding_dim=16)
    ids = [id(p) for p in model.backbone_parameters()] + [id(p) for p in model.head_parameters()]
    assert len(ids) == len(set(ids)) and set(ids) == {id(p) for p in model.parameters()}


# ----------------------------------------------------------------------------- timm/torchvision compatibility
def test_resnet50_keys_and_parameter_count() -> None:
    model = create_model("resnet50")
    state = model.backbone.state_dict()
    assert state["conv1.weight"].shape == (64, 3, 7, 7)
    for key in ("bn1.running_var", "layer1.0.conv1.weight", "layer1.0.downsample.0.weight", "layer1.0.downsample.1.bias",
                "layer2.3.bn3.num_batches_tracked", "layer3.5.conv2.weight", "layer4.2.conv3.weight"):
        assert key in state, key
    assert state["layer4.2.conv3.weight"].shape == (2048, 512, 1, 1)
    assert not any(k.startswith("fc.") for k in state)
    assert len(state) == 318  # torchvision resnet50 has 320 keys, fc.weight and fc.bias included
    assert _num_params(model) == 23_508_032 and model.embedding_dim == 2048


@pytest.mark.parametrize(
    ("name", "count", "dim"),
    [("resnet18", 11_176_512, 512), ("resnet34", 21_284_672, 512), ("resnet101", 42_500_160, 2048),
     # timm: deit_small_patch16_224 22,050,664 and vit_base_patch16_224 86,567,656 with a 1000-class head
     ("deit_small_distilled_patch16_224", 22_050_664 - 385_000, 384), ("vit_base_patch16_224", 86_567_656 - 769_000, 768)],
)
def test_parameter_counts_match_published(name: str, count: int, dim: int) -> None:
    model = create_model(name)
    assert _num_params(model.backbone) == count and model.embedding_dim == dim


def test_vit_keys_match_timm() -> None:
    state = create_model("deit_small_patch16_224", img_size=32, depth=1).backbone.state_dict()
    expected = {"cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias", "norm.weight", "norm.bias"}
    expected |= {f"blocks.0.{k}" for k in ("norm1.weight", "norm1.bias", "attn.qkv.weight", "attn.qkv.bias",
                                            "attn.proj.weight", "attn.proj.bias", "norm2.weight", "norm2.bias",
                                            "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias")}
    assert set(state) == expected


def test_vit_attention_matches_torch_multihead_attention() -> None:
    attn = Attention(24, 4).double()
    ref = nn.MultiheadAttention(24, 4, batch_first=True).double()
    with torch.no_grad():
        ref.in_proj_weight.copy_(attn.qkv.weight)
        ref.in_proj_bias.copy_(attn.qkv.bias)
        ref.out_proj.weight.copy_(attn.proj.weight)
        ref.out_proj.bias.copy_(attn.proj.bias)
    x = torch.randn(3, 7, 24, dtype=torch.float64)
    torch.testing.assert_close(attn(x), ref(x, x, x, need_weights=False)[0])


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_pretrained_from_file_drops_classifier(tmp_path, suffix: str) -> None:
    source = create_model("resnet18").backbone.state_dict()
    source = {k: torch.randn_like(v) if v.is_floating_point() else v for k, v in source.items()}
    state = {**source, "fc.weight": torch.randn(1000, 512), "fc.bias": torch.randn(1000)}
    path = tmp_path / f"w{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(state, str(path))
    else:
        torch.save({"state_dict": state}, path)
    model = create_model("resnet18", pretrained=True, pretrained_path=path)
    loaded = model.backbone.state_dict()
    assert all(torch.equal(loaded[k], source[k]) for k in source)


def test_distilled_deit_loads_into_plain_deit(tmp_path) -> None:
    plain = create_model("deit_small_patch16_224", img_size=32, depth=1).backbone.state_dict()
    pos = torch.randn(1, 6, 384)  # cls, dist, 4 patches
    state = {**plain, "pos_embed": pos, "dist_token": torch.randn(1, 1, 384),
             "head.weight": torch.randn(10, 384), "head_dist.weight": torch.randn(10, 384)}
    path = tmp_path / "deit.pt"
    torch.save(state, path)
    model = create_model("deit_small_distilled_patch16_224", img_size=32, depth=1, pretrained=True, pretrained_path=path)
    torch.testing.assert_close(model.backbone.pos_embed.data, torch.cat([pos[:, :1], pos[:, 2:]], dim=1))


def test_mismatched_weights_file_is_a_clear_error(tmp_path) -> None:
    path = tmp_path / "w.pt"
    torch.save(create_model("resnet18").backbone.state_dict(), path)
    with pytest.raises(ValueError, match="do not match"):
        create_model("resnet34", pretrained=True, pretrained_path=path)
    with pytest.raises(FileNotFoundError, match="pretrained_path"):
        create_model("resnet18", pretrained=True, pretrained_path=tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="pretrained=False"):
        create_model("resnet18", pretrained_path=path)


@pytest.mark.skipif(HAS_TIMM, reason="timm is installed here")
def test_timm_missing_gives_clear_error() -> None:
    with pytest.raises(ImportError, match=r"timm:convnext_tiny.*needs timm"):
        create_model("timm:convnext_tiny")
    with pytest.raises(ImportError, match="pretrained_path"):
        create_model("resnet50", pretrained=True)


def test_bad_names() -> None:
    with pytest.raises(KeyError, match="unknown backbone 'resnet7'"):
        create_model("resnet7")
    with pytest.raises(ValueError, match="unknown pooling"):
        create_model("convnet_tiny", pooling="sum")
    with pytest.raises(ValueError, match="embedding_dim"):
        create_model("convnet_tiny", embedding_dim=0)
    assert "convnet_tiny" in BACKBONES and "resnet50" in BACKBONES


class _FakeTimm:
    """Stands in for the timm package: records calls, returns a tiny CNN or token model."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    def create_model(self, name: str, pretrained: bool = False, **kwargs):
        self.calls.append((name, {"pretrained": pretrained, **kwargs}))
        if name == "resnet18":  # weights with the classifier, as timm returns them
            net = create_model("resnet18").backbone
            net.fc = nn.Linear(512, 1000)
            return net
        return _FakeTimmModel(tokens=name.startswith("vit"))


class _FakeTimmModel(nn.Module):
    num_features = 12

    def __init__(self, tokens: bool) -> None:
        super().__init__()
        self.tokens = tokens
        self.conv = nn.Conv2d(3, 12, 4, stride=4)

    def forward_features(self, x):
        f = self.conv(x)
        return f.flatten(2).transpose(1, 2) if self.tokens else f

    def forward_head(self, x, pre_logits: bool = False):
        assert pre_logits
        return x[:, 0]


@pytest.mark.parametrize("name", ["convnext_fake", "vit_fake"])
def test_timm_backbone_by_name(monkeypatch, name: str) -> None:
    fake = _FakeTimm()
    monkeypatch.setitem(__import__("sys").modules, "timm", fake)
    model = create_model(f"timm:{name}", pooling="gem", embedding_dim=4)
    assert fake.calls == [(name, {"pretrained": False, "num_classes": 0})]
    assert model.feature_dim == 12 and model(torch.rand(2, 3, 16, 16)).shape == (2, 4)
    create_model(f"timm:{name}", pretrained=True, pretrained_path="w.safetensors")
    assert fake.calls[-1] == (name, {"pretrained": True, "num_classes": 0, "pretrained_cfg_overlay": {"file": "w.safetensors"}})


def test_pretrained_builtin_through_timm(monkeypatch) -> None:
    fake = _FakeTimm()
    monkeypatch.setitem(__import__("sys").modules, "timm", fake)
    model = create_model("resnet18", pretrained=True)
    assert fake.calls == [("resnet18", {"pretrained": True})]
    assert model.backbone.conv1.weight.shape == (64, 3, 7, 7) and not hasattr(model.backbone, "fc")
