"""``rankopt fit`` on real photos: time, peak memory and what it gains, against the features it starts from.

    python benchmarks/bench_fit.py --caltech $RANKOPT_CALTECH101 --yaleb $RANKOPT_YALEB --mobilefacenet 068.ckpt \
        --rows small:0,1,2 held-out:0,1,2 whole:0 yaleb:0,1,2

Rows (each a real ``rankopt fit`` process, its wall time and peak resident memory from GNU ``time``):

* ``whole``: the whole Caltech-101 folder as a user has it (8,242 photos, 100 categories: ``BACKGROUND_Google``
  and ``Faces_easy``, a tighter crop of ``Faces``, left out), defaults (10 minutes); the index must hold every photo.
* ``held-out``: the fit sees only the 50 training categories of the ``caltech101`` dataset; its pipeline is then
  scored on the 50 test categories (3,063 photos, each a query, itself excluded: as ``rankopt benchmark
  caltech101`` scores), beside rows that need no training, measured the same way at the same 224 px: the
  pretrained features, and the features with the post-processing ``fit`` chose for them on its validation
  classes (whitening refitted on the 50 training categories), each with the model's own centre crop and with the
  framing ``fit`` chose on validation (``chosen.framing``; the same rows when it kept the centre crop).
* ``yaleb``: Extended Yale B faces, ``--backbone mobilefacenet`` (its release file placed in the cache first with
  ``rankopt weights fetch mobilefacenet --file``): the fit sees the ``yaleb`` training people only (subjects 1-20);
  the released weights and the fit's model are then scored on the 19 test people (1,216 faces, each a query) with
  mAP@R, R@1 and TAR@FAR 1e-3 over all pairs, as ``rankopt evaluate --dataset yaleb`` scores them.
* ``known`` (closed-set, the search a person runs most): all 100 Caltech-101 categories, a third of each
  category's photos (every third, sorted by name) never shown to ``fit`` and searched as new photos in the served
  index of the rest (``RUN/index``: its embedder, its DBA'd vectors, its αQE), beside the same queries searched in
  an index of the same photos by the pretrained features (alone and with the post-processing ``fit`` chose for them
  for known queries, whitening refitted on the indexed photos), and by ``fit``'s fine-tuned model (alone and with
  its post-processing for known queries); mAP@R and R@1 over the queries.
* ``yaleb-known``: Extended Yale B, all 38 people, ``--backbone mobilefacenet``; a third of the 64 lightings
  (every third, sorted by name) never shown to ``fit`` and searched in its served index, scored as ``known``.
* ``scale-25k``, ``scale-50k``: the ``whole`` folder grown to about 25,000 and 50,000 photos with distinct variants of
  each photo written as JPEG files under ``--out`` (mirrored; centre crops of 90 % and 80 % of each side, each also
  mirrored: 3 and 6 files a photo, the first kept), each in its photo's class; defaults; the time each stage cost.
* ``small``: 10 categories x 20 photos; should finish within 2 minutes and say how little it could learn.
* ``ROW@BACKBONE`` (e.g. ``known@efficientnet_lite0``): a Caltech-101 row fitted with ``--backbone BACKBONE``, its
  reference rows scored with that backbone's released ImageNet weights.
* ``held-out-30min``: ``held-out`` with ``--minutes 30``: what three times the default budget buys.

Folders of symbolic links are made under ``--out`` (never in the photos' folder). Runs already finished there are
read, not rerun. Writes ``benchmarks/results/fit.md`` (``--results``: another table, for a partial rerun).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rankopt.config import EvalConfig
from rankopt.data import build_dataset
from rankopt.data.transforms import build_transform
from rankopt.describe import machine_info, source_commit
from rankopt.engine.assembly import model_from_checkpoint
from rankopt.engine.embed_and_score import EmbeddedSplit, embed_dataset, score
from rankopt.engine.weights import pretrained_checkpoint
from rankopt.files import write_text_atomic
from rankopt.fit.post import METRICS, WhiteningChoice, score_self_retrieval
from rankopt.postprocess import Expansion, PostProcessing
from rankopt.runtime import keep_allocations
from rankopt.search import Index
from rankopt.search.embedder import Embedder

RESULTS = Path(__file__).resolve().parent / "results" / "fit.md"
LEFT_OUT = ("BACKGROUND_Google", "Faces_easy")
YALEB_METRICS = ("map@r", "recall@1", "tar@far=1e-03")


def link_tree(root: Path, out: Path, classes: list[str], per_class: int | None = None) -> Path:
    """``out/<class>/<photo>``: symbolic links to ``root``'s photos of ``classes`` (the first ``per_class``)."""
    return link_photos(out, [photo for name in classes for photo in sorted((root / name).iterdir())[:per_class]])


def link_photos(out: Path, photos: list[Path]) -> Path:
    """``out/<folder>/<photo>``: a symbolic link to each of ``photos`` under the name of its folder."""
    if out.exists():
        return out
    tmp = out.with_suffix(".tmp")
    for photo in photos:
        (tmp / photo.parent.name).mkdir(parents=True, exist_ok=True)
        (tmp / photo.parent.name / photo.name).symlink_to(photo.resolve())
    tmp.rename(out)
    return out


VARIANTS = ((1.0, True), (0.9, False), (0.9, True), (0.8, False), (0.8, True))
"""The written variants of a photo for the scale rows: (share of each side kept, centred; mirrored)."""


def grown_tree(root: Path, out: Path, classes: list[str], copies: int) -> Path:
    """``out/<class>/<photo>``: every photo of ``classes`` (a link) and its first ``copies`` :data:`VARIANTS`
    (JPEG files, quality 90), made once."""
    from PIL import Image, ImageOps

    if out.exists():
        return out
    tmp = out.with_suffix(".tmp")
    for name in classes:
        (tmp / name).mkdir(parents=True, exist_ok=True)
        for photo in sorted((root / name).iterdir()):
            (tmp / name / photo.name).symlink_to(photo.resolve())
            with Image.open(photo) as opened:
                image = ImageOps.exif_transpose(opened).convert("RGB")
            for n, (share, mirrored) in enumerate(VARIANTS[:copies]):
                w, h = image.size
                box = (round(w * (1 - share) / 2), round(h * (1 - share) / 2), round(w * (1 + share) / 2),
                       round(h * (1 + share) / 2))
                variant = image.crop(box)
                variant = ImageOps.mirror(variant) if mirrored else variant
                variant.save(tmp / name / f"{photo.stem}-v{n}.jpg", quality=90)
    tmp.rename(out)
    return out


def run_fit(photos: Path, run: Path, seed: int, minutes: float | None, options: tuple[str, ...] = ()) -> dict:
    """``rankopt fit`` in a child process (or its finished run): wall seconds and peak RSS with its record."""
    done = run / "bench.json"
    if done.is_file():
        return json.loads(done.read_text())
    if run.exists():
        subprocess.run(["rm", "-rf", str(run)], check=True)
    command = [sys.executable, "-m", "rankopt", "fit", str(photos), "--out", str(run), "--seed", str(seed)]
    command += ([] if minutes is None else ["--minutes", str(minutes)]) + list(options)
    began = time.monotonic()
    log = run.with_suffix(".log")
    with log.open("w") as handle:  # GNU time: the peak resident set of the fit's process (KiB)
        code = subprocess.run(["/usr/bin/time", "-f", "PEAK_KIB %M", *command], stdout=handle,
                              stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - began
    if code != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({code}); see {log}")
    peak = int(log.read_text().rsplit("PEAK_KIB ", 1)[1].split()[0]) / 2**20
    result = {"wall_s": wall, "peak_gib": peak, "fit": json.loads((run / "fit.json").read_text()),
              "indexed": len(Index.load(run)), "command": "rankopt " + " ".join(command[3:]),
              "commit": source_commit(), "finished": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}"}
    write_text_atomic(done, json.dumps(result, indent=1))
    return result


CLOSED_ROWS = ("pretrained features", "features + post-processing (chosen by fit for known queries)",
               "fit's fine-tuned model alone", "fit's fine-tuned model + its post-processing (for known queries)",
               "fit's served pipeline")


def pipeline_post(record: dict, model: str, protocol: str) -> dict | None:
    """The post-processing ``fit`` chose for ``model`` on ``protocol``'s queries (``None``: none was kept)."""
    return next((p["post"] for p in record["pipelines"] if p["model"] == model and p["steps_for"] == protocol), None)


def closed_set_split(paths: list[Path], key) -> tuple[list[Path], list[Path]]:
    """``(indexed, queries)``: the photos whose ``key`` is every third of the sorted keys of their class (Caltech:
    the file name; Yale B: the lighting) are the queries."""
    indexed, queries = [], []
    for folder in sorted({p.parent for p in paths}):
        mine = sorted((p for p in paths if p.parent == folder), key=key)
        keys = sorted({key(p) for p in mine})
        asked = set(keys[2::3])
        for p in mine:
            (queries if key(p) in asked else indexed).append(p)
    return indexed, queries


def lighting(path: Path) -> str:
    """A Yale B face's lighting (``A+000E+00``), the same name for every person."""
    return path.stem.split("_P00", 1)[1]


def _labels(paths: list[Path], names: list[str]) -> torch.Tensor:
    return torch.as_tensor([names.index(p.parent.name) for p in paths]).view(-1, 1)


def closed_set_scores(run: Path, indexed: list[Path], queries: list[Path], features_ckpt: Path,
                      metrics: tuple[str, ...] = METRICS) -> dict[str, dict[str, float]]:
    """The ``known`` rows (module docstring), kept in ``run/scores.json``."""
    kept = run / "scores.json"
    if kept.is_file():
        return json.loads(kept.read_text())
    names = sorted({p.parent.name for p in indexed})
    g_y, q_y = _labels(indexed, names), _labels(queries, names)
    record = json.loads((run / "fit.json").read_text())

    def scored(checkpoint: Path, post: dict | None) -> dict[str, float]:
        embedder = Embedder.from_checkpoint(checkpoint, batch_size=32, progress=False)  # its own framing
        g, q = (embedder.embed([str(p) for p in paths]).embeddings for paths in (indexed, queries))
        steps = PostProcessing() if post is None else refitted(post, g, g_y[:, 0].numpy())
        return score_query_gallery(q, q_y, g, g_y, steps, metrics)

    rows = {CLOSED_ROWS[0]: scored(features_ckpt, None),
            CLOSED_ROWS[1]: scored(features_ckpt, pipeline_post(record, "features", "known")),
            CLOSED_ROWS[2]: scored(fine_tuned(run), None),
            CLOSED_ROWS[3]: scored(fine_tuned(run), pipeline_post(record, "fine-tuned", "known")),
            CLOSED_ROWS[4]: served_index_scores(run, queries, q_y, names, metrics)}
    write_text_atomic(kept, json.dumps(rows, indent=1))
    return rows


def score_query_gallery(q: torch.Tensor, q_y: torch.Tensor, g: torch.Tensor, g_y: torch.Tensor, post: PostProcessing,
                        metrics: tuple[str, ...]) -> dict[str, float]:
    splits = [EmbeddedSplit(q, q_y, [], {}), EmbeddedSplit(g, g_y, [], {})]
    return dict(score(splits, EvalConfig(), metrics=list(metrics), postprocessing=post).metrics)


def served_index_scores(run: Path, queries: list[Path], q_y: torch.Tensor, names: list[str],
                        metrics: tuple[str, ...]) -> dict[str, Any]:
    """The queries searched in ``run``'s index as ``rankopt serve`` does: its embedder (framing, multi-scale,
    whitening), its vectors (DBA applied when built), its αQE."""
    index = Index.load(run)
    q = index.embedder_for(batch_size=32, progress=False).embed([str(p) for p in queries]).embeddings
    g_y = _labels([Path(p) for p in index.paths], names)
    scores: dict[str, Any] = score_query_gallery(q, q_y, index.embeddings, g_y,
                                                 PostProcessing(None, None, None, index.query_expansion), metrics)
    return {**scores, "chosen": json.loads((run / "fit.json").read_text())["chosen"]["pipeline"]}


HELD_OUT_ROWS = ("pretrained features", "features + post-processing (chosen by fit)",
                 "pretrained features, framed as fit chose", "the same + post-processing (chosen by fit)",
                 "fit's fine-tuned model alone", "fit's fine-tuned model + its post-processing (chosen by fit)",
                 "fit's served pipeline")


def held_out_scores(run: Path, root: Path, features_ckpt: Path) -> dict[str, dict[str, float]]:
    """The rows scored on the ``caltech101`` test categories (module docstring), kept in ``run/scores.json``; rows
    missing there (added to this script after the run was scored) are scored and added."""
    kept = run / "scores.json"
    rows = json.loads(kept.read_text()) if kept.is_file() else {}
    missing = [name for name in HELD_OUT_ROWS if name not in rows]
    if missing:
        rows.update(_held_out_scores(run, root, features_ckpt, missing))
        rows = {name: rows[name] for name in HELD_OUT_ROWS}
        write_text_atomic(kept, json.dumps(rows, indent=1))
    return rows


def _held_out_scores(run: Path, root: Path, features_ckpt: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    record = json.loads((run / "fit.json").read_text())
    post_by_model = {model: pipeline_post(record, model, "new") for model in ("features", "fine-tuned")}
    framed = record["chosen"]["framing"]["preset"]
    embedded: dict[tuple[Path, str, str | None], tuple[torch.Tensor, np.ndarray]] = {}

    def embed(checkpoint: Path, split: str, preset: str | None = None) -> tuple[torch.Tensor, np.ndarray]:
        if (checkpoint, split, preset) not in embedded:
            model, cfg = model_from_checkpoint(checkpoint)
            dataset = build_dataset("caltech101", root, split,
                                    transform=build_transform(preset or cfg.data.test_transform, cfg.data.image_size))
            x = embed_dataset(model, dataset, batch_size=32, show_progress=False).embeddings
            embedded[checkpoint, split, preset] = x, np.asarray(dataset.labels)[:, 0]
        return embedded[checkpoint, split, preset]

    def scored(checkpoint: Path, preset: str | None = None, post: dict | None = None) -> dict[str, float]:
        test_x, test_y = embed(checkpoint, "test", preset)
        if not post:
            return score_self_retrieval(test_x, test_y)  # type: ignore[return-value]
        train_x, train_y = embed(checkpoint, "train", preset)
        return score_self_retrieval(test_x, test_y, refitted(post, train_x, train_y))  # type: ignore[return-value]

    _, own = model_from_checkpoint(features_ckpt)
    as_framed = None if framed == own.data.test_transform else framed
    rows = {"pretrained features": lambda: scored(features_ckpt),
            "features + post-processing (chosen by fit)": lambda: scored(features_ckpt, None, post_by_model["features"]),
            "pretrained features, framed as fit chose": lambda: scored(features_ckpt, as_framed),
            "the same + post-processing (chosen by fit)":
                lambda: scored(features_ckpt, as_framed, post_by_model["features"]),
            # the fine-tuned checkpoint's own test transform is the framing fit chose
            "fit's fine-tuned model alone": lambda: scored(fine_tuned(run)),
            "fit's fine-tuned model + its post-processing (chosen by fit)":
                lambda: scored(fine_tuned(run), None, post_by_model["fine-tuned"]),
            "fit's served pipeline": lambda: served_scores(run, "caltech101", root)}
    return {name: rows[name]() for name in names}


def served_scores(run: Path, dataset: str, root: Path, metrics: tuple[str, ...] = METRICS) -> dict[str, Any]:
    """The served pipeline on ``dataset``'s test split: the index's embedder (multi-scale, whitening), then its DBA and
    αQE, each test item a query among the others."""
    index = Index.load(run)
    embedder = index.embedder_for(batch_size=32, progress=False)
    test = build_dataset(dataset, root, "test", transform=embedder.transform)
    expansions = PostProcessing(None, None, None if index.record.dba is None else Expansion(**index.record.dba),
                                index.query_expansion)
    scores: dict[str, Any] = score_self_retrieval(embedder.embed(test).embeddings, np.asarray(test.labels)[:, 0],
                                                  expansions, metrics=metrics)  # type: ignore[assignment]
    scales = "" if index.post is None or index.post.scales is None else ", multi-scale"
    chosen = json.loads((run / "fit.json").read_text())["chosen"]["model"]
    return {**scores, "chosen": f"{chosen}{scales}"}


def fine_tuned(run: Path) -> Path:
    """The fit's fine-tuned model: ``model.ckpt`` when it is served, else the ``fine_tuned.ckpt`` kept beside it
    (the pretrained weights when no fine-tuned state beat them on validation)."""
    kept = json.loads((run / "fit.json").read_text())["chosen"].get("fine_tuned_checkpoint")
    return run / (kept or "model.ckpt")


def yaleb_scores(run: Path, root: Path, released: Path) -> dict[str, dict[str, float]]:
    """The released weights and the fit's model on the ``yaleb`` test people (module docstring), kept in
    ``run/scores.json``."""
    kept = run / "scores.json"
    if kept.is_file():
        return json.loads(kept.read_text())
    rows = {}
    for name, checkpoint in (("released weights", released), ("fit's fine-tuned model alone", fine_tuned(run))):
        model, cfg = model_from_checkpoint(checkpoint)
        dataset = build_dataset("yaleb", root, "test",
                                transform=build_transform(cfg.data.test_transform, cfg.data.image_size))
        x = embed_dataset(model, dataset, batch_size=32, show_progress=False).embeddings
        rows[name] = score_self_retrieval(x, np.asarray(dataset.labels)[:, 0], metrics=YALEB_METRICS)
    rows["fit's served pipeline"] = served_scores(run, "yaleb", root, YALEB_METRICS)
    write_text_atomic(kept, json.dumps(rows, indent=1))
    return rows


def refitted(chosen: dict, train_x: torch.Tensor, train_y: np.ndarray) -> PostProcessing:
    """The post-processing ``chosen`` (``PostChoice.to_dict()``), its whitening refitted on all training categories."""
    whitening = None if chosen["whitening"] is None else \
        WhiteningChoice(**chosen["whitening"]).fit(train_x, train_y, "caltech101 train")
    expansions = (None if chosen[k] is None else Expansion(**chosen[k]) for k in ("dba", "qe"))
    return PostProcessing(None, whitening, *expansions)


def machine_text() -> str:
    info = machine_info("cpu")
    return f"{info['cpu_count']} CPU cores, no GPU, torch {info['torch']} ({info['torch_threads']} threads), " \
           f"Python {info['python']}, {info['platform']}"


def validation_value(record: dict, name: str) -> float:
    """The validation mAP@R on known queries (the closed-set protocol) of the pipeline ``name`` of a fit record."""
    pipeline = next(p for p in record["pipelines"] if p["name"] == name)
    return pipeline["scores"]["known"]["metrics"]["map@r"]


def mean_sd(values: list[float], digits: int = 4) -> str:
    return f"{statistics.mean(values):.{digits}f}" + (f" ± {statistics.stdev(values):.{digits}f}"
                                                       if len(values) > 1 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--caltech", default=os.environ.get("RANKOPT_CALTECH101"), help="101_ObjectCategories")
    parser.add_argument("--yaleb", default=os.environ.get("RANKOPT_YALEB"), help="CroppedYale (the yaleb row)")
    parser.add_argument("--mobilefacenet", help="MobileFaceNet's release file (068.ckpt), for the yaleb row")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rows", nargs="+", default=["small", "held-out", "whole"],
                        help="rows, each optionally with its own seeds: held-out:0,1 (default: --seeds)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/rankopt-fit-bench"))
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="the table written (default benchmarks/results/fit.md; another for a partial rerun)")
    args = parser.parse_args()
    keep_allocations()  # the scoring's embeddings, as every rankopt command runs them (rankopt.runtime)
    root = Path(args.caltech)
    categories = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name not in LEFT_OUT)
    train_categories = sorted({Path(p).parent.name for p in build_dataset("caltech101", root, "train").paths})
    features_ckpt = pretrained_checkpoint("mobilenet_v2")
    trees = {"whole": link_tree(root, args.out / "photos-whole", categories),
             "held-out": link_tree(root, args.out / "photos-train50", train_categories),
             "small": link_tree(root, args.out / "photos-small", categories[::10][:10], 20)}
    trees["held-out-30min"] = trees["held-out"]
    for row, copies in (("scale-25k", 2), ("scale-50k", 5)):
        if any(r.partition(":")[0].partition("@")[0] == row for r in args.rows):
            trees[row] = grown_tree(root, args.out / f"photos-{row}", categories, copies)
    every = [p for name in categories for p in sorted((root / name).iterdir())]
    closed = {"known": closed_set_split(every, lambda p: p.name)}
    trees["known"] = link_photos(args.out / "photos-known", closed["known"][0])
    minutes = {"whole": None, "held-out": None, "held-out-30min": 30.0, "small": 2.0, "yaleb": None, "known": None,
               "yaleb-known": None, "scale-25k": None, "scale-50k": None}
    options = {"yaleb": ("--backbone", "mobilefacenet"), "yaleb-known": ("--backbone", "mobilefacenet")}
    if any(r.startswith("yaleb") for r in args.rows):
        subprocess.run([sys.executable, "-m", "rankopt", "weights", "fetch", "mobilefacenet", "--file",
                        args.mobilefacenet], check=True)
        trees["yaleb"] = link_photos(args.out / "photos-yaleb-train",
                                     [Path(p) for p in build_dataset("yaleb", args.yaleb, "train").paths])
        faces_all = [Path(p) for split in ("train", "test") for p in build_dataset("yaleb", args.yaleb, split).paths]
        closed["yaleb-known"] = closed_set_split(faces_all, lighting)
        trees["yaleb-known"] = link_photos(args.out / "photos-yaleb-known", closed["yaleb-known"][0])
    released = {"known": features_ckpt, "yaleb-known": None}
    runs: dict[str, list[dict]] = {}
    held: dict[str, list[dict[str, dict[str, float]]]] = {}  # by row: held-out, held-out-30min
    faces: list[dict[str, dict[str, float]]] = []
    known: dict[str, list[dict[str, dict[str, float]]]] = {}  # by row: known, yaleb-known
    plan = [(int(seed), order, name) for order, (name, _, seeds) in enumerate(r.partition(":") for r in args.rows)
            for seed in (seeds.split(",") if seeds else args.seeds)]
    for seed, _, row in sorted(plan):  # seed by seed, rows in the order given
        base, _, backbone = row.partition("@")
        extra = ("--backbone", backbone) if backbone else ()
        reference = pretrained_checkpoint(backbone) if backbone else features_ckpt
        result = run_fit(trees[base], args.out / f"{row}-s{seed}", seed, minutes[base], options.get(base, extra))
        runs.setdefault(row, []).append(result)
        print(f"{row} seed {seed}: {result['wall_s']:.0f} s, {result['peak_gib']:.2f} GiB, "
              f"{result['indexed']} indexed", flush=True)
        if base.startswith("held-out"):
            held.setdefault(row, []).append(held_out_scores(args.out / f"{row}-s{seed}", root, reference))
            print(json.dumps(held[row][-1], indent=1), flush=True)
        if base in closed:
            indexed, queries = closed[base]
            release = reference if backbone else released[base] or pretrained_checkpoint("mobilefacenet")
            known.setdefault(row, []).append(closed_set_scores(args.out / f"{row}-s{seed}", indexed, queries, release))
            print(json.dumps(known[row][-1], indent=1), flush=True)
        if row == "yaleb":
            faces.append(yaleb_scores(args.out / f"yaleb-s{seed}", Path(args.yaleb),
                                      pretrained_checkpoint("mobilefacenet")))
            print(json.dumps(faces[-1], indent=1), flush=True)
    lines = ["# `rankopt fit` on Caltech-101", "",
             f"Generated by `benchmarks/bench_fit.py` on {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} "
             f"UTC.", "",
             f"    python benchmarks/bench_fit.py --caltech $RANKOPT_CALTECH101 --yaleb $RANKOPT_YALEB "
             f"--mobilefacenet 068.ckpt --rows {' '.join(args.rows)}"
             + ("" if args.results == RESULTS else f" --results benchmarks/results/{args.results.name}"),
             "", f"Machine: {machine_text()}; load before the run {os.getloadavg()[0]:.1f}; each fit alone on it.", "",
             "## Time, memory, what was indexed", "",
             "| row | runs | wall (s) | peak RSS (GiB) | indexed | validation mAP@R (known queries): features → served "
             "| served |",
             "|---|---|---|---|---|---|---|"]
    for row, results in runs.items():
        features = [validation_value(r["fit"], "features") for r in results]
        served = [validation_value(r["fit"], r["fit"]["chosen"]["served_name"]) for r in results]
        lines.append(f"| {row} | {len(results)} | {mean_sd([r['wall_s'] for r in results], 1)} | "
                     f"{mean_sd([r['peak_gib'] for r in results], 2)} | {results[0]['indexed']} | "
                     f"{mean_sd(features)} → {mean_sd(served)} | "
                     f"{', '.join(r['fit']['chosen']['model'] for r in results)} |")
    scaled = [row for row in runs if row.partition("@")[0] in ("whole", "scale-25k", "scale-50k")]
    if scaled:
        stages = list(dict.fromkeys(k for row in scaled for r in runs[row] for k in r["fit"]["seconds"]
                                    if k != "total")) + ["total"]  # every stage any run had (scales: when tried)
        lines += ["", "## At scale: what each stage cost (seconds, mean over the runs)", "",
                  "| row | photos | runtime | " + " | ".join(stages) + " | served |",
                  "|---|---|---|" + "---|" * len(stages) + "---|"]
        for row in scaled:
            results = runs[row]
            runtime = (results[0]["fit"].get("machine") or {}).get("runtime") or {}
            lines.append(f"| {row} | {results[0]['indexed']:,} | {runtime.get('name', 'pytorch')} | " + " | ".join(
                f"{statistics.mean(r['fit']['seconds'].get(k, 0.0) for r in results):.0f}" for k in stages)
                + f" | {', '.join(r['fit']['chosen']['model'] for r in results)} |")
    for row, scores in known.items():
        base, _, backbone = row.partition("@")
        what = "Caltech-101, all 100 categories" if base == "known" else "Extended Yale B, all 38 people"
        what += f" (`--backbone {backbone}`)" if backbone else ""
        count = len(closed[base][1])
        lines += ["", f"## Closed-set ({row}): {what}; {count:,} photos never shown to fit, searched as new photos "
                  f"in the served index of the other {len(closed[base][0]):,}", "",
                  "| pipeline | runs | mAP@R | R@1 |", "|---|---|---|---|"]
        for name in scores[0]:
            lines.append(f"| {name} | {len(scores)} | {mean_sd([h[name]['map@r'] for h in scores])} | "
                         f"{mean_sd([h[name]['recall@1'] for h in scores])} |")
    for row, scores in held.items():
        base, _, backbone = row.partition("@")
        budget = "" if minutes[base] is None else f" with `--minutes {minutes[base]:g}`"
        budget += f" (`--backbone {backbone}`)" if backbone else ""
        lines += ["", f"## Held out{budget}: fit on the 50 training categories, scored on the 50 test categories "
                  "(3,063 photos)", "", "| pipeline | runs | mAP@R | R@1 |", "|---|---|---|---|"]
        for name in scores[0]:
            lines.append(f"| {name} | {len(scores)} | {mean_sd([h[name]['map@r'] for h in scores])} | "
                         f"{mean_sd([h[name]['recall@1'] for h in scores])} |")
    if faces:
        lines += ["", "## Extended Yale B: fit on the training people (`--backbone mobilefacenet`), scored on the 19 "
                  "test people (1,216 faces)", "", "| model | runs | mAP@R | R@1 | TAR@FAR 1e-3 |", "|---|---|---|---|---|"]
        for name in faces[0]:
            lines.append(f"| {name} | {len(faces)} | " + " | ".join(mean_sd([f[name][m] for f in faces])
                                                                  for m in YALEB_METRICS) + " |")
    lines += ["", "Per run (`fit.json` `chosen.why`; `OUT` is `--out`):", ""]
    for row, results in runs.items():
        for r in results:
            out_dir = str(Path(r["command"].split("--out ")[1].split()[0]).parent)  # the --out of its run
            command = r["command"].replace("-m rankopt ", "rankopt ").replace(out_dir, "OUT")  # OUT: --out
            code = f"code {r['commit'][:7]}{'+dirty' if r['commit'].endswith('+dirty') else ''}, " \
                f"{r['finished']} UTC" if r.get("commit") else "code before the refit stage (runs of 2026-11-27 " \
                "11:16–12:41 UTC)"
            lines.append(f"- {row} ({code}), `{command}`: " + "; ".join(r["fit"]["chosen"]["why"]))
    write_text_atomic(args.results, "\n".join(lines) + "\n")
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
