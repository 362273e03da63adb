"""``rankopt train [RECIPE] [key=value ...] [--resume PATH|auto] [--output DIR]``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "train", help="train a retrieval model from a recipe",
        description="Train a retrieval model. With no recipe, the 'default' recipe trains a small CPU model on "
                    "rankopt's embedded SYNTHETIC dataset in a few minutes. Overrides are key=value pairs on the "
                    "config (e.g. train.epochs=4 optim.lr=1e-4); the resolved config is saved in the run folder. "
                    "Multi-GPU: torchrun --nproc_per_node=N -m rankopt train RECIPE (train.batch_size is global).")
    parser.add_argument("recipe", nargs="?", default=None,
                        help="recipe name (see --list-recipes) or YAML path; default: 'default'")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides")
    parser.add_argument("--resume", metavar="PATH|auto",
                        help="continue from a checkpoint ('auto': OUTPUT/checkpoints/last.ckpt if present)")
    parser.add_argument("--output", metavar="DIR", help="run folder (default: runs/<recipe>-<UTC time>)")
    parser.add_argument("--list-recipes", action="store_true", help="list the shipped recipes and exit")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.set_defaults(func=run)


def recipe_and_overrides(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """The recipe given (``None``: none) and the overrides; ``rankopt train key=value ...`` names no recipe."""
    recipe, overrides = args.recipe, list(args.overrides)
    if recipe is not None and "=" in recipe:
        recipe, overrides = None, [recipe, *overrides]
    return recipe, overrides


def resolve_config(args: argparse.Namespace) -> Any:
    """The config of ``args``: recipe (or, when resuming without one, the checkpoint's) + overrides + flags."""
    from rankopt.config import apply_overrides, load_config

    recipe, overrides = recipe_and_overrides(args)
    output = args.output
    if args.resume and args.resume != "auto" and recipe is None:
        from rankopt.engine.checkpoint import load_checkpoint

        cfg = apply_overrides(load_checkpoint(args.resume)["config"], overrides)
        output = output or str(Path(args.resume).resolve().parent.parent)
    else:
        cfg = load_config(recipe, overrides)
    if args.resume:
        cfg.train.resume = args.resume
    if output:
        cfg.output.dir = output
    if cfg.train.resume == "auto" and cfg.output.dir is None:
        raise ValueError("--resume auto needs the run folder: pass --output DIR (or output.dir=DIR)")
    return cfg


def run(args: argparse.Namespace) -> int:
    from rankopt.config import list_recipes

    if args.list_recipes:
        from rankopt.config import load_recipe

        for name in list_recipes():
            print(f"{name:<28} {load_recipe(name).description}")
        return 0
    cfg = resolve_config(args)
    if args.print_config:
        from omegaconf import OmegaConf

        print(OmegaConf.to_yaml(OmegaConf.structured(cfg)))
        return 0
    import sys

    from rankopt.engine.trainer import Trainer

    recipe, overrides = recipe_and_overrides(args)
    info = {"recipe": recipe or ("(checkpoint)" if args.resume and args.resume != "auto" else "default"),
            "overrides": overrides, "command": "rankopt " + " ".join(sys.argv[1:])}
    Trainer(cfg, run_info=info).fit()
    return 0
