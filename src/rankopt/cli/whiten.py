"""``rankopt whiten CHECKPOINT [--dataset NAME --root PATH] [--split train] [--supervised] [--power P]
[--shrinkage B] [--dim D] [--multiscale [S ...]] --out W.safetensors``.

Fits a learned whitening (``rankopt.postprocess.whitening``) on a checkpoint's embeddings of a
training split (never the test split) and writes it as safetensors, tagged with the model
fingerprint so ``evaluate``/``embed --whiten`` refuse it for another model.
"""

from __future__ import annotations

import argparse
from typing import Any

from rankopt.cli._postprocess import add_multiscale_argument
from rankopt.cli._model import add_model_data_arguments, runtime_network
from rankopt.cli._outputs import check_output


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "whiten", help="fit a PCA or supervised whitening on a training split's embeddings",
        description="Embed a training split with a checkpoint and fit a learned whitening x -> normalize(P (x - m)): "
                    "PCA whitening (power 0.5 full, 0.25 square-rooted) or supervised whitening from the split's "
                    "matching pairs (Radenovic et al. 2016). Use it with evaluate/embed --whiten.")
    add_model_data_arguments(parser)
    parser.add_argument("--split", default=None, metavar="SPLIT",
                        help="split to fit on (default: the checkpoint's training split, its training part when "
                             "the checkpoint carved a validation split)")
    parser.add_argument("--supervised", action="store_true", help="supervised whitening from same-class pairs")
    parser.add_argument("--power", type=float, default=None, metavar="P",
                        help="PCA whitening power: 0.5 full whitening (default), 0.25 square-rooted PCA")
    parser.add_argument("--shrinkage", type=float, default=0.0, metavar="B",
                        help="covariance shrinkage towards (tr/D) I, in [0, 1] (default 0)")
    parser.add_argument("--dim", type=int, default=None, metavar="D", help="output dimension (default: all)")
    parser.add_argument("--max-pairs-per-class", type=int, default=1000, metavar="N",
                        help="matching pairs drawn per class for --supervised (default 1000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the pair draw (default 0)")
    add_multiscale_argument(parser)
    parser.add_argument("--out", required=True, metavar="W.safetensors", help="output whitening file")
    parser.set_defaults(func=run)


def _training_split(args: argparse.Namespace) -> tuple[Any, Any, Any, Any, Any, str]:
    """(model, config, dataset, device, batch transform, description) of the split to fit on."""
    from rankopt.cli._model import load_from_args
    from rankopt.engine.assembly import build_datasets, build_transforms

    if args.split is not None:
        model, cfg, datasets, device, batch_transform = load_from_args(args, [args.split])
        if cfg.data.validation_fraction > 0 and args.dataset is None:
            raise ValueError("the checkpoint carved a validation split from its training data: leave --split out "
                             "to fit on its training part, or name --dataset/--root")
        name = cfg.data.eval_name or cfg.data.name
        return model, cfg, next(iter(datasets.values())), device, batch_transform, f"{name}/{args.split}"
    if args.dataset is not None:
        raise ValueError("with --dataset, name the split to fit on with --split (e.g. --split train)")
    model, cfg, _, device, batch_transform = load_from_args(args, [])
    train, _ = build_datasets(cfg, train=True)
    if not cfg.data.batch_transform:
        train.transform = build_transforms(cfg)[1]  # the test transform: no augmentation
    carved = " (training part)" if cfg.data.validation_fraction > 0 else ""
    return model, cfg, train, device, batch_transform, f"{cfg.data.name}/{cfg.data.train_split}{carved}"


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from rankopt.cli._postprocess import scales_from_args
    from rankopt.engine.assembly import inference_preprocessing
    from rankopt.engine.embed_and_score import embed_dataset
    from rankopt.models.fingerprint import model_fingerprint
    from rankopt.postprocess import PostProcessing
    from rankopt.models.multiscale import multiscale
    from rankopt.postprocess import (
        fit_pca_whitening,
        fit_supervised_whitening,
        save_whitening,
    )

    if args.supervised and args.power is not None:
        raise ValueError("--power applies to PCA whitening; supervised whitening whitens the pair covariance fully")
    scales = scales_from_args(args)
    check_output(args.out, "--out", inputs=[args.checkpoint])  # before any image is embedded
    model, cfg, dataset, device, batch_transform, fitted_on = _training_split(args)
    preprocessing = inference_preprocessing(cfg) | PostProcessing(scales).preprocessing()
    network = runtime_network(args, multiscale(model, scales), preprocessing, device)
    split = embed_dataset(network, dataset, batch_size=args.batch_size or cfg.eval.batch_size,
                          device=device, num_workers=args.num_workers, show_progress=not args.no_progress,
                          batch_transform=batch_transform, desc=f"embedding {fitted_on}")
    if args.supervised:
        whitening = fit_supervised_whitening(split.embeddings, split.labels, shrinkage=args.shrinkage, dim=args.dim,
                                             max_pairs_per_class=args.max_pairs_per_class, seed=args.seed,
                                             fitted_on=fitted_on)
    else:
        whitening = fit_pca_whitening(split.embeddings, power=0.5 if args.power is None else args.power,
                                      shrinkage=args.shrinkage, dim=args.dim, fitted_on=fitted_on)
    fingerprint = model_fingerprint(model, inference_preprocessing(cfg))
    path = save_whitening(dataclasses.replace(whitening, model_fingerprint=fingerprint, scales=scales), args.out)
    print(f"wrote {path}: {whitening.kind} whitening {whitening.input_dim} -> {whitening.dim} dims, fitted on "
          f"{len(split.embeddings)} embeddings of {fitted_on} (model fingerprint {fingerprint})")
    return 0
