"""``rankopt fit PHOTOS --out RUN [--minutes M] [--backbone NAME | --weights FILE]``, then ``rankopt serve RUN``."""

from __future__ import annotations

import argparse
from typing import Any

from rankopt.cli._threads import add_runtime_argument, add_threads_argument, apply_threads
from rankopt.fit.settings import QUERIES, FitSettings


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "fit", help="photos in, a better search out: fine-tune, validate and index in one command",
        description="Check the photos, fine-tune a pretrained backbone with a rank loss on most of their classes, "
                    "validate it and the post-processing steps as the index is searched (new photos of the classes "
                    "kept back, and whole classes held out), serve the best for --queries (never worse than the "
                    "pretrained features there), and index every photo: RUN/index, RUN/report.html, RUN/fit.json. "
                    "Then: rankopt serve RUN.")
    parser.add_argument("photos", metavar="PHOTOS", help="a folder of class folders, or an OML-format .csv")
    defaults = FitSettings()
    parser.add_argument("--out", required=True, metavar="RUN", help="the run folder to create (new, or --overwrite)")
    parser.add_argument("--minutes", type=float, default=defaults.minutes, metavar="M",
                        help=f"time budget of the whole command (default {defaults.minutes:g})")
    parser.add_argument("--backbone", default=defaults.backbone, metavar="NAME",
                        help="pretrained release by name, fetched once into rankopt's cache (rankopt weights list), "
                             "auto (efficientnet_lite2 when one pass over the photos takes at most two thirds of "
                             "the budget, else mobilenet_v2), or a timm CNN, timm:NAME (timm and its hub, or --weights "
                             f"with a same-architecture file); default {defaults.backbone}")
    parser.add_argument("--weights", metavar="FILE", help="start from this file instead: a rankopt checkpoint, or "
                                                          "the release file of --backbone (its sha256 is checked)")
    parser.add_argument("--seed", type=int, default=defaults.seed,
                        help=f"validation classes and training order ({defaults.seed})")
    parser.add_argument("--device", default=defaults.device,
                        help=f"cpu, cuda, cuda:1, ... (default: {defaults.device})")
    parser.add_argument("--validation-fraction", type=float, default=defaults.validation_fraction, metavar="F",
                        help="share of each class's photos kept back as new photos of known classes, and of the "
                             "classes held out whole as new classes where there are 10 or more "
                             f"({defaults.validation_fraction:g})")
    parser.add_argument("--queries", choices=QUERIES, default=defaults.queries,
                        help="the searches the index will answer, which choose what is served: known = new photos of "
                             "the classes in PHOTOS, new = photos of other classes, both = the best on "
                             "a mix of 3 known searches in 4 and 1 new, among those no worse than the pretrained "
                             "features on new "
                             f"(default {defaults.queries})")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace RUN when it holds a fit (finished or stopped part-way); never another folder")
    parser.add_argument("--no-dba", dest="dba", action="store_false",
                        help="do not try database-side augmentation (tried by default: each indexed vector averaged "
                             "with its neighbours, recomputed for every item when the index changes)")
    parser.add_argument("--strict", action="store_true",
                        help="refuse the photos when one cannot be read, naming every bad file (by default an "
                             "unreadable photo is left out and listed in RUN/skipped.txt)")
    parser.add_argument("--no-refit", dest="refit", action="store_false",
                        help="serve the model trained on the training classes only (by default the chosen recipe is "
                             "run again on every class, the validation ones included)")
    add_runtime_argument(parser)
    add_threads_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rankopt.fit import FitSettings, fit

    if args.minutes <= 0:
        raise ValueError(f"--minutes must be > 0, got {args.minutes}")
    apply_threads(args)
    fit(args.photos, args.out, FitSettings(minutes=args.minutes, backbone=args.backbone, weights=args.weights,
                                           seed=args.seed, device=args.device,
                                           validation_fraction=args.validation_fraction, dba=args.dba,
                                           refit=args.refit, queries=args.queries, overwrite=args.overwrite,
                                           strict=args.strict, runtime=args.runtime))
    return 0
