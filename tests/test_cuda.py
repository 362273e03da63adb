"""On a CUDA device: the losses, evaluation and training give what the CPU gives (skipped without CUDA)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import rankopt.losses as L
from rankopt.metrics import evaluate

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

FLAT = ["sup_ap", "smooth_ap", "calibration", "roadmap", "fastap", "softbin_ap", "blackbox_ap", "sup_recall",
        "smooth_recall", "triplet", "contrastive", "multi_similarity"]
HIERARCHICAL = ["hap", "sup_ndcg"]
PROXIES = ["rod_ap", "happier", "normalized_softmax", "proxy_nca_pp"]


def batch(n: int = 96, dim: int = 32, hierarchical: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, dim, generator=g)
    fine = torch.arange(n) // 4
    return x, torch.stack([fine, fine // 3, fine // 6], dim=1) if hierarchical else fine


def loss_and_gradient(loss: torch.nn.Module, x: torch.Tensor, labels: torch.Tensor) -> tuple[float, torch.Tensor]:
    xg = x.clone().requires_grad_(True)
    value = loss(xg, labels)
    value.backward()
    return float(value), xg.grad.cpu()


@pytest.mark.parametrize("name", FLAT + HIERARCHICAL + PROXIES)
def test_loss_on_cuda_equals_cpu(name):
    x, labels = batch(hierarchical=name in HIERARCHICAL + ["happier"])
    options = {"num_classes": int(labels.max()) + 1, "embedding_dim": x.shape[1]} if name in PROXIES else {}
    cpu = L.build(name, **options)
    cuda = copy.deepcopy(cpu).cuda()  # the same proxies
    value_cpu, grad_cpu = loss_and_gradient(cpu, x, labels)
    value_cuda, grad_cuda = loss_and_gradient(cuda, x.cuda(), labels.cuda())
    assert value_cuda == pytest.approx(value_cpu, rel=1e-4, abs=1e-6)
    torch.testing.assert_close(grad_cuda, grad_cpu, rtol=1e-3, atol=1e-6)
    assert grad_cpu.abs().sum() > 0


def test_flat_metrics_on_cuda_equal_cpu():
    g = torch.Generator().manual_seed(1)
    x = torch.nn.functional.normalize(torch.randn(3000, 64, generator=g), dim=1)
    y = torch.randperm(3000, generator=g) // 5
    names = ["recall@1", "recall@10", "precision@10", "map@r", "map@100", "map", "mrr"]
    cpu = evaluate(x, y, metrics=names).metrics
    cuda = evaluate(x.cuda(), y.cuda(), metrics=names).metrics
    assert cuda == pytest.approx(cpu, abs=1e-6)


@pytest.mark.slow
def test_training_on_cuda_improves(tmp_path):
    from rankopt.cli import main

    reduced = ["data.kwargs.images_per_class=8", "train.epochs=2", "train.eval_every=1", "schedule.warmup=5",
               "eval.metrics=[recall@1,map@r]", "output.tensorboard=false", "train.device=cuda"]
    run = tmp_path / "run"
    assert main(["train", *reduced, "--output", str(run)]) == 0
    report = json.loads((run / "report.json").read_text())
    assert report["trained"]["map@r"] > report["untrained"]["map@r"]
    assert (run / "checkpoints" / "last.ckpt").is_file()
