"""What might make ``rankopt fit``'s fine-tuned model better, tried on the *training* categories of Caltech-101 only.

    python benchmarks/fit_variants.py --photos OUT/photos-train50 --variant base --seeds 0 1 2
    python benchmarks/fit_variants.py --photos OUT/photos-train50 --variant refit --seeds 0 1 2

(``OUT/photos-train50``: the folder of the 50 ``caltech101`` training categories that ``bench_fit.py`` links.)

The 50 test categories of the benchmark are never read: per seed, 15 of the 50 training categories (seed 100 + s)
play the held-out test classes, and the other 35 are what ``fit`` would see, of which 20 % (seed s) validate, as in
``fit``. The trunk outputs (centred and mirrored) of every photo are computed once and kept in ``--cache``. Each
variant tunes the tail with ``rankopt.fit.tune.tune`` for ``--seconds`` (``fit``'s candidates and selection), then
scores the chosen state on the 15 stand-in test classes (mAP@R, self-retrieval), beside the pretrained features:

* ``base``: the state ``tune`` chose on validation;
* ``wise``: that state interpolated with the pretrained one, ``θ0 + α(θ - θ0)``, α ∈ {0.25, 0.5, 0.75, 1, 1.25, 1.5}
  chosen on validation (WiSE-FT, Wortsman et al. 2022);
* ``crop``: training batches of trunk outputs randomly cropped (side ``--crop`` to full, each photo its own
  offset), an augmentation a cached trunk allows besides mirroring;
* ``soup``: the candidates' best states averaged greedily from the best, each kept when validation rises
  (model soups, Wortsman et al. 2022);
* ``refit``: the chosen recipe run again on the 35 classes, validation ones included
  (``rankopt.fit.tune.retrain``, steps scaled by the photos added): ``fit``'s ``refit`` stage;
* ``post``: what the chosen state adds on top of post-processing: the features and the chosen state, each with the
  whitening, DBA and αQE that ``fit`` chooses for it on validation (``rankopt.fit.post.choose_postprocessing``),
  with DBA and αQE's ``k`` from ``fit``'s grid (1-10) and from a wider one (1-40), whose largest ``k`` ``fit``'s
  grid never reaches on Caltech-101. Its summary gives the paired differences of these four pipelines, and what
  ``fit``'s serving rule would serve from the first two (the chosen state's pipeline when its mean gain per
  validation class is positive and over 0 or 1 standard error), against the features' pipeline.

Prints one JSON line per seed and a summary line: the mean ± sd over seeds of each variant's gain over the features
(``post``: of its paired differences).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from rankopt.data.splits import held_out_classes
from rankopt.data.transforms import build_transform
from rankopt.engine.assembly import model_from_checkpoint, seed_everything
from rankopt.fit.clock import Clock
from rankopt.fit.photos import read_photos
from rankopt.fit.post import (
    EXPANSION_KS,
    SELECT_ON,
    choose_postprocessing,
    per_class_gain,
    score_self_retrieval,
)
from rankopt.fit.settings import FitSettings
from rankopt.fit.trunk import (
    TrunkCache,
    embed_cached,
    final_resolution_cut,
    trunk_outputs,
)
from rankopt.fit.tune import (
    Candidate,
    load_trainable,
    retrain,
    trainable_state,
    tune,
)
from rankopt.engine.weights import resolve_checkpoint
from rankopt.models.stages import cut

WISE_ALPHAS = (0.25, 0.5, 0.75, 1.25, 1.5)
WIDE_KS = (*EXPANSION_KS, 20, 40)
SERVE_THRESHOLDS = (0.0, 1.0)
POST_DIFFERENCES = (("chosen+pp", "features+pp"), ("chosen+pp wide", "features+pp wide"),
                    ("features+pp wide", "features+pp"), ("chosen+pp wide", "chosen+pp"))


def network() -> tuple[torch.nn.Module, object, torch.nn.Module, torch.nn.Module]:
    net, cfg = model_from_checkpoint(resolve_checkpoint("mobilenet_v2", None, say=lambda _: None), torch.device("cpu"))
    net.freeze_bn = True
    trunk, tail = cut(net, final_resolution_cut(net, (224, 224)))
    for p in trunk.parameters():
        p.requires_grad_(False)
    return net, cfg, trunk, tail


def trunk_cache(photos: Path, path: Path) -> dict:
    if path.is_file():
        return torch.load(path, weights_only=False)  # this script's own file
    _, cfg, trunk, _ = network()
    dataset = read_photos(photos, None)
    dataset.transform = build_transform(cfg.data.test_transform, cfg.data.image_size)
    centre, shape = trunk_outputs(trunk, dataset, device=torch.device("cpu"), batch_size=32)
    mirrored, _ = trunk_outputs(trunk, dataset, device=torch.device("cpu"), batch_size=32, mirror=True)
    kept = {"center": centre, "mirrored": mirrored, "shape": shape, "labels": np.asarray(dataset.labels)[:, 0]}
    torch.save(kept, path)
    return kept


class CroppedCache(TrunkCache):
    """Training batches (those with a ``mirror`` draw) cropped at random: a side from ``crop`` to full, per photo."""

    crop = 0

    def outputs(self, index: np.ndarray, mirror: np.ndarray | None = None) -> torch.Tensor:
        out = super().outputs(index, mirror)
        if mirror is None or not self.crop:
            return out
        side = int(np.random.randint(self.crop, out.shape[-1] + 1))
        ys, xs = (np.random.randint(0, out.shape[-1] - side + 1, len(out)) for _ in range(2))
        return torch.stack([o[:, y:y + side, x:x + side] for o, y, x in zip(out, ys, xs)])


def greedy_soup(tail, trials, states: dict[int, dict], validate) -> None:
    """Each trial's best state (``states``: by the id of the metrics ``validate`` returned for it), averaged from
    the best trial down, each kept when validation rises."""
    bests = [max(t.history, key=lambda h: h[1]["new"][SELECT_ON])[1]["new"] for t in trials if t.history]
    ranked = sorted(bests, key=lambda m: m[SELECT_ON], reverse=True)
    members, soup, best = 1, states[id(ranked[0])], ranked[0][SELECT_ON]
    for metrics in ranked[1:]:
        mixed = {k: (v * members + states[id(metrics)][k]) / (members + 1) for k, v in soup.items()}
        load_trainable(tail, mixed)
        if (score := validate()[SELECT_ON]) > best:
            members, soup, best = members + 1, mixed, score
    load_trainable(tail, soup)


def post_pipelines(tail, cache: TrunkCache, pretrained: dict, chosen: dict, labels: np.ndarray,
                   rows: dict[str, np.ndarray]) -> dict[str, float | str]:
    """The ``post`` variant: mAP@R on the stand-in test classes of the features and the chosen state, each with the
    post-processing chosen for it on validation (``k`` up to 10, and with ``wide`` up to 40), their choices, the
    :data:`POST_DIFFERENCES`, and what ``fit``'s serving rule (:func:`rankopt.fit.post.per_class_gain`, on the
    validation classes) would serve at a threshold of :data:`SERVE_THRESHOLDS` standard errors, against the
    features' pipeline."""
    out: dict[str, float | str] = {}
    by_class: dict[str, dict] = {}
    for model, state in (("features", pretrained), ("chosen", chosen)):
        load_trainable(tail, state)
        x = {split: embed_cached(tail, cache, index) for split, index in rows.items()}
        for suffix, ks in (("", EXPANSION_KS), (" wide", WIDE_KS)):
            choice = choose_postprocessing(x["train"], labels[rows["train"]], x["val"], labels[rows["val"]], ks=ks)
            steps = choice.steps(choice.fitted_whitening)
            out[f"{model}+pp{suffix}"] = score_self_retrieval(x["test"], labels[rows["test"]], steps)[SELECT_ON]
            out[f"{model}+pp{suffix} steps"] = choice.describe()
            if not suffix:
                val_labels = labels[rows["val"]]
                by_class[model] = score_self_retrieval(x["val"], val_labels, steps,
                                                       categories=[str(c) for c in val_labels])[1]
    for a, b in POST_DIFFERENCES:
        out[f"{a} - {b}"] = out[a] - out[b]  # type: ignore[operator]
    mean, se, _ = per_class_gain(by_class["features"], by_class["chosen"])
    out["validation gain"], out["validation se"] = mean, se
    for threshold in SERVE_THRESHOLDS:
        served = "chosen" if mean > 0 and mean > threshold * se else "features"
        out[f"served at {threshold:g} se - features+pp"] = out[f"{served}+pp"] - out["features+pp"]  # type: ignore
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--photos", type=Path, required=True)
    parser.add_argument("--variant", choices=("base", "wise", "crop", "soup", "refit", "post"), default="base")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seconds", type=float, default=240.0, help="tuning time per seed")
    parser.add_argument("--crop", type=int, default=10, help="smallest crop side (crop variant)")
    parser.add_argument("--cache", type=Path, default=Path("fit_variants_cache.pt"))
    args = parser.parse_args()
    cached = trunk_cache(args.photos, args.cache)
    labels = cached["labels"]
    classes = np.unique(labels)
    settings = FitSettings()
    gains: dict[str, list[float]] = {}  # by name, one paired difference per seed
    for seed in args.seeds:
        seed_everything(seed)
        test_classes = held_out_classes(classes, 0.3, seed=100 + seed)
        fit_classes = np.setdiff1d(classes, test_classes)
        val_classes = held_out_classes(fit_classes, settings.validation_fraction, seed=seed)
        test_rows, val_rows = (np.flatnonzero(np.isin(labels, c)) for c in (test_classes, val_classes))
        train_rows = np.flatnonzero(np.isin(labels, fit_classes) & ~np.isin(labels, val_classes))
        _, _, _, tail = network()
        cache = (CroppedCache if args.variant == "crop" else TrunkCache)(
            cached["center"], cached["shape"], cached["mirrored"], np.arange(len(labels)))
        cache.crop = args.crop

        def score(rows: np.ndarray) -> float:
            return score_self_retrieval(embed_cached(tail, cache, rows), labels[rows])[SELECT_ON]

        states: dict[int, dict] = {}  # every validated state, by the id of its metrics (the soup's members)

        def validate() -> dict[str, float]:
            metrics = score_self_retrieval(embed_cached(tail, cache, val_rows), labels[val_rows])
            if args.variant == "soup":
                states[id(metrics)] = trainable_state(tail)
            return metrics

        features = score(test_rows)
        candidates = [Candidate(loss, lr) for loss in settings.losses for lr in settings.lrs]
        result = tune(tail, cache, train_rows, labels[train_rows], lambda: {"new": validate()}, candidates,
                      seconds=args.seconds, clock=Clock(1e9, say=lambda _: None), primary="new",
                      batch_size=settings.batch_size, m=settings.m, seed=seed)
        row = {"seed": seed, "features": features, "chosen_from": result.best_from}
        best = result.best_state or result.pretrained_state
        load_trainable(tail, best)
        row["chosen"] = score(test_rows)
        if result.best_state is not None and args.variant == "wise":
            start = result.pretrained_state
            by_alpha = {1.0: result.best_metrics[SELECT_ON]}
            for alpha in WISE_ALPHAS:
                load_trainable(tail, {k: start[k] + alpha * (best[k] - start[k]) for k in best})
                by_alpha[alpha] = score(val_rows)
            alpha = max(by_alpha, key=by_alpha.get)
            load_trainable(tail, {k: start[k] + alpha * (best[k] - start[k]) for k in best})
            row["alpha"] = alpha
        elif result.best_state is not None and args.variant == "soup":
            greedy_soup(tail, result.trials, states, validate)
        elif result.best_state is not None and args.variant == "refit":
            rows = np.concatenate([train_rows, val_rows])
            steps = round(result.best_step * len(rows) / len(train_rows))
            retrain(tail, cache, rows, labels[rows], result.best_candidate, steps, start_state=result.pretrained_state,
                    seconds=1e9, clock=Clock(1e9, say=lambda _: None), batch_size=settings.batch_size,
                    m=settings.m, seed=seed)
            row["refit_steps"] = steps
        differences = {"chosen": row["chosen"] - features}
        if args.variant == "post":
            pipelines = post_pipelines(tail, cache, result.pretrained_state, best, labels,
                                       {"train": train_rows, "val": val_rows, "test": test_rows})
            row.update(pipelines)
            differences.update({name: v for name, v in pipelines.items() if " - " in name})
        else:
            row[args.variant] = score(test_rows)
            differences[args.variant] = row[args.variant] - features
        for name, value in differences.items():
            gains.setdefault(name, []).append(value)  # type: ignore[arg-type]
        print(json.dumps(row), flush=True)
    print("gains (over the features, or as named), mean ± sd over seeds: " + "; ".join(
        f"{name} {np.mean(g):+.4f} ± {np.std(g, ddof=1) if len(g) > 1 else 0.0:.4f}" for name, g in gains.items()))


if __name__ == "__main__":
    main()
