"""Speed of a pretrained backbone on real JPEGs (Caltech-101) with data loading included, next to the
network alone, before (full decode + kornia ops per image) and after the fast path (JPEGs decoded at reduced
size straight to arrays + the transform's ops in one compiled pass, ``rankopt.data.decode`` /
``rankopt.data.fast_transform``). Image files are read once before they are timed (the page cache), as a
training finds them from its second epoch on.

    python benchmarks/bench_pretrained_loading.py --root $RANKOPT_CALTECH101      # full run (~15 min on 2 cores)
    python benchmarks/bench_pretrained_loading.py --root DIR --quick              # a few batches: checks it runs

In one run, for each backbone and size (the ``test`` / ``train`` presets at that size, ImageNet
normalisation; ``tf_lite_*`` for ``efficientnet_lite0``):

(a) indexing: ``Index.build`` over the image files (what ``rankopt index --images`` runs: decode,
    test transform, DataLoader with W workers, forward, exact index) vs the forward pass alone on
    the same images already decoded and transformed, same batch size.
(b) training: the trainer's loop (``Trainer.train_epoch``: dataset, train transform, m-per-class
    sampler, DataLoader with ``data.num_workers``, step with loss, optimizer and step log; for each
    ``--train-configs`` recipe) vs forward+backward alone (model, recipe loss, backward) on the batches that loop produced;
    also the trainer's step alone on them (loop / step = what loading costs).
(c) equivalence of the reduced decode: the Caltech JPEGs it reduces at ``DRAFT_GAP`` 1 and 2, the
    max / mean |difference| of the test transform's output against the full decode ([0, 1] pixel
    units) and the retrieval metrics of the backbone's embeddings of those images both ways.
(d) per-image costs on one core: read + decode, reference and fast transforms (the fast path's torch
    steps, and the fused kernel it runs).

Rates are images/s over the whole pass (worker start-up included); each network-alone rate is
measured right next to its pipeline (before it in (a), after it on the same batches in (b)), so that
both see about the same load of a shared machine.
Writes benchmarks/results/pretrained_loading.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import math
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import default_collate

import rankopt.data.decode as decode
import rankopt.data.fast_transform as fast_transform
from rankopt.config import load_config
from rankopt.data.image_files import load_image, read_bytes
from rankopt.data.image_folder import images_dataset
from rankopt.data.transforms import PRESETS, build_transform
from rankopt.metrics import evaluate
from rankopt.models import create_model
from rankopt.search import Index
from rankopt.runtime import keep_allocations

RESULTS = Path(__file__).resolve().parent / "results"
WEIGHTS_ENV = {"mobilenet_v2": "RANKOPT_WEIGHTS_MOBILENETV2", "efficientnet_lite0": "RANKOPT_WEIGHTS_EFFICIENTNET_LITE0"}
NOT_CLASSES = ("BACKGROUND_Google", "Faces_easy")  # clutter, and a copy of Faces: left out of (c)'s metrics
PRESET_FAMILY = {"efficientnet_lite0": "tf_lite_"}  # backbone -> preset prefix (default: train / test)


@contextlib.contextmanager
def pipeline(name: str) -> Iterator[None]:
    """``reference``: the loaders batch with torch's ``default_collate`` on all threads, as before."""
    saved = fast_transform.collate
    if name == "reference":
        fast_transform.collate = default_collate
    try:
        yield
    finally:
        fast_transform.collate = saved


class Reference:
    """The pipeline before the fast path: full decode (no ``decode_min_side``) and the kornia ops."""

    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __call__(self, image: Image.Image) -> torch.Tensor:
        return self.transform.reference(image)


def presets(backbone: str) -> tuple[str, str]:
    prefix = PRESET_FAMILY.get(backbone, "")
    train, test = f"{prefix}train", f"{prefix}test"
    if train not in PRESETS or test not in PRESETS:
        raise ValueError(f"presets {train!r}/{test!r} of {backbone!r} are not defined")
    return train, test


def weights_of(backbone: str, explicit: str | None) -> str | None:
    path = explicit or os.environ.get(WEIGHTS_ENV.get(backbone, ""), "")
    return path if path and Path(path).is_file() else None


def caltech_files(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*/*.jpg") if p.is_file())


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def batches(dataset: Any, batch_size: int) -> Iterator[torch.Tensor]:
    for start in range(0, len(dataset), batch_size):
        yield torch.stack([dataset[i]["image"] for i in range(start, min(start + batch_size, len(dataset)))])


@torch.no_grad()
def forward_rate(model: torch.nn.Module, tensors: list[torch.Tensor]) -> float:
    model.eval()
    seconds, _ = timed(lambda: [model(x) for x in tensors])
    return sum(len(x) for x in tensors) / seconds


class Stopwatch:
    """Seconds spent inside a module's forward (hooks) or a method (wrapped on its instance)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0
        self._undo: list[Callable[[], Any]] = []

    def module(self, module: torch.nn.Module) -> Stopwatch:
        def start(*_: Any) -> None:
            self._start = time.perf_counter()

        def stop(*_: Any) -> None:
            self.seconds += time.perf_counter() - self._start

        handles = [module.register_forward_pre_hook(start), module.register_forward_hook(stop)]
        self._undo += [h.remove for h in handles]
        return self

    def method(self, owner: Any, name: str) -> Stopwatch:
        original = getattr(owner, name)

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        own = vars(owner).get(name)  # an attribute of the instance itself, put back afterwards
        setattr(owner, name, wrapped)
        self._undo.append(lambda: setattr(owner, name, own) if own is not None else delattr(owner, name))
        return self

    def stop(self) -> float:
        for undo in self._undo:
            undo()
        return self.seconds


# --------------------------------------------------------------------------- (a) indexing
def bench_index(backbone: str, size: int, weights: str | None, paths: list[str], batch_size: int,
                workers: list[int]) -> list[dict[str, Any]]:
    test = presets(backbone)[1]
    model = create_model(backbone, pretrained=weights is not None,
                         **({"pretrained_path": weights} if weights else {}))
    preprocessing = {"transform": test, "image_size": size}
    tensors = list(batches(images_dataset(paths, build_transform(test, size)), batch_size))
    runs = [("reference", Reference(build_transform(test, size)), 0)] + [("fast", None, w) for w in workers]
    forward_rate(model, tensors[:1])  # warm-up
    alone = [forward_rate(model, tensors)]
    rows = []
    for name, transform, w in runs:
        watch = Stopwatch().module(model)
        with pipeline(name):
            seconds, index = timed(lambda t=transform, w=w: Index.build(
                model, paths, transform=t, preprocessing=preprocessing, device="cpu", batch_size=batch_size,
                num_workers=w, progress=False))
        inside = watch.stop()
        assert len(index) == len(paths)
        alone.append(forward_rate(model, tensors))  # the pipeline is bracketed by two forward-alone passes
        bracket = (alone[-2] + alone[-1]) / 2
        rate = len(paths) / seconds
        rows.append({"backbone": backbone, "px": size, "pipeline": name, "workers": w, "rate": rate,
                     "alone": bracket, "ratio": rate / bracket, "share": inside / seconds})
        print(f"index {backbone} {size}px {name} workers={w}: {rate:.1f} images/s, forward alone {alone[-2]:.1f} / "
              f"{alone[-1]:.1f}, forward {inside / seconds:.0%} of the build", flush=True)
    return rows


# --------------------------------------------------------------------------- (b) training
def forward_backward_rate(trainer: Any, recorded: list[dict[str, Any]]) -> float:
    model, loss_fn = trainer.train_model, trainer.loss_fn
    model.train()

    def run() -> None:
        for batch in recorded:
            loss = loss_fn(model(batch["image"]).float(), batch["label"])
            loss.backward()
            trainer.optimizer.zero_grad(set_to_none=True)

    seconds, _ = timed(run)
    return sum(len(b["image"]) for b in recorded) / seconds


def bench_train(backbone: str, size: int, weights: str | None, root: Path, recipe: str, steps: int,
                batch_size: int, num_workers: int | None) -> list[dict[str, Any]]:
    from rankopt.engine.trainer import Trainer

    train, test = presets(backbone)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [f"data.root={root}", "data.name=image_folder", f"data.train_transform={train}",
                     f"data.test_transform={test}", f"data.image_size={size}", "data.eval_splits=[]",
                     f"model.backbone={backbone}", f"train.batch_size={batch_size}", "train.epochs=1",
                     f"train.max_steps_per_epoch={steps}", "train.device=cpu", f"output.dir={tmp}",
                     "output.progress=false", "output.figures=false", "output.tensorboard=false"]
        if weights:
            overrides += ["model.pretrained=true", f"model.kwargs.pretrained_path={weights}"]
        if num_workers is not None:
            overrides.append(f"data.num_workers={num_workers}")
        trainer = Trainer(load_config(recipe, overrides))
        for path in trainer.train_ds.paths:  # into the page cache, as a second epoch finds them
            read_bytes(path)
        fast = trainer.train_ds.transform
        recorded: list[dict[str, Any]] = []
        step = trainer._train_step

        def recording_step(batch: dict[str, Any]) -> float:
            recorded.append(batch)
            return step(batch)

        trainer._train_step = recording_step  # type: ignore[method-assign]
        trainer.steps_per_epoch = 2
        trainer.train_epoch()  # warm-up (the first steps allocate the optimizer's state), and batches for
        trainer.steps_per_epoch = steps  # the first forward+backward-alone pass
        alone = [forward_backward_rate(trainer, [recorded[i % 2] for i in range(steps)])]
        for name, transform in (("reference", Reference(fast)), ("fast", fast)):
            trainer.train_ds.transform = transform
            recorded.clear()
            watches = {"step": Stopwatch().method(trainer, "_train_step"),
                       "fb": Stopwatch().method(trainer, "_forward_backward"),
                       "opt": Stopwatch().method(trainer, "_optimizer_step")}
            with pipeline(name):
                seconds, _ = timed(trainer.train_epoch)
            inside = {k: w.stop() for k, w in watches.items()}
            alone.append(forward_backward_rate(trainer, recorded))  # bracketed by two alone passes
            bracket = (alone[-2] + alone[-1]) / 2
            rate = sum(len(b["image"]) for b in recorded) / seconds
            rows.append({"recipe": recipe, "backbone": backbone, "px": size, "pipeline": name,
                         "workers": trainer.cfg.data.num_workers,
                         "rate": rate, "alone": bracket, "ratio": rate / bracket,
                         "fb_share": (inside["fb"] - inside["opt"]) / seconds, "step_share": inside["step"] / seconds})
            print(f"train {recipe} {backbone} {size}px {name} workers={trainer.cfg.data.num_workers}: {rate:.2f} images/s, fwd+bwd alone {alone[-2]:.2f} / "
                  f"{alone[-1]:.2f}, in the loop: fwd+bwd {rows[-1]['fb_share']:.0%}, steps "
                  f"{rows[-1]['step_share']:.0%} of the time", flush=True)
    return rows


# --------------------------------------------------------------------------- (c) equivalence of the reduced decode
@contextlib.contextmanager
def draft_gap(gap: float | None) -> Iterator[None]:
    saved = decode.DRAFT_GAP
    decode.DRAFT_GAP = gap if gap is not None else saved
    try:
        yield
    finally:
        decode.DRAFT_GAP = saved


def bench_draft(backbone: str, size: int, weights: str | None, files: list[Path], limit: int,
                batch_size: int) -> list[dict[str, Any]]:
    test = presets(backbone)[1]
    transform = build_transform(test, size)
    side = transform.decode_min_side
    shorter = {}
    for f in files:
        with Image.open(f) as img:
            shorter[f] = min(img.size)
    eligible = [f for f in files if shorter[f] >= 2 * math.ceil(side) and f.parent.name not in NOT_CLASSES]
    chosen = [eligible[i] for i in sorted(np.random.default_rng(0).permutation(len(eligible))[:limit])]
    if len(chosen) < 2:
        return []
    labels = torch.as_tensor(np.unique([f.parent.name for f in chosen], return_inverse=True)[1])
    std = torch.tensor(PRESETS[test].std).view(1, 3, 1, 1)
    model = create_model(backbone, pretrained=weights is not None, **({"pretrained_path": weights} if weights else {}))
    model.eval()
    full = [transform(load_image(str(f))) for f in chosen]
    rows: list[dict[str, Any]] = []
    for gap in (None, 1.0, 2.0):
        with draft_gap(gap):
            images = full if gap is None else [transform(load_image(str(f), side)) for f in chosen]
            reduced = 0 if gap is None else sum(shorter[f] >= 2 * math.ceil(gap * side) for f in chosen)
        diff = (torch.stack(images) - torch.stack(full)).abs() * std
        if rows and reduced == 0:  # every image decoded in full: the full decode's metrics
            metrics = {k: rows[0][k] for k in ("recall@1", "map@r")}
        else:
            with torch.no_grad():
                embeddings = torch.cat([model(torch.stack(images[i : i + batch_size]))
                                        for i in range(0, len(images), batch_size)])
            metrics = evaluate(embeddings, labels, metrics=["recall@1", "map@r"]).metrics
        rows.append({"backbone": backbone, "px": size, "gap": "full decode" if gap is None else f"{gap:g}",
                     "images": len(chosen), "reduced": reduced, "max": float(diff.max()),
                     "mean": float(diff.mean()), **metrics})
        print(f"draft {backbone} {size}px gap={gap}: {rows[-1]}", flush=True)
    return rows


# --------------------------------------------------------------------------- (d) per-image costs
def per_image_costs(files: list[Path], size: int, preset: str) -> dict[str, float]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        transform = build_transform(preset, size)
        side = transform.decode_min_side
        paths = [str(f) for f in files]
        for path in paths[:20]:  # first calls of each decoder (code and tables into the caches) are not timed
            load_image(path), load_image(path, side), decode.decode_jpeg_pixels(read_bytes(path), side)
        costs = {}
        costs["read"] = timed(lambda: [read_bytes(p) for p in paths])[0]
        costs["read + full decode"], full = timed(lambda: [load_image(p) for p in paths])
        costs["read + reduced decode"], reduced = timed(lambda: [load_image(p, side) for p in paths])
        costs["read + reduced decode to an array"], arrays = timed(lambda: [decode.decode_jpeg_pixels(read_bytes(p), side) for p in paths])
        steps = transform.fast.stepwise  # the fused kernel's reference
        for warm in (transform.reference, steps, transform):  # first calls: kornia's set-up, the kernel's compiled code
            warm(reduced[0])
        costs["kornia transform (full decode)"] = timed(lambda: [transform.reference(im) for im in full])[0]
        costs["fast transform, torch steps (reduced decode)"] = timed(lambda: [steps(im) for im in reduced])[0]
        costs["fast transform (reduced decode)"] = timed(lambda: [transform(im) for im in reduced])[0]
        costs["fast transform (array)"] = timed(lambda: [transform(a) for a in arrays if a is not None])[0]
        return {k: v / len(paths) * 1e3 for k, v in costs.items()}
    finally:
        torch.set_num_threads(threads)


# --------------------------------------------------------------------------- report
def table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> list[str]:
    lines = ["| " + " | ".join(c[1] for c in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(format(row[c[0]], c[2]) if c[2] else str(row[c[0]]) for c in columns) + " |")
    return lines


def main() -> int:
    keep_allocations()  # as every rankopt command does (rankopt.runtime)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=os.environ.get("RANKOPT_CALTECH101"), help="Caltech-101 folder "
                        "(101_ObjectCategories; default $RANKOPT_CALTECH101)")
    parser.add_argument("--backbones", nargs="+", default=["mobilenet_v2"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 224])
    parser.add_argument("--weights", help="weights file of the (single) backbone (default: its $RANKOPT_WEIGHTS_* file)")
    parser.add_argument("--index-images", type=int, default=256)
    parser.add_argument("--index-batch", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="DataLoader workers of (a)")
    parser.add_argument("--train-configs", nargs="+", default=["caltech101", "image_folder:0", "image_folder"],
                        metavar="RECIPE[:WORKERS]", help="(b): recipes, each with its own data.num_workers or WORKERS "
                        "(default: the Caltech-101 benchmark's recipe; image_folder with 0 and with its own 4 workers)")
    parser.add_argument("--train-steps", type=int, default=4)
    parser.add_argument("--train-batch", type=int, default=64)
    parser.add_argument("--draft-images", type=int, default=300, help="(c): at most this many reduced JPEGs")
    parser.add_argument("--quick", action="store_true", help="64 images, 2 steps of 16, 64 draft images")
    parser.add_argument("--out", type=Path, default=RESULTS / "pretrained_loading.md")
    args = parser.parse_args()
    if not args.root or not Path(args.root).is_dir():
        parser.error(f"--root (or $RANKOPT_CALTECH101): Caltech-101 folder not found ({args.root!r})")
    if args.quick:
        args.index_images, args.index_batch, args.train_steps, args.train_batch, args.draft_images = 64, 16, 2, 16, 64
    root = Path(args.root)
    files = caltech_files(root)
    rng = np.random.default_rng(0)
    sample = [str(files[i]) for i in rng.permutation(len(files))[: args.index_images]]
    for path in sample:  # into the page cache: every pipeline reads warm files
        read_bytes(path)
    load = [os.getloadavg()[0]]
    index_rows, train_rows, draft_rows, costs = [], [], [], {}
    for backbone in args.backbones:
        weights = weights_of(backbone, args.weights)
        for size in args.sizes:
            costs[(backbone, size)] = per_image_costs([Path(p) for p in sample[:200]], size, presets(backbone)[1])
            index_rows += bench_index(backbone, size, weights, sample, args.index_batch, args.workers)
            for config in args.train_configs:
                recipe, _, workers = config.partition(":")
                train_rows += bench_train(backbone, size, weights, root, recipe, args.train_steps, args.train_batch,
                                          int(workers) if workers else None)
            draft_rows += bench_draft(backbone, size, weights, files, args.draft_images, args.index_batch)
    load.append(os.getloadavg()[0])

    command = " ".join(["python benchmarks/bench_pretrained_loading.py", *sys.argv[1:]]).replace(str(root), "$RANKOPT_CALTECH101")
    weights_note = ", ".join(f"{b}: {'pretrained (' + Path(w).name + ')' if (w := weights_of(b, args.weights)) else 'random init'}"
                             for b in args.backbones)
    lines = [
        "# Loading speed of a pretrained backbone on Caltech-101 JPEGs",
        "",
        f"- command: `{command}`",
        f"- machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), Pillow {Image.__version__}, Python {platform.python_version()}",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; load average (1 min) "
        f"{load[0]:.1f} at the start, {load[1]:.1f} at the end (a shared machine: every rate is lower when it is busy)",
        f"- weights: {weights_note}; reduced decode: `DRAFT_GAP` = {decode.DRAFT_GAP:g}",
        "- `reference`: full decode + the transform's kornia ops per image, batches stacked by `default_collate` on "
        "torch's threads (the pipeline before the fast path); `fast`: JPEGs decoded at reduced size by libjpeg-turbo "
        "(simplejpeg) straight to arrays (`rankopt.data.decode.decode_jpeg_pixels`), the transform's ops in one "
        "compiled pass (`rankopt.data.fast_transform`), one-thread `collate`. Every pipeline reads files already in "
        "the page cache (read once before; in training, as from the second epoch on).",
        "",
        f"## (a) `rankopt index` path (`Index.build` over {args.index_images} image files, batch {args.index_batch}) "
        "vs forward alone",
        "",
        *table(index_rows, [("backbone", "backbone", ""), ("px", "px", ""), ("pipeline", "pipeline", ""),
                            ("workers", "workers", ""), ("rate", "index images/s", ".1f"),
                            ("alone", "forward alone images/s", ".1f"), ("ratio", "ratio", ".2f"),
                            ("share", "forward / build time", ".2f")]),
        "",
        "*forward alone*: the mean of the passes just before and just after the build; *forward / build time*: "
        "the time the build spent in the model's forward over its wall time, measured inside the same run "
        "(with 0 workers the ratio a quiet machine would give; with workers the forward shares the cores).",
        "",
        f"## (b) training loop ({args.train_steps} steps of {args.train_batch}) vs forward+backward alone",
        "",
        "Recipes: `caltech101` is the benchmark's (stem and first four stages frozen, 0 workers); `image_folder` "
        "trains the whole network (its own `data.num_workers` is 4).",
        "",
        *table(train_rows, [("recipe", "recipe", ""), ("backbone", "backbone", ""), ("px", "px", ""), ("pipeline", "pipeline", ""),
                            ("workers", "workers", ""), ("rate", "loop images/s", ".2f"),
                            ("alone", "fwd+bwd alone images/s", ".2f"), ("ratio", "ratio", ".2f"),
                            ("fb_share", "fwd+bwd / loop time", ".2f"), ("step_share", "steps / loop time", ".2f")]),
        "",
        "*fwd+bwd alone*: model, recipe loss and backward on batches of the loop (mean of the passes before and "
        "after it); inside the loop's own run: *fwd+bwd / loop time* (forward, loss, backward; without the "
        "optimizer step and the step log) and *steps / loop time* (the rest is waiting for data, worker start-up "
        "included).",
        "",
        "## (c) reduced JPEG decode vs full decode (test transform; Caltech JPEGs whose shorter side is >= 2x the "
        "resize target, i.e. reduced at `DRAFT_GAP` 1, less BACKGROUND_Google and Faces_easy; self-retrieval by class)",
        "",
        *table(draft_rows, [("backbone", "backbone", ""), ("px", "px", ""), ("gap", "DRAFT_GAP", ""),
                            ("images", "images", ""), ("reduced", "decoded reduced", ""),
                            ("max", "max abs diff", ".4f"), ("mean", "mean abs diff", ".5f"),
                            ("recall@1", "recall@1", ".4f"), ("map@r", "map@r", ".4f")]),
        "",
        "## (d) per-image costs, one core, 200 of the images (ms/image)",
        "",
        "| backbone | px | " + " | ".join(next(iter(costs.values()))) + " |",
        "|" + "---|" * (2 + len(next(iter(costs.values())))),
        *[f"| {b} | {s} | " + " | ".join(f"{v:.2f}" for v in c.values()) + " |" for (b, s), c in costs.items()],
        "",
    ]
    text = "\n".join(lines)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print("\n" + text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
