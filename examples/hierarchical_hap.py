"""Two-level labels: the H-AP metric and the ``hap`` loss (HAPPIER) on synthetic data.

Each item has a fine class and a coarse group (labels ``(N, 2)``, column 0 the finest): 24 classes in 6 groups,
each class centre near its group's centre. H-AP rewards ranking the same class first, then the same group, then the
rest. A small MLP trained with ``rankopt.losses.build("hap")`` raises H-AP (and the per-level APs) on classes it
never saw, of groups it did.

Run it from the repository root: ``python examples/hierarchical_hap.py`` (a few seconds on a CPU).
"""

import torch
from torch import nn

from rankopt.losses import build
from rankopt.metrics import evaluate

torch.manual_seed(0)
GROUPS, CLASSES_PER_GROUP, DIM = 6, 4, 32
group_centres = 3.0 * torch.randn(GROUPS, DIM)
class_centres = group_centres.repeat_interleave(CLASSES_PER_GROUP, 0) + 1.5 * torch.randn(GROUPS * CLASSES_PER_GROUP,
                                                                                         DIM)


def sample(classes: torch.Tensor, per_class: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``per_class`` noisy points of each class, with labels ``[class, group]``."""
    fine = classes.repeat_interleave(per_class)
    labels = torch.stack([fine, fine // CLASSES_PER_GROUP], dim=1)
    return class_centres[fine] + 2.5 * torch.randn(len(fine), DIM), labels


first_two = torch.tensor([c for c in range(24) if c % CLASSES_PER_GROUP < 2])
train_x, train_y = sample(first_two, 16)  # 2 classes of each group to train on
test_x, test_y = sample(first_two + 2, 12)  # the other 2 classes of each group

model = nn.Sequential(nn.Linear(DIM, 64), nn.ReLU(), nn.Linear(64, 16))
loss_fn = build("hap")  # Sup-H-AP; build("happier") adds its clustering term
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
METRICS = ["h-ap", "ap@level0", "ap@level1", "map@r"]  # ap@level{c}: AP with label column c as the class


def scores() -> dict[str, float]:
    with torch.no_grad():
        return evaluate(nn.functional.normalize(model(test_x), dim=1), test_y, metrics=METRICS).metrics


before = scores()
for step in range(200):
    rows = torch.randperm(len(train_x))[:96]  # about 8 points of each class: positives at both levels
    loss = loss_fn(nn.functional.normalize(model(train_x[rows]), dim=1), train_y[rows])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
after = scores()

print(f"{'metric':10s} {'before':>7s} {'after':>7s}")
for name in METRICS:
    print(f"{name:10s} {before[name]:7.4f} {after[name]:7.4f}")
assert after["h-ap"] > before["h-ap"] + 0.05, (before, after)
assert after["ap@level1"] > before["ap@level1"]  # the groups are better ranked too
