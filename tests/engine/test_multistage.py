"""Multistaged backprop (ICCV'19 §3.3): gradients equal the plain large-batch step (float64, to 1e-6)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rankopt.engine.multistage import multistage_step
from rankopt.losses import build
from rankopt.models import create_model


def _batch(n: int = 18) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.rand(n, 3, 16, 16, dtype=torch.float64)
    labels = torch.arange(n) // 4  # classes of 4, the last one smaller
    labels[-1] = 99  # a query without any positive
    return images, labels


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def _plain_step(model: nn.Module, images, labels, loss_fn, **ref) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    embeddings = model(images)
    loss = loss_fn(embeddings, labels, *ref.values())
    loss.backward()
    return loss.detach(), _grads(model)


def _assert_same(loss_a, grads_a, loss_b, grads_b) -> None:
    torch.testing.assert_close(loss_a, loss_b, atol=1e-10, rtol=0)
    for a, b in zip(grads_a, grads_b):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    assert any(g.abs().sum() > 0 for g in grads_a)


@pytest.mark.parametrize("loss_name", ["smooth_ap", "sup_ap"])
@pytest.mark.parametrize("sub_batch_size", [1, 5, 18])
def test_gradients_equal_plain_step(loss_name: str, sub_batch_size: int) -> None:
    model = create_model("convnet_tiny", pooling="gem", embedding_dim=8).double().train()
    images, labels = _batch()
    loss_fn = build(loss_name)
    loss, grads = _plain_step(model, images, labels, loss_fn)
    model.zero_grad()
    ms_loss, embeddings = multistage_step(model, images, labels, loss_fn, sub_batch_size)
    _assert_same(ms_loss, _grads(model), loss, grads)
    torch.testing.assert_close(embeddings, model(images).detach())


def test_gradients_equal_with_memory_reference_set() -> None:
    model = create_model("convnet_tiny", embedding_dim=8, layer_norm=True).double().train()
    images, labels = _batch()
    ref = {"ref_embeddings": F.normalize(torch.randn(12, 8, dtype=torch.float64), dim=1),
           "ref_labels": torch.arange(12) % 6}
    loss_fn = build("smooth_ap")
    loss, grads = _plain_step(model, images, labels, loss_fn, **ref)
    model.zero_grad()
    ms_loss, _ = multistage_step(model, images, labels, loss_fn, 4, **ref)
    _assert_same(ms_loss, _grads(model), loss, grads)


class _DropoutNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.body(x), dim=1)


def test_rng_is_replayed_so_dropout_matches() -> None:
    model = _DropoutNet().double().train()
    images, labels = _batch()
    loss_fn = build("smooth_ap")
    torch.manual_seed(5)
    loss, grads = _plain_step(model, images, labels, loss_fn)
    state_after_plain = torch.get_rng_state()
    torch.manual_seed(5)
    model.zero_grad()
    ms_loss, _ = multistage_step(model, images, labels, loss_fn, 7)
    _assert_same(ms_loss, _grads(model), loss, grads)
    assert torch.equal(torch.get_rng_state(), state_after_plain)  # the run continues as after a plain step


def test_loss_parameters_get_the_same_gradient() -> None:
    class ScaledLoss(nn.Module):  # a loss with its own learnable parameter (like proxies)
        accepts_reference = True

        def __init__(self) -> None:
            super().__init__()
            self.inner, self.scale = build("smooth_ap"), nn.Parameter(torch.tensor(1.5, dtype=torch.float64))

        def forward(self, e, y, *ref):
            return self.scale * self.inner(e, y, *ref)

    model = create_model("convnet_tiny", embedding_dim=8).double().train()
    images, labels = _batch()
    loss_fn = ScaledLoss()
    _plain_step(model, images, labels, loss_fn)
    expected = loss_fn.scale.grad.clone()
    loss_fn.zero_grad()
    multistage_step(model, images, labels, loss_fn, 5)
    torch.testing.assert_close(loss_fn.scale.grad, expected)


def test_unfrozen_batchnorm_breaks_the_equivalence() -> None:  # the documented caveat, and a control
    model = create_model("convnet_tiny", embedding_dim=8, freeze_bn=False).double().train()
    images, labels = _batch()
    loss_fn = build("smooth_ap")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    _, grads = _plain_step(model, images, labels, loss_fn)
    model.load_state_dict(state)
    model.zero_grad()
    multistage_step(model, images, labels, loss_fn, 5)
    assert max((a - b).abs().max() for a, b in zip(_grads(model), grads)) > 1e-4


def test_bad_sub_batch_size() -> None:
    model = create_model("convnet_tiny")
    with pytest.raises(ValueError, match="sub_batch_size"):
        multistage_step(model, torch.rand(4, 3, 16, 16), torch.zeros(4, dtype=torch.long), build("smooth_ap"), 0)


def test_bf16_autocast_matches_plain_autocast_step() -> None:
    model = create_model("convnet_tiny", embedding_dim=8).train()
    images, labels = _batch()
    images = images.float()
    loss_fn = build("smooth_ap")
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        embeddings = model(images)
    loss = loss_fn(embeddings.float(), labels)
    loss.backward()
    grads = _grads(model)
    model.zero_grad()
    ms_loss, ms_embeddings = multistage_step(model, images, labels, loss_fn, 6, autocast_dtype=torch.bfloat16)
    assert ms_embeddings.dtype == torch.float32
    torch.testing.assert_close(ms_loss, loss.detach(), atol=2e-2, rtol=0)
    for a, b in zip(_grads(model), grads):
        torch.testing.assert_close(a, b, atol=5e-2 * float(b.abs().max()) + 1e-6, rtol=5e-2)
