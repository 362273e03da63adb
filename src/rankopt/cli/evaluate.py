"""``rankopt evaluate CHECKPOINT [--dataset NAME --root PATH] [--split ...] [--metrics ...] [--multilabels [--graded]]
[--json OUT]``."""

from __future__ import annotations

import argparse
from typing import Any

from rankopt.cli._model import add_model_data_arguments, load_from_args, runtime_network
from rankopt.cli._outputs import check_output
from rankopt.cli._postprocess import add_postprocess_arguments


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
    parser.add_argument("--multilabels", action="store_true",
                        help="relevance from the items' multi-label rows (a CSV's 'labels' column, --dataset csv): "
                             "relevant when sharing a label, as evaluate-embeddings --multilabels")
    parser.add_argument("--graded", action="store_true",
                        help="with --multilabels: the number of shared labels is the relevance grade (h-ap, ndcg)")
    parser.add_argument("--json", metavar="OUT",
                        help="write the result as JSON (with by_category when the queries have categories)")
    parser.add_argument("--output", metavar="DIR",
                        help="also write a run folder: report.html, report.json, metrics.json, retrieval.npz, figures/")
    add_postprocess_arguments(parser, query_side=True, gallery_side=True)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import json
    import sys
    import time
    from pathlib import Path

    from rankopt.cli._postprocess import postprocessing_from_args
    from rankopt.console import format_table
    from rankopt.engine.assembly import inference_preprocessing
    from rankopt.engine.embed_and_score import evaluate_model
    from rankopt.engine.relevance_batches import check_splits
    from rankopt.engine.run_writer import write_evaluation_folder
    from rankopt.files import write_text_atomic
    from rankopt.metrics import ALL_METRICS, check_metrics
    from rankopt.models.fingerprint import model_fingerprint
    from rankopt.runtime import freeze_imports

    freeze_imports()
    if args.split is not None and len(args.split) > 2:
        raise ValueError(f"--split takes one split (self-retrieval) or two (query gallery), got {args.split}")
    # every check that needs no image comes before the model embeds one (evaluate_model checks the label levels)
    metrics = list(ALL_METRICS) if args.metrics == ["all"] else args.metrics
    if metrics is not None:
        check_metrics(metrics, source="--metrics")
    check_output(args.json, "--json", inputs=[args.checkpoint])
    check_output(args.output, "--output", folder=True, inputs=[args.checkpoint])
    if args.graded and not args.multilabels:
        raise ValueError("--graded goes with --multilabels")
    if args.multilabels and args.output:
        raise ValueError("--multilabels writes --json only: the run folder's figures and retrieval.npz (--output) "
                         "mark class-label matches")
    relevance = ("multilabel_graded" if args.graded else "multilabel") if args.multilabels else "none"
    model, cfg, datasets, device, batch_transform = load_from_args(args, args.split)
    if args.multilabels:  # the CSV is read by now, no image decoded yet (building the datasets checks files exist)
        check_splits(datasets, "--multilabels", cfg.data.eval_name or cfg.data.name,
                     cfg.data.eval_root or cfg.data.root)
    if args.similarity:
        cfg.eval.similarity = args.similarity
    post = postprocessing_from_args(args, model_fingerprint(model, inference_preprocessing(cfg)))
    start = time.perf_counter()
    network = runtime_network(args, post.wrap_model(model), inference_preprocessing(cfg) | post.preprocessing(),
                              device)
    result, splits = evaluate_model(network, datasets, cfg.eval, device=device, num_workers=args.num_workers,
                                    show_progress=not args.no_progress, metrics=metrics,
                                    batch_transform=batch_transform,
                                    postprocessing=dataclasses.replace(post, scales=None), relevance=relevance)
    dataset = cfg.data.eval_name or cfg.data.name
    out = {"checkpoint": str(args.checkpoint), "dataset": dataset, "splits": list(datasets),
           "similarity": cfg.eval.similarity, "postprocessing": post.to_dict(),
           **({"relevance": relevance} if args.multilabels else {}), **result.to_dict()}
    print(format_table({"value": dict(result.metrics)},
                       f"{dataset} ({' vs '.join(datasets)}): {result.num_queries} queries, "
                       f"{result.num_queries_without_positive} without a positive (excluded)"))
    if result.by_category:
        print(format_table({name: sub.metrics for name, sub in result.by_category.items()},
                           "per query category (" + ", ".join(f"{name}: {sub.num_queries} queries"
                                                              for name, sub in result.by_category.items()) + ")"))
    if args.json:
        write_text_atomic(args.json, json.dumps(out, indent=2))
        print(f"wrote {args.json}")
    if args.output:
        page = write_evaluation_folder(Path(args.output), checkpoint=str(args.checkpoint),
                                       command="rankopt " + " ".join(sys.argv[1:]), cfg=cfg, model=model,
                                       datasets=datasets, splits=splits, result=result,
                                       seconds=time.perf_counter() - start, postprocessing=post.to_dict())
        print(f"run folder: {args.output}" + (f"; report: {page}" if page else ""))
    return 0

