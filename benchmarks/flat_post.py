"""Post-processing without labels on pretrained features: what ``rankopt fit`` may apply to a flat folder.

    python benchmarks/flat_post.py --caltech $RANKOPT_CALTECH101 --yaleb $RANKOPT_YALEB

A folder with no class folders gives ``fit`` nothing to fine-tune or validate on; the steps that need no labels
(DBA, αQE, PCA whitening fitted on the indexed photos) can still be applied, but only where they are measured
safe. Each step is scored here with the pretrained features (MobileNetV2 at its own centre crop on Caltech-101's
100 categories; the released MobileFaceNet on Extended Yale B's 38 people), in three searches:

* ``new photos``: a third of each class's photos (``bench_fit.closed_set_split``: every third file name; Yale B:
  every third lighting) searched in an index of the rest, as ``rankopt serve`` answers them (DBA over the index,
  αQE on the query, whitening fitted on the indexed photos);
* ``in the folder``: every indexed photo a query among the others (DBA leave-one-out);
* ``one photo a kind``: the same new photos searched in an index holding one photo of each class (the first by
  name), a folder whose kinds are not repeated: a step that averages a photo with its neighbours can only hurt
  there, and a flat folder does not say which kind it is.

mAP@R and R@1 for each; labels are used for scoring only. Writes ``benchmarks/results/flat_post.md``.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fit import LEFT_OUT, closed_set_split, lighting, machine_text, score_query_gallery  # noqa: E402

from rankopt.data.image_folder import IMAGE_SUFFIXES  # noqa: E402
from rankopt.engine.weights import pretrained_checkpoint  # noqa: E402
from rankopt.files import write_text_atomic  # noqa: E402
from rankopt.fit.post import PCA_POWER, score_self_retrieval  # noqa: E402
from rankopt.postprocess import Expansion, PostProcessing, fit_pca_whitening  # noqa: E402
from rankopt.search.embedder import Embedder  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "flat_post.md"
METRICS = ("map@r", "recall@1")
OPTIONS: tuple[tuple[str, str | None, tuple[int, float] | None, tuple[int, float] | None], ...] = (
    ("none", None, None, None),
    ("αQE k=1", None, None, (1, 1.0)),
    ("αQE k=2", None, None, (2, 1.0)),
    ("αQE k=5", None, None, (5, 1.0)),
    ("DBA k=2", None, (2, 1.0), None),
    ("DBA k=5", None, (5, 1.0), None),
    ("DBA k=10, αQE k=10", None, (10, 1.0), (10, 1.0)),
    ("DBA k=2, αQE k=2", None, (2, 1.0), (2, 1.0)),
    ("PCA whitening (shrinkage 0.3)", "pca", None, None),
    ("PCA whitening, DBA k=2, αQE k=2", "pca", (2, 1.0), (2, 1.0)),
)
"""``(name, whitening, DBA (k, α), αQE (k, α))``."""


def photos(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and p.parent.name not in LEFT_OUT)


def steps(option: tuple, indexed: torch.Tensor) -> PostProcessing:
    _, white, dba, qe = option
    whitening = None if white is None else fit_pca_whitening(indexed, power=PCA_POWER, shrinkage=0.3,
                                                             fitted_on="the indexed photos")
    return PostProcessing(None, whitening, None if dba is None else Expansion(*dba),
                          None if qe is None else Expansion(*qe))


def scores(name: str, paths: list[Path], key, checkpoint: Path) -> dict[str, dict[str, dict[str, float]]]:
    indexed, queries = closed_set_split(paths, key)
    names = sorted({p.parent.name for p in paths})
    label = lambda ps: torch.as_tensor([names.index(p.parent.name) for p in ps]).view(-1, 1)
    embedder = Embedder.from_checkpoint(checkpoint, batch_size=64, progress=False)
    print(f"{name}: embedding {len(paths):,} photos", flush=True)
    g, q = (embedder.embed([str(p) for p in ps]).embeddings for ps in (indexed, queries))
    g_y, q_y = label(indexed), label(queries)
    first = np.unique(g_y[:, 0].numpy(), return_index=True)[1]
    out: dict[str, dict[str, dict[str, float]]] = {}
    for option in OPTIONS:
        post = steps(option, g)
        sparse = steps(option, g[first]) if option[1] is None else post  # a whitening needs more than 1 a class
        out[option[0]] = {
            "new photos": score_query_gallery(q, q_y, g, g_y, post, METRICS),
            "in the folder": score_self_retrieval(g, g_y[:, 0].numpy(), post, metrics=METRICS),
            "one photo a kind": score_query_gallery(q, q_y, g[first], g_y[first], sparse, METRICS)}
        print(f"  {option[0]}: " + "; ".join(f"{k} {v['map@r']:.4f}" for k, v in out[option[0]].items()), flush=True)
    return out


def table(name: str, rows: dict[str, dict[str, dict[str, float]]]) -> list[str]:
    searches = list(next(iter(rows.values())))
    lines = [f"## {name}", "", "| steps | " + " | ".join(f"{s}: mAP@R | R@1" for s in searches) + " |",
             "|---|" + "---|---|" * len(searches)]
    base = rows["none"]
    for option, by_search in rows.items():
        cells = []
        for s in searches:
            d = by_search[s]["map@r"] - base[s]["map@r"]
            delta = "" if option == "none" else f" ({d:+.4f})"
            cells.append(f"{by_search[s]['map@r']:.4f}{delta} | {by_search[s]['recall@1']:.4f}")
        lines.append(f"| {option} | " + " | ".join(cells) + " |")
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--caltech", type=Path, required=True, help="101_ObjectCategories")
    parser.add_argument("--yaleb", type=Path, help="CroppedYale (MobileFaceNet in the weights cache)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    measured = {"Caltech-101, MobileNetV2 (ImageNet) at its centre crop":
                scores("caltech", photos(args.caltech), lambda p: p.name, pretrained_checkpoint("mobilenet_v2"))}
    if args.yaleb is not None:
        measured["Extended Yale B, MobileFaceNet (released)"] = scores(
            "yaleb", photos(args.yaleb), lighting, pretrained_checkpoint("mobilefacenet"))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["# Post-processing without labels, on pretrained features (a flat folder's choices)", "",
             f"Generated by `benchmarks/flat_post.py` on {now}; {machine_text()}.", "",
             "    python benchmarks/flat_post.py --caltech $RANKOPT_CALTECH101 --yaleb $RANKOPT_YALEB", "",
             "Searches (module docstring): *new photos* of the folder's kinds against the index of the rest; every "
             "photo *in the folder* against the others; the same new photos against *one photo a kind*. In brackets: "
             "the change in mAP@R against no step.", ""]
    for name, rows in measured.items():
        lines += table(name, rows)
    write_text_atomic(args.results, "\n".join(lines))
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
