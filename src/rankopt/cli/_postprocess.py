"""Command-line options of the post-processing steps (``rankopt.postprocess``), shared by the sub-commands.

Embedding side (always): ``--multiscale [S ...]``, ``--whiten W.safetensors``; query side: ``--qe K
[--qe-alpha A]``; gallery side: ``--dba K [--dba-alpha A]``.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_multiscale_argument(parser: Any) -> None:
    """``--multiscale [S ...]`` (no value: the default scales 1, 1/sqrt 2, 1/2)."""
    parser.add_argument("--multiscale", nargs="*", type=float, metavar="S",
                        help="embed at these image scales, pooled features combined by the GeM power mean "
                             "(no value: 1 0.7071 0.5)")


def scales_from_args(args: argparse.Namespace) -> tuple[float, ...] | None:
    """The scales of ``--multiscale`` (None when absent)."""
    from rankopt.models.multiscale import DEFAULT_SCALES, check_scales

    scales = getattr(args, "multiscale", None)
    return None if scales is None else check_scales(scales or DEFAULT_SCALES)


def add_postprocess_arguments(parser: argparse.ArgumentParser, *, query_side: bool, gallery_side: bool,
                              embedding_side: bool = True) -> None:
    """Register the multi-scale and whitening options (``embedding_side``), αQE (``query_side``) and DBA
    (``gallery_side``)."""
    group = parser.add_argument_group("post-processing (multi-scale -> whitening -> DBA -> query expansion)")
    if embedding_side:
        add_multiscale_argument(group)
        group.add_argument("--whiten", metavar="W.safetensors",
                           help="apply a learned whitening (rankopt whiten) to the embeddings")
    if query_side:
        group.add_argument("--qe", type=int, metavar="K",
                           help="alpha-weighted query expansion with the top K gallery items (ICCV'19 §5: K = 10); "
                                "default: the index's own, if it stores one (rankopt fit); 0: none")
        group.add_argument("--qe-alpha", type=float, metavar="A",
                           help="query expansion weight exponent (default 2, as ICCV'19 §5)")
    if gallery_side:
        group.add_argument("--dba", type=int, metavar="K",
                           help="database-side augmentation: each gallery item averaged with its top K others")
        group.add_argument("--dba-alpha", type=float, metavar="A",
                           help="DBA weight exponent (default 2)")


def expansion_from_args(args: argparse.Namespace, name: str) -> Any:
    """The :class:`rankopt.postprocess.Expansion` of ``--{name} K [--{name}-alpha A]`` (None when absent)."""
    from rankopt.postprocess import PAPER_ALPHA, Expansion

    k, alpha = getattr(args, name, None), getattr(args, f"{name}_alpha", None)
    if k is None:
        if alpha is not None:
            raise ValueError(f"--{name}-alpha needs --{name} K")
        return None
    return Expansion(k, PAPER_ALPHA if alpha is None else alpha)


def postprocessing_from_args(args: argparse.Namespace, model_fingerprint: str) -> Any:
    """The :class:`rankopt.postprocess.PostProcessing` of ``args``. ``model_fingerprint``: the model's
    ``model_fingerprint(model, inference_preprocessing(cfg))``; a ``--whiten`` file fitted for another
    model, test transform or multi-scale setting is refused."""
    from rankopt.postprocess import PostProcessing, load_whitening

    scales = scales_from_args(args)
    whitening = None
    if getattr(args, "whiten", None):
        whitening = load_whitening(args.whiten)
        whitening.check_model(model_fingerprint, scales, source=f"whitening {args.whiten!r}")
    return PostProcessing(scales, whitening, expansion_from_args(args, "dba"), expansion_from_args(args, "qe"))
