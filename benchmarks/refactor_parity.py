"""Speed and values of the core losses and of ``evaluate`` in two source trees, alternating (a refactor's check).

    git worktree add /tmp/before <commit>
    python benchmarks/refactor_parity.py /tmp/before .        # rounds of: before, after

Each round runs each tree's ``src`` in a fresh process (``PYTHONPATH``) on the same inputs: ``sup_ap``, ``roadmap``
and ``calibration`` forward+backward at B = 4096 random unit 128-d embeddings, 4 per class (best of 5 calls), and
``evaluate`` on 20,000 x 128 with 500 classes (best of 3). Prints one JSON line per tree and round: milliseconds and
the values, which must be equal across trees.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path


def probe() -> dict[str, object]:
    import torch

    from rankopt.losses import build
    from rankopt.metrics import evaluate

    torch.manual_seed(0)
    out: dict[str, object] = {}
    x = torch.nn.functional.normalize(torch.randn(4096, 128), dim=1)
    y = torch.arange(4096) // 4
    for name in ("sup_ap", "roadmap", "calibration"):
        loss, times = build(name), []
        for _ in range(6):  # the first call warms up
            xs = x.clone().requires_grad_()
            start = time.perf_counter()
            value = loss(xs, y)
            value.backward()
            times.append(time.perf_counter() - start)
        out[name] = {"ms": round(min(times[1:]) * 1000, 1), "value": value.item()}
    e = torch.nn.functional.normalize(torch.randn(20_000, 128), dim=1)
    labels = torch.randint(0, 500, (20_000,))
    times = []
    for _ in range(4):
        start = time.perf_counter()
        result = evaluate(e, labels)
        times.append(time.perf_counter() - start)
    out["evaluate"] = {"ms": round(min(times[1:]) * 1000, 1), "value": dict(result.metrics)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", help="repository roots to compare (none: probe this process's rankopt)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not args.trees:
        print(json.dumps(probe()))
        return
    for round_ in range(1, args.rounds + 1):
        for tree in args.trees:
            env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve() / "src")}
            answer = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, check=True)
            print(json.dumps({"round": round_, "tree": tree, **json.loads(answer.stdout.splitlines()[-1])}), flush=True)


if __name__ == "__main__":
    main()
