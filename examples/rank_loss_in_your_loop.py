"""A rank loss in a plain PyTorch training loop: Smooth-AP on synthetic clustered data.

The points of each class sit around a class centre in 8 of their 64 dimensions; the other dimensions are noise.
A small MLP learns a 16-d embedding with ``rankopt.losses.build("smooth_ap")`` on m-per-class batches, and
mAP@R (``rankopt.metrics.evaluate``) of classes never seen in training is printed before and after.

Run it from the repository root: ``python examples/rank_loss_in_your_loop.py`` (a few seconds on a CPU).
"""

import torch
from torch import nn

from rankopt.losses import build
from rankopt.metrics import evaluate

torch.manual_seed(0)
SIGNAL, DIM, EMBEDDING = 8, 64, 16


def clusters(num_classes: int, per_class: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_class`` points of each of ``num_classes`` new classes: a centre in the first SIGNAL dimensions,
    noise everywhere."""
    centres = torch.zeros(num_classes, DIM)
    centres[:, :SIGNAL] = 2.0 * torch.randn(num_classes, SIGNAL)
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    return centres[labels] + 1.5 * torch.randn(len(labels), DIM), labels


train_x, train_y = clusters(num_classes=40, per_class=20)
test_x, test_y = clusters(num_classes=20, per_class=10)  # other classes: an open-set evaluation

model = nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, EMBEDDING))
loss_fn = build("smooth_ap")  # or "sup_ap", "roadmap", "fastap", ...: the same call
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)


def embed(x: torch.Tensor) -> torch.Tensor:
    return nn.functional.normalize(model(x), dim=1)


def map_at_r() -> float:
    model.eval()
    with torch.no_grad():
        result = evaluate(embed(test_x), test_y, metrics=["map@r"])
    model.train()
    return result.metrics["map@r"]


before = map_at_r()
for step in range(300):
    # an m-per-class batch: 8 classes x 4 points, so every query has positives in the batch
    classes = torch.randperm(40)[:8]
    rows = torch.cat([torch.nonzero(train_y == c).flatten()[torch.randperm(20)[:4]] for c in classes])
    loss = loss_fn(embed(train_x[rows]), train_y[rows])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 100 == 0:
        print(f"step {step:3d}: smooth_ap loss {loss.item():.4f}")
after = map_at_r()

print(f"mAP@R of unseen classes: before {before:.4f}, after {after:.4f}")
assert after > before + 0.1, (before, after)
