"""The classification baselines (ArcFace, Sub-center ArcFace, CosFace, Proxy-Anchor), SupCon and ``pml:<Name>``:
each equals pytorch-metric-learning's own class with the same weights (a wiring check: no second implementation),
trains a step (gradients reach the model and the class weights), and ``init_class_means`` sets the class weights
to the normalised class means (checked against a loop). Synthetic random data."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning import losses as pml_losses
from torch import nn

from rankopt.losses import build, class_weights, data_arguments, init_class_means
from rankopt.losses.baselines import PMLLoss

CLASSES, DIM = 6, 8

WEIGHTED = [
    ("arcface", pml_losses.ArcFaceLoss, {"margin": 28.6, "scale": 64}, 1.0),
    ("subcenter_arcface", pml_losses.SubCenterArcFaceLoss, {"margin": 28.6, "scale": 64, "sub_centers": 3}, 1.0),
    ("cosface", pml_losses.CosFaceLoss, {"margin": 0.35, "scale": 64}, 1.0),
    ("proxy_anchor", pml_losses.ProxyAnchorLoss, {"margin": 0.1, "alpha": 32}, 100.0),
]


def _batch(n: int = 24, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 12, generator=gen), torch.arange(n) % CLASSES


def _train_step(loss: nn.Module) -> tuple[nn.Linear, torch.Tensor]:
    """One SGD step of a linear model under ``loss``; returns the model and the loss value."""
    images, labels = _batch()
    model = nn.Linear(12, DIM)
    opt = torch.optim.SGD([*model.parameters(), *loss.parameters()], lr=0.1)
    value = loss(model(images), labels)
    value.backward()
    for p in [*model.parameters(), *loss.parameters()]:
        assert p.grad is not None and torch.isfinite(p.grad).all() and float(p.grad.abs().sum()) > 0
    opt.step()
    return model, value


@pytest.mark.parametrize("name, pml_class, kwargs, lr_mult", WEIGHTED)
def test_weighted_losses_equal_pml_and_train(name, pml_class, kwargs, lr_mult):
    ours = build(name, num_classes=CLASSES, embedding_dim=DIM)
    assert data_arguments(name) == {"num_classes": "classes", "embedding_dim": "embedding_dim"}
    assert not ours.accepts_reference and ours.paper_lr_mult == lr_mult
    theirs = pml_class(num_classes=CLASSES, embedding_size=DIM, **kwargs)
    theirs.load_state_dict(ours.losses[0].state_dict())
    x = torch.randn(24, DIM, generator=torch.Generator().manual_seed(1))
    y = torch.arange(24) % CLASSES
    torch.testing.assert_close(ours(x, y), theirs(x, y), rtol=1e-5, atol=1e-6)
    (weights,) = ours.parameters()
    before = weights.detach().clone()
    _train_step(ours)
    assert not torch.equal(weights, before)


def test_supcon_equals_pml_and_trains():
    x, y = torch.randn(24, DIM, generator=torch.Generator().manual_seed(2)), torch.arange(24) % CLASSES
    loss = build("supcon")
    assert loss.accepts_reference and not list(loss.parameters())
    torch.testing.assert_close(loss(x, y), pml_losses.SupConLoss(temperature=0.1)(x, y), rtol=1e-5, atol=1e-6)
    images, labels = _batch()
    model = nn.Linear(12, DIM)
    loss(model(images), labels).backward()
    assert float(model.weight.grad.abs().sum()) > 0


def test_pml_prefix_builds_any_pml_loss():
    x, y = torch.randn(24, DIM, generator=torch.Generator().manual_seed(3)), torch.arange(24) % CLASSES
    circle = build("pml:CircleLoss", m=0.25)
    assert data_arguments("pml:CircleLoss") == {} and circle.accepts_reference
    torch.testing.assert_close(circle(x, y), pml_losses.CircleLoss(m=0.25)(x, y))
    # a class with weights: num_classes / the embedding size from the data, through the MRO (*args, **kwargs)
    assert data_arguments("pml:SubCenterArcFaceLoss") == {"num_classes": "classes", "embedding_dim": "embedding_dim"}
    soft = build("pml:SoftTripleLoss", num_classes=CLASSES, embedding_dim=DIM, centers_per_class=2)
    theirs = pml_losses.SoftTripleLoss(CLASSES, DIM, centers_per_class=2)
    theirs.load_state_dict(soft.losses[0].state_dict())
    assert not soft.accepts_reference and soft.paper_lr_mult is None
    torch.testing.assert_close(soft(x, y), theirs(x, y))
    _train_step(soft)


@pytest.mark.parametrize("name, kwargs, message", [
    ("pml:NoSuchLoss", {}, "no loss class 'NoSuchLoss'"),
    ("pml:BaseMetricLossFunction", {}, "ArcFaceLoss, CircleLoss"),
    ("pml:CircleLoss", {"mm": 0.25}, "pml:CircleLoss: keyword arguments {'mm': 0.25} do not fit"),
    ("pml:ArcFaceLoss", {}, "pml:ArcFaceLoss needs num_classes, embedding_size"),
])
def test_pml_prefix_errors_name_the_class(name, kwargs, message):
    with pytest.raises(ValueError, match="pml:") as err:
        build(name, **kwargs)
    assert message in str(err.value)
    if "mm" in kwargs:
        assert "takes m, gamma" in str(err.value)


def _brute_means(x: torch.Tensor, y: torch.Tensor, classes: int) -> dict[int, torch.Tensor]:
    means = {}
    for c in range(classes):
        rows = [x[i].double() / x[i].double().norm() for i in range(len(y)) if int(y[i]) == c]
        if rows:
            mean = sum(rows) / len(rows)
            means[c] = mean / mean.norm()
    return means


@pytest.mark.parametrize("name, as_rows, per_class", [("arcface", False, 1), ("cosface", False, 1),
                                                      ("subcenter_arcface", False, 3), ("proxy_anchor", True, 1),
                                                      ("normalized_softmax", False, 1), ("proxy_nca_pp", True, 1),
                                                      ("pml:SoftTripleLoss", False, 10)])
def test_class_means_init_sets_the_normalised_class_means(name, as_rows, per_class):
    loss = build(name, num_classes=CLASSES, embedding_dim=DIM)
    x = torch.randn(30, DIM, generator=torch.Generator().manual_seed(4)) * 3
    y = torch.tensor([c for c in range(CLASSES - 1) for _ in range(6)])  # the last class has no embedding
    (weights,) = loss.parameters()
    before = weights.detach().clone()
    assert init_class_means(loss, x, y) == 1
    rows = weights.detach() if as_rows else weights.detach().T
    old = before if as_rows else before.T
    means = _brute_means(x, y, CLASSES)
    for c in range(CLASSES):
        block = slice(c * per_class, (c + 1) * per_class)
        if c in means:
            torch.testing.assert_close(rows[c * per_class].double(), means[c], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(rows[block][1:], old[block][1:])  # other sub-centres keep their start
        else:
            torch.testing.assert_close(rows[block], old[block])


def test_class_means_init_per_level_and_in_combinations():
    x = torch.randn(24, DIM, generator=torch.Generator().manual_seed(5))
    fine = torch.arange(24) % CLASSES
    labels = torch.stack([fine, fine // 2], dim=1)
    sum_nsm = build("sum_nsm", num_classes=[CLASSES, CLASSES // 2], embedding_dim=DIM)
    assert init_class_means(sum_nsm, x, labels) == 2
    for level, inner in enumerate(sum_nsm.losses):
        for c, mean in _brute_means(x, labels[:, level], CLASSES).items():
            torch.testing.assert_close(inner.W[:, c].double(), mean, rtol=1e-5, atol=1e-6)
    rod = build("rod_ap", num_classes=CLASSES, embedding_dim=DIM)  # ProxyDG's proxies inside a ROD combination
    summed = build("arcface+rod_ap", arcface={"num_classes": CLASSES, "embedding_dim": DIM},
                   rod_ap={"num_classes": CLASSES, "embedding_dim": DIM})
    assert [w.shape for w, *_ in class_weights(rod)] == [(CLASSES, DIM)]
    assert init_class_means(summed, x, fine) == 2
    for c, mean in _brute_means(x, fine, CLASSES).items():
        torch.testing.assert_close(summed.terms[1].decomposability_loss.proxies[c].double(), mean, rtol=1e-5, atol=1e-6)


def test_class_means_init_needs_class_weights():
    with pytest.raises(ValueError, match="SmoothAPLoss has no class weights"):
        init_class_means(build("smooth_ap"), torch.randn(4, DIM), torch.arange(4))
    with pytest.raises(ValueError, match="do not fit"):
        init_class_means(build("arcface", num_classes=CLASSES, embedding_dim=DIM), torch.randn(4, 5), torch.arange(4))


def test_weighted_pml_loss_checks_its_classes():
    loss = build("arcface", num_classes=CLASSES, embedding_dim=DIM)
    assert isinstance(loss, PMLLoss)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 6\)"):
        loss(torch.randn(4, DIM), torch.tensor([0, 1, 2, 6]))
