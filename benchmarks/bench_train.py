"""Wall time and quality of `rankopt train` on the embedded SYNTHETIC default recipe.

    python benchmarks/bench_train.py            # small: 1 epoch of 10 steps, 8 images per class
    python benchmarks/bench_train.py --full     # the default recipe as shipped (the claim: a few minutes on 2 cores)

Reports the time spent training and evaluating, training throughput (images/s) and the
metrics of the untrained and trained model. Writes ``benchmarks/results/train.md``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

from rankopt.config import load_config
from rankopt.engine.trainer import Trainer

from cited import keep_cited

RESULTS = Path(__file__).resolve().parent / "results"
SMALL = ["train.epochs=1", "train.max_steps_per_epoch=10", "train.eval_every=1", "data.kwargs.images_per_class=8"]


def run(overrides: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config(None, [*overrides, f"output.dir={tmp}", "output.progress=false", "output.figures=false",
                                 "output.tensorboard=false"])
        start = time.perf_counter()
        trainer = Trainer(cfg)
        setup = time.perf_counter() - start
        timed = {"eval": 0.0}
        evaluate = trainer.evaluate

        def timed_evaluate():
            t0 = time.perf_counter()
            try:
                return evaluate()
            finally:
                timed["eval"] += time.perf_counter() - t0

        trainer.evaluate = timed_evaluate  # type: ignore[method-assign]
        report = trainer.fit()
        total = time.perf_counter() - start
        train_time = total - setup - timed["eval"]
        images = report["steps"] * cfg.train.batch_size
        return {"setup_s": setup, "train_s": train_time, "eval_s": timed["eval"], "total_s": total,
                "steps": report["steps"], "images_per_s": images / max(train_time, 1e-9),
                "map@r before": report["untrained"]["map@r"], "map@r after": report["trained"]["map@r"],
                "recall@1 before": report["untrained"]["recall@1"], "recall@1 after": report["trained"]["recall@1"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--full", action="store_true", help="the shipped default recipe (several minutes)")
    args = parser.parse_args()
    overrides = [] if args.full else SMALL
    row = run(overrides)
    header = "| run | " + " | ".join(row) + " |"
    lines = [
        "# `rankopt train` on the embedded synthetic default",
        "",
        f"Command: `{' '.join(shlex.quote(a) for a in [sys.executable.split('/')[-1], *sys.argv])}`  ",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), {platform.python_version()}  ",
        f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; load average at the end "
        f"{os.getloadavg()[0]:.1f} (a shared machine makes every time longer)  ",
        f"Overrides: `{' '.join(overrides) or '(none: the recipe as shipped)'}`",
        "",
        "Data: rankopt's procedurally generated SYNTHETIC dataset (open-set train/test classes).",
        "",
        header,
        "|" + "---|" * (len(row) + 1),
        f"| {'full' if args.full else 'small'} | "
        + " | ".join(f"{v:.1f}" if k.endswith("_s") else f"{v:.4f}" if isinstance(v, float) else str(v)
                     for k, v in row.items()) + " |",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "train.md").write_text(keep_cited(RESULTS / "train.md", text))


if __name__ == "__main__":
    main()
