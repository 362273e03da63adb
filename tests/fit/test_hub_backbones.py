"""Hub backbones (``timm:NAME``, ``open_clip:MODEL/TAG``) for ``rankopt fit`` and ``rankopt weights``: fake ``timm``
and ``open_clip`` modules (tiny real networks with a model's own input convention) stand in for the packages and
their hub, which this machine cannot reach: converted once with that convention, read from a same-architecture file
without the hub, and clear errors for an unreachable hub, a missing package and a network fit cannot cut."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn

from helpers.images import photo_folder as synthetic_photos

from rankopt.cli import main
from rankopt.data.transforms import build_transform, output_size
from rankopt.engine.assembly import model_from_checkpoint
from rankopt.engine.checkpoint import load_checkpoint
from rankopt.engine.weights import hub_checkpoint, resolve_checkpoint
from rankopt.fit import FitSettings, fit
from rankopt.models.backbones import build_backbone
from rankopt.models.stages import cut

CFG = {"mean": (0.5, 0.4, 0.3), "std": (0.2, 0.25, 0.3), "input_size": (3, 40, 40), "crop_pct": 0.8,
       "interpolation": "bicubic", "license": "apache-2.0", "hf_hub_id": "timm/fakenet.test"}


class HubNet(nn.Module):
    """A timm CNN in small: stem, two stages, ``num_features``, ``pretrained_cfg`` and ``forward_features``."""

    num_features = 16

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU())
        self.stages = nn.Sequential(nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()),
                                    nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU()))
        self.head = nn.Identity()  # num_classes=0
        self.pretrained_cfg = dict(CFG)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.stages(self.stem(x))


class HubViT(nn.Module):
    """A ViT in small (DINOv2's shape): patch tokens and a CLS token, ``forward_head`` picks the CLS token."""

    num_features = 12

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, 12, 8, stride=8)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, 12))
        self.pretrained_cfg = {**CFG, "license": None}

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)
        return torch.cat([self.cls_token.expand(len(x), -1, -1), tokens], dim=1)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return x[:, 0]


def hub_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The weights "on the hub": fixed, unlike a new model's."""
    torch.manual_seed(7)
    return {k: torch.randn_like(v) for k, v in model.state_dict().items()}


class LocalEntryNotFoundError(Exception):
    """As huggingface_hub names the error of a file neither on the (unreachable) hub nor in its cache."""


class FakeTimm(types.ModuleType):
    """Stands in for timm: ``create_model`` builds :class:`HubNet` (``fakenet``) or :class:`HubViT` (``fakevit``);
    with ``pretrained=True`` it loads :func:`hub_state`, or raises ``hub`` when that is an exception."""

    def __init__(self, hub: BaseException | None = None) -> None:
        super().__init__("timm")
        self.hub, self.calls = hub, []

    def create_model(self, name: str, pretrained: bool = False, num_classes: int = 1000, **kwargs) -> nn.Module:
        self.calls.append((name, pretrained))
        model = {"fakenet": HubNet, "fakevit": HubViT}[name]()
        if pretrained:
            if self.hub is not None:
                raise self.hub
            model.load_state_dict(hub_state(model))
        return model

    def hub_calls(self) -> int:
        return sum(pretrained for _, pretrained in self.calls)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("RANKOPT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    return tmp_path / "cache"


def use(monkeypatch, fake: types.ModuleType) -> types.ModuleType:
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    return fake


def pooled(features: torch.Tensor) -> torch.Tensor:
    """The converted checkpoint's embedding of a feature map: average-pooled, L2-normalised."""
    return F.normalize(features.mean((2, 3)), dim=-1)


# ------------------------------------------------------------------------------------ (a) the hub, converted once
def test_the_hub_weights_are_converted_once_with_the_models_input_convention(cache, tmp_path, monkeypatch):
    timm = use(monkeypatch, FakeTimm())
    lines: list[str] = []
    first = resolve_checkpoint("timm:fakenet", None, say=lines.append)
    assert timm.hub_calls() == 1
    again = resolve_checkpoint("timm:fakenet", None, say=lines.append)
    assert again == first and timm.hub_calls() == 1 and first.parent == cache / "weights"
    hub = tmp_path / "hf" / "hub"
    assert f"cached by timm in {hub}" in lines[0] and "licence apache-2.0" in lines[0] and "converted once" in lines[0]
    assert "converted before" in lines[1] and len(lines) == 2
    state = load_checkpoint(first)
    assert state["source"]["licence"] == "apache-2.0" and state["source"]["hub_cache"] == str(hub)
    assert json.loads(first.with_suffix(".json").read_text())["licence"] == "apache-2.0"
    model, cfg = model_from_checkpoint(first)
    assert cfg.data.test_transform == "test(mean=0.5,0.4,0.3;std=0.2,0.25,0.3;crop_pct=0.8)"
    assert cfg.data.train_transform.startswith("train(mean=0.5,0.4,0.3;std=0.2,0.25,0.3")
    transform = build_transform(cfg.data.test_transform, cfg.data.image_size)
    resize, _, normalize = transform.ops
    assert resize.flags["size"] == 50 and output_size(cfg.data.test_transform, cfg.data.image_size) == (40, 40)
    assert torch.allclose(normalize.flags["mean"], torch.tensor(CFG["mean"]))
    assert torch.allclose(normalize.flags["std"], torch.tensor(CFG["std"]))
    hub_net = HubNet()
    hub_net.load_state_dict(hub_state(hub_net))
    x = torch.rand(2, 3, 40, 40)
    assert torch.allclose(model(x), pooled(hub_net.forward_features(x)), atol=1e-6)


def test_a_timm_cnn_is_cut_into_the_stages_of_its_features(monkeypatch):
    use(monkeypatch, FakeTimm())
    from rankopt.models import create_model

    net = create_model("timm:fakenet").eval()
    x = torch.rand(2, 3, 40, 40)
    trunk, tail = cut(net, 3)
    assert len(net.backbone.stages()) == 4 and torch.allclose(tail(trunk(x)), net(x))


def test_a_vit_is_converted_but_fit_refuses_it_before_the_hub(cache, monkeypatch):
    timm = use(monkeypatch, FakeTimm())
    with pytest.raises(ValueError, match=r"rankopt fit cannot fine-tune timm:fakevit: its output is a token.*"
                                         r"timm:resnet50.*rankopt weights fetch timm:fakevit"):
        resolve_checkpoint("timm:fakevit", None, say=lambda line: None)
    assert timm.hub_calls() == 0
    checkpoint, record, converted = hub_checkpoint("timm:fakevit")
    assert converted and record["licence"] == "unknown"
    model, _ = model_from_checkpoint(checkpoint)
    assert model.feature_dim == 12 and model(torch.rand(2, 3, 40, 40)).shape == (2, 12)  # the CLS token


# ------------------------------------------------------------------------- (b) a same-architecture file, no hub
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_a_weights_file_is_read_without_the_hub(cache, tmp_path, monkeypatch, suffix):
    timm = use(monkeypatch, FakeTimm(hub=AssertionError("the hub was asked for weights")))
    torch.manual_seed(3)
    own = HubNet()
    state = {**own.state_dict(), "head.weight": torch.randn(5, 16), "head.bias": torch.zeros(5)}  # a classifier
    path = tmp_path / f"fakenet{suffix}"
    save_file(state, path) if suffix == ".safetensors" else torch.save(state, path)
    lines: list[str] = []
    checkpoint = resolve_checkpoint("timm:fakenet", str(path), say=lines.append)
    assert timm.hub_calls() == 0 and f"weights of fakenet{suffix}" in lines[0] and "licence apache-2.0" in lines[0]
    assert resolve_checkpoint("timm:fakenet", str(path), say=lines.append) == checkpoint  # converted once
    assert load_checkpoint(checkpoint)["source"]["sha256"][:12] in checkpoint.name
    model, cfg = model_from_checkpoint(checkpoint)
    assert cfg.data.test_transform.startswith("test(mean=0.5,0.4,0.3")  # the name's default pretrained_cfg
    x = torch.rand(2, 3, 40, 40)
    assert torch.allclose(model(x), pooled(own.forward_features(x)), atol=1e-6)


def test_a_wrong_or_unsafe_file_is_a_clear_error(cache, tmp_path, monkeypatch):
    use(monkeypatch, FakeTimm(hub=AssertionError("the hub was asked for weights")))
    other = tmp_path / "other.pth"
    torch.save({"conv.weight": torch.zeros(1)}, other)
    with pytest.raises(ValueError, match=r"do not match the model: missing \['stem.0.weight'"):
        resolve_checkpoint("timm:fakenet", str(other), say=lambda line: None)
    unsafe = tmp_path / "unsafe.pth"
    torch.save({"state_dict": HubNet().state_dict(), "made_by": Path("x")}, unsafe)
    with pytest.raises(ValueError, match="pickled Python objects"):
        resolve_checkpoint("timm:fakenet", str(unsafe), say=lambda line: None)


# ---------------------------------------------------------------------- (c) an unreachable hub, (d) no package
MESSAGE = (r"the model hub could not be reached for the weights of timm:fakenet \(LocalEntryNotFoundError: .*\); "
           r"run this on a machine that reaches it .*or give a same-architecture weights file .* --weights FILE")


@pytest.mark.parametrize("error", [LocalEntryNotFoundError("cannot find the requested files in the local cache"),
                                   ConnectionError("Max retries exceeded")])
def test_an_unreachable_hub_is_one_clear_sentence(cache, monkeypatch, error):
    use(monkeypatch, FakeTimm(hub=error))
    message = MESSAGE.replace("LocalEntryNotFoundError", type(error).__name__)
    with pytest.raises(ValueError, match=message):
        resolve_checkpoint("timm:fakenet", None, say=lambda line: None)
    assert not list((cache / "weights").glob("*.ckpt"))


def test_an_unknown_model_is_not_called_unreachable(monkeypatch):
    use(monkeypatch, FakeTimm())
    with pytest.raises(KeyError, match="nosuchnet"):
        build_backbone("timm:nosuchnet", pretrained=True)


def photo_folder(root: Path) -> Path:
    """The fit tests' SYNTHETIC photo folder, 4 classes of 6."""
    return synthetic_photos(root, classes=4, per_class=6)


def test_the_cli_says_an_unreachable_hub_in_one_line(cache, tmp_path, monkeypatch, capsys):
    use(monkeypatch, FakeTimm(hub=LocalEntryNotFoundError("cannot find the requested files in the local cache")))
    monkeypatch.delenv("RANKOPT_DEBUG", raising=False)
    code = main(["fit", str(photo_folder(tmp_path / "photos")), "--out", str(tmp_path / "run"), "--backbone",
                 "timm:fakenet", "--minutes", "0.2", "--runtime", "torch"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert err.startswith("rankopt fit: error: the model hub could not be reached for the weights of timm:fakenet")
    assert "--weights FILE" in err


def test_a_missing_package_says_how_to_install_it(cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` fails
    monkeypatch.setitem(sys.modules, "open_clip", None)
    with pytest.raises(ImportError, match=r"timm:fakenet.*needs timm.*pip install 'rankopt\[timm\]'`\.$"):
        resolve_checkpoint("timm:fakenet", None, say=lambda line: None)
    with pytest.raises(ImportError, match=r"needs open_clip.*pip install 'rankopt\[open_clip\]'"):
        hub_checkpoint("open_clip:ViT-B-32/laion2b_s34b_b79k")


# ------------------------------------------------------------------------------------------------ (e) open_clip
class FakeVisual(nn.Module):
    """An image tower in small: a conv, pooled and projected to ``output_dim``, with open_clip's preprocess_cfg."""

    output_dim = 6

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2)
        self.proj = nn.Parameter(torch.randn(8, 6))
        self.preprocess_cfg = {"size": 24, "mode": "RGB", "mean": (0.48145466, 0.4578275, 0.40821073),
                               "std": (0.26862954, 0.26130258, 0.27577711), "interpolation": "bicubic",
                               "resize_mode": "shortest"}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv1(x).mean((2, 3)) @ self.proj


class FakeClip(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.visual = FakeVisual()
        self.token_embedding = nn.Embedding(10, 4)  # the text tower, not kept


class FakeOpenClip(types.ModuleType):
    """Stands in for open_clip: ``create_model_and_transforms`` with ``pretrained=TAG`` loads :func:`hub_state`,
    or raises ``hub`` when that is an exception."""

    def __init__(self, hub: BaseException | None = None) -> None:
        super().__init__("open_clip")
        self.hub, self.calls = hub, []

    def get_pretrained_cfg(self, model: str, tag: str) -> dict:
        return {"hf_hub": "laion/fake-clip/", "mean": None} if tag == "laion_fake" else {}

    def create_model_and_transforms(self, model_name: str, pretrained: str | None = None):
        self.calls.append((model_name, pretrained))
        model = FakeClip()
        if pretrained is not None:
            if self.hub is not None:
                raise self.hub
            model.load_state_dict(hub_state(model))
        return model, None, None


def test_an_open_clip_image_tower_from_the_hub_and_from_a_file(cache, tmp_path, monkeypatch, capsys):
    clip = use(monkeypatch, FakeOpenClip())
    name = "open_clip:FakeCLIP/laion_fake"
    refused = r"rankopt fit cannot fine-tune open_clip:FakeCLIP/laion_fake: its image tower is one module"
    with pytest.raises(ValueError, match=refused):
        resolve_checkpoint(name, None, say=lambda line: None)
    assert clip.calls == [("FakeCLIP", None)]  # refused before the hub
    clip.calls.clear()
    assert main(["weights", "fetch", name]) == 0
    said = capsys.readouterr().out
    assert "licence see the model card (https://huggingface.co/laion/fake-clip)" in said
    assert str(tmp_path / "hf" / "hub") in said and clip.calls == [("FakeCLIP", "laion_fake")]
    checkpoint, record, converted = hub_checkpoint(name)
    assert not converted and len(clip.calls) == 1
    model, cfg = model_from_checkpoint(checkpoint)
    assert cfg.data.test_transform == ("test(mean=0.48145466,0.4578275,0.40821073;std=0.26862954,0.26130258,"
                                       "0.27577711;crop_pct=1)") and cfg.data.image_size == 24
    hub = FakeClip()
    hub.load_state_dict(hub_state(hub))
    x = torch.rand(2, 3, 24, 24)
    assert torch.allclose(model(x), F.normalize(hub.visual(x), dim=-1), atol=1e-6)
    with pytest.raises(ValueError, match=refused):  # the fit of a cached checkpoint: refused at its cut
        cut(model, 1)
    # a file: the whole CLIP model's state dict (the image tower's keys are taken), no hub
    clip.hub = AssertionError("the hub was asked for weights")
    torch.manual_seed(5)
    own = FakeClip()
    path = tmp_path / "clip.safetensors"
    save_file(own.state_dict(), path)
    checkpoint, record, converted = hub_checkpoint(name, path)
    assert converted and record["weights"] == "clip.safetensors"
    model, _ = model_from_checkpoint(checkpoint)
    assert torch.allclose(model(x), F.normalize(own.visual(x), dim=-1), atol=1e-6)


def test_an_open_clip_model_the_hub_cannot_give_is_one_clear_sentence(cache, monkeypatch, capsys):
    use(monkeypatch, FakeOpenClip(hub=LocalEntryNotFoundError("offline")))
    monkeypatch.delenv("RANKOPT_DEBUG", raising=False)
    assert main(["weights", "fetch", "open_clip:FakeCLIP/laion_fake"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rankopt weights: error: the model hub could not be reached for the weights of "
                          "open_clip:FakeCLIP/laion_fake") and "--weights FILE" in err and "Traceback" not in err
    with pytest.raises(ValueError, match="open_clip:MODEL/TAG"):
        build_backbone("open_clip:FakeCLIP")


# --------------------------------------------------------------------------------------- a whole fit, hub weights
def test_a_whole_fit_on_a_timm_backbone(cache, tmp_path, monkeypatch):
    use(monkeypatch, FakeTimm())
    lines: list[str] = []
    fit(photo_folder(tmp_path / "photos"), tmp_path / "run",
        FitSettings(minutes=0.2, backbone="timm:fakenet", runtime="torch", lrs=(1e-3,)), say=lines.append)
    assert any("timm:fakenet: weights from the model hub" in line for line in lines)
    config = load_checkpoint(tmp_path / "run" / "model.ckpt")["config"]
    assert config["model"]["backbone"] == "timm:fakenet"
    assert config["data"]["test_transform"] == "test(mean=0.5,0.4,0.3;std=0.2,0.25,0.3;crop_pct=0.8)"
    assert (tmp_path / "run" / "fit.json").is_file()
