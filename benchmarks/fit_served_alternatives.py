"""Which of a finished fit's pipelines would have been best on the test split, and which each serving rule picks.

    python benchmarks/fit_served_alternatives.py --dataset yaleb --root $RANKOPT_YALEB \
        --runs /tmp/rankopt-fit-bench/yaleb-s0 /tmp/rankopt-fit-bench/yaleb-s1 /tmp/rankopt-fit-bench/yaleb-s2

For each run folder of ``benchmarks/bench_fit.py``'s open-set rows (``yaleb``: the fit saw the training people;
``held-out``: ``--dataset caltech101``, the training categories), every pipeline of ``fit.json`` built on the
served model state is scored on the test split as ``bench_fit.py`` scores the served one: the served model
(``RUN/model.ckpt``) embeds the training and the test split, the pipeline's whitening is fitted again on the
training split and its DBA and αQE are applied, each test item a query among the others. (Pipelines of another
model state need that state's retrained model, which the run does not keep: they are left out.) The table puts
the validation scores beside the test score, and marks what the rule of the run's code served and what the rule of
the current code (:func:`rankopt.fit.validation.choose_served`, recomputed from ``fit.json``'s validation scores)
serves. Writes ``benchmarks/results/fit_served_alternatives.md`` (``--results``: another table).
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import numpy as np

from rankopt.data import build_dataset
from rankopt.data.transforms import build_transform
from rankopt.describe import machine_info
from rankopt.engine.assembly import model_from_checkpoint
from rankopt.engine.embed_and_score import embed_dataset
from rankopt.fit.post import WhiteningChoice, score_self_retrieval
from rankopt.fit.validation import Pipeline, Scores, choose_served
from rankopt.postprocess import Expansion, PostProcessing
from rankopt.runtime import keep_allocations

RESULTS = Path(__file__).resolve().parent / "results" / "fit_served_alternatives.md"


def pipelines_of(record: dict) -> list[Pipeline]:
    """``fit.json``'s pipelines as :class:`Pipeline` objects (their validation scores per protocol)."""
    return [Pipeline(p["model"], p["steps_for"], {name: Scores(s["metrics"], s["by_class"])
                                                    for name, s in p["scores"].items()}) for p in record["pipelines"]]


def post_of(chosen: dict | None, train_x, train_y: np.ndarray, where: str) -> PostProcessing:
    """A pipeline's post-processing (``PostChoice.to_dict()``), its whitening fitted on the training split."""
    if chosen is None:
        return PostProcessing()
    whitening = None if chosen["whitening"] is None else WhiteningChoice(**chosen["whitening"]).fit(train_x, train_y,
                                                                                                    where)
    expansions = (None if chosen[k] is None else Expansion(**chosen[k]) for k in ("dba", "qe"))
    return PostProcessing(None, whitening, *expansions)


def run_rows(run: Path, dataset: str, root: Path) -> list[list[str]]:
    record = json.loads((run / "fit.json").read_text())
    served_name = record["chosen"]["served_name"]
    pipelines = pipelines_of(record)
    state = next(p.model for p in pipelines if p.name == served_name)
    now, _ = choose_served(pipelines, record["queries"], record["validation"]["protocols"])
    model, cfg = model_from_checkpoint(run / "model.ckpt")
    transform = build_transform(cfg.data.test_transform, cfg.data.image_size)
    splits = {}
    for split in ("train", "test"):
        data = build_dataset(dataset, root, split, transform=transform)
        splits[split] = (embed_dataset(model, data, batch_size=32, show_progress=False).embeddings,
                         np.asarray(data.labels)[:, 0])
    rows = []
    for raw, pipeline in zip(record["pipelines"], pipelines):
        if pipeline.model != state:
            continue
        post = post_of(raw["post"], *splits["train"], f"{dataset} train")
        test = score_self_retrieval(post.whiten(splits["test"][0]), splits["test"][1],
                                    PostProcessing(None, None, post.dba, post.qe), metrics=("map@r",))
        marks = " ".join(m for m, on in (("served then", pipeline.name == served_name),
                                         ("served now", pipeline.name == now.name)) if on)
        rows.append([run.name, pipeline.name, *(f"{pipeline.scores[p].value:.4f}" for p in ("known", "new")),
                     f"{test['map@r']:.4f}", marks])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", required=True, choices=("yaleb", "caltech101"))
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--runs", required=True, nargs="+", type=Path)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    keep_allocations()
    rows = [row for run in args.runs for row in run_rows(run, args.dataset, args.root)]
    info = machine_info("cpu")
    lines = ["# A fit's pipelines on the test split, and which one each serving rule picks", "",
             f"Generated by `benchmarks/fit_served_alternatives.py` on "
             f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC ({info['cpu_count']} CPU cores, "
             f"torch {info['torch']}); runs of `benchmarks/bench_fit.py`:", "",
             f"    python benchmarks/fit_served_alternatives.py --dataset {args.dataset} --root ROOT --runs "
             + " ".join(f"OUT/{r.name}" for r in args.runs), "",
             "Validation: mAP@R on the fit's own kept-back photos (known) and held-out classes (new); test: mAP@R on "
             "the test split, each item a query among the others.", "",
             "| run | pipeline (served model state) | validation known | validation new | test | |",
             "|---|---|---|---|---|---|",
             *("| " + " | ".join(row) + " |" for row in rows)]
    args.results.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
