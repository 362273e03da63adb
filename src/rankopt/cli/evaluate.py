"""``rankopt evaluate CHECKPOINT [--dataset NAME --root PATH] [--split ...] [--metrics ...] [--json OUT]``."""

from __future__ import annotations

import argparse
from typing import Any

from rankopt.cli._model import add_threads_argument, apply_threads
from rankopt.cli._postprocess import add_postprocess_arguments


def add_model_data_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments shared by ``evaluate`` and ``embed``: checkpoint, dataset, transform, device, threads."""
    parser.add_argument("checkpoint", help="a rankopt checkpoint (e.g. RUN/checkpoints/best.ckpt)")
    parser.add_argument("--dataset", metavar="NAME", help="dataset name (default: the checkpoint's training dataset)")
    parser.add_argument("--root", metavar="PATH", help="dataset folder (default: the checkpoint's data.root)")
    parser.add_argument("--transform", metavar="PRESET", help="test transform preset (default: the checkpoint's)")
    parser.add_argument("--image-size", metavar="S|HxW", help="test image size (default: the checkpoint's)")
    parser.add_argument("--batch-size", type=int, default=None, metavar="B", help="embedding batch size")
    parser.add_argument("--num-workers", type=int, default=0, metavar="W", help="DataLoader workers")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: auto)")
    parser.add_argument("--no-progress", action="store_true", help="hide progress bars")
    add_threads_argument(parser)


def load_for_inference(args: argparse.Namespace, splits: list[str] | None) -> tuple[Any, Any, dict[str, Any], Any, Any]:
    """(model, config, {split: dataset}, device, batch transform or None) for ``args``, with the test transform
    (``args.transform``/``args.image_size`` written into the config). ``splits``: ``None`` for the dataset's
    evaluation splits, ``[]`` for none (no dataset is read). Applies ``--threads``."""
    from rankopt.checks import canonical_image_size
    from rankopt.engine.assembly import build_datasets, build_transforms, model_from_checkpoint, resolve_device

    apply_threads(args)
    device = resolve_device(args.device)
    model, cfg = model_from_checkpoint(args.checkpoint, device)
    data = cfg.data
    if args.dataset is not None:
        data.eval_name, data.eval_root = args.dataset, args.root
        data.batch_transform = data.batch_transform and args.dataset == data.name  # other images may differ in size
    elif args.root is not None:
        data.eval_root = args.root
    data.test_transform = args.transform or data.test_transform
    data.image_size = canonical_image_size(args.image_size) or data.image_size
    data.eval_splits = splits
    if args.batch_size is not None:
        cfg.eval.batch_size = args.batch_size
    _, datasets = build_datasets(cfg, train=False)
    batch_transform = build_transforms(cfg)[1] if data.batch_transform else None
    return model, cfg, datasets, device, batch_transform


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "evaluate", help="evaluate a checkpoint on a dataset (all metrics, JSON out)",
        description="Embed a dataset's evaluation splits with a checkpoint and compute retrieval metrics. "
                    "One split is self-retrieval (each query excluded from its own results by index); "
                    "two splits are QUERY GALLERY.")
    add_model_data_arguments(parser)
    parser.add_argument("--split", nargs="+", metavar="SPLIT",
                        help="SPLIT (self-retrieval) or QUERY GALLERY (default: the dataset's evaluation splits)")
    parser.add_argument("--metrics", nargs="+", metavar="METRIC",
                        help="metric names, or 'all' (default: the checkpoint's eval.metrics)")
    parser.add_argument("--similarity", choices=("cosine", "dot", "neg_l2"), help="default: the checkpoint's")
    parser.add_argument("--json", metavar="OUT", help="write the result as JSON (with by_category when the queries have categories)")
    parser.add_argument("--output", metavar="DIR",
                        help="also write a run folder: report.html, report.json, metrics.json, retrieval.npz, figures/")
    add_postprocess_arguments(parser, query_side=True, gallery_side=True)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import time
    from pathlib import Path

    from rankopt.cli._postprocess import postprocessing_from_args
    from rankopt.engine.assembly import inference_preprocessing
    from rankopt.engine.evaluation import evaluate_model
    from rankopt.engine.logging import format_table
    from rankopt.models.fingerprint import model_fingerprint

    if args.split is not None and len(args.split) > 2:
        raise ValueError(f"--split takes one split (self-retrieval) or two (query gallery), got {args.split}")
    model, cfg, datasets, device, batch_transform = load_for_inference(args, args.split)
    if args.similarity:
        cfg.eval.similarity = args.similarity
    metrics = args.metrics
    if metrics == ["all"]:
        from rankopt.metrics import ALL_METRICS

        metrics = list(ALL_METRICS)
    post = postprocessing_from_args(args, model_fingerprint(model, inference_preprocessing(cfg)))
    start = time.perf_counter()
    result, splits = evaluate_model(model, datasets, cfg.eval, device=device, num_workers=args.num_workers,
                                    show_progress=not args.no_progress, metrics=metrics, batch_transform=batch_transform,
                                    postprocessing=post)
    dataset = cfg.data.eval_name or cfg.data.name
    out = {"checkpoint": str(args.checkpoint), "dataset": dataset, "splits": list(datasets),
           "similarity": cfg.eval.similarity, "postprocessing": post.to_dict(), **result.to_dict()}
    print(format_table({"value": dict(result.metrics)},
                       f"{dataset} ({' vs '.join(datasets)}): {result.num_queries} queries, "
                       f"{result.num_queries_without_positive} without a positive (excluded)"))
    if result.by_category:
        print(format_table({name: sub.metrics for name, sub in result.by_category.items()},
                           "per query category (" + ", ".join(f"{name}: {sub.num_queries} queries"
                                                              for name, sub in result.by_category.items()) + ")"))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
        print(f"wrote {args.json}")
    if args.output:
        page = write_evaluation_folder(Path(args.output), args, cfg, model, datasets, splits, result,
                                       time.perf_counter() - start, postprocessing=post.to_dict())
        print(f"run folder: {args.output}" + (f"; report: {page}" if page else ""))
    return 0


def write_evaluation_folder(run_dir: Any, args: argparse.Namespace, cfg: Any, model: Any, datasets: dict[str, Any],
                            splits: list[Any], result: Any, seconds: float,
                            postprocessing: dict[str, Any] | None = None) -> Any:
    """The run folder of an evaluation (kind ``evaluate``): config, run info, one metrics record,
    report.json (with the ``postprocessing`` steps applied), retrieval.npz, figures and report.html
    (``rankopt.engine.run_folder``; retrieval.npz and the figures use the whitened embeddings, without DBA/αQE)."""
    import json
    import sys

    from rankopt.config import save_config
    from rankopt.engine import run_folder
    from rankopt.engine.logging import write_text_atomic

    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    info = {"recipe": f"(checkpoint {args.checkpoint})", "overrides": [], "command": "rankopt " + " ".join(sys.argv[1:])}
    run_folder.write_run_info(run_dir, info, next(model.parameters()).device)
    record = {"epoch": 0, "step": 0, **result.to_record()}
    write_text_atomic(run_dir / "metrics.json", json.dumps([record], indent=2))
    first = next(iter(datasets.values()))
    level_names = list(getattr(first, "level_names", []))
    run_folder.write_retrieval(run_dir, splits, cfg.eval.similarity)
    figures = run_folder.write_split_figures(run_dir, splits, cfg, level_names=level_names)
    dataset = cfg.data.eval_name or cfg.data.name
    report = {
        "kind": "evaluate", "name": cfg.name, "run_dir": str(run_dir), "dataset": dataset, "checkpoint": str(args.checkpoint),
        "wall_seconds": round(seconds, 1), "untrained": {}, "trained": record, "best": {},
        "data": {"name": dataset, "root": cfg.data.eval_root or cfg.data.root, "eval_name": dataset,
                 "level_names": level_names, "eval": run_folder.dataset_counts(datasets)},
        "model": run_folder.model_info(model, cfg.model.backbone),
        "loss": {"name": cfg.loss.name, "kwargs": dict(cfg.loss.kwargs), "repr": ""},
        "machine": run_folder.machine_info(next(model.parameters()).device),
        "figures": [str(p) for p in figures],
        "postprocessing": postprocessing or {},
    }
    write_text_atomic(run_dir / "report.json", json.dumps(report, indent=2))
    return run_folder.write_html_report(run_dir)
