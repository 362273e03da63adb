"""``rankopt calibrate (INDEX_DIR | CHECKPOINT) (--dataset NAME [--root ROOT] [--split S] | --images DIR) --fmr F``.

Embeds a labelled split (with the index's model and embedding pipeline, or the checkpoint's), scores
every pair, and picks the similarity threshold of the target false-match rate
(``rankopt.search.threshold``: the lowest threshold whose FMR does not exceed the target). Prints the
FNMR@FMR table; stores the threshold in the index (INDEX_DIR, or ``--index DIR`` with a checkpoint of
the same fingerprint), where ``rankopt search`` and ``rankopt serve`` then mark results scoring below it
as no match (``"match": false``). ``--out DIR`` writes ``calibration.json`` (threshold and table) and
``fnmr_fmr.png`` (the FNMR-vs-FMR curve). Use identities (classes) that are not in the gallery, as the
open-set queries will be.
"""

from __future__ import annotations

import argparse
from typing import Any

from rankopt.cli.index import add_source_arguments
from rankopt.cli._model import add_index_model_options, index_embedder
from rankopt.cli._outputs import check_output


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="pick an open-set match threshold at a target false-match rate",
        description="Score all pairs of a labelled split and store in the index the similarity threshold whose "
                    "false-match rate does not exceed --fmr; search and serve then mark results below it as no match.")
    parser.add_argument("model_or_index", metavar="INDEX_DIR|CHECKPOINT",
                        help="an index folder (its model and embedding pipeline) or a rankopt checkpoint")
    add_source_arguments(parser, "calibrate on", metadata=False)
    parser.add_argument("--fmr", type=float, required=True, metavar="F", help="target false match rate, e.g. 1e-3")
    parser.add_argument("--index", metavar="INDEX_DIR", help="with a CHECKPOINT: the index to store the threshold in")
    parser.add_argument("--out", metavar="DIR", help="write calibration.json and fnmr_fmr.png there")
    add_index_model_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from rankopt.cli.index import checked_source
    from rankopt.files import write_text_atomic
    from rankopt.search import Index
    from rankopt.search.storage import INDEX_JSON
    from rankopt.search.threshold import calibrate, format_table

    given = Path(args.model_or_index)
    if (given / INDEX_JSON).is_file():
        if args.index is not None:
            raise ValueError("--index goes with a CHECKPOINT; the threshold is stored in the index given")
        args.index = str(given)
    else:
        if args.checkpoint is not None or args.onnx is not None:
            raise ValueError("the model is the CHECKPOINT argument; --checkpoint/--onnx go with an INDEX_DIR")
        args.checkpoint = str(given)
    check_output(args.out, "--out", folder=True, inputs=[args.model_or_index, args.index])  # before any embedding
    index = Index.load(args.index) if args.index is not None else None
    embedder = index_embedder(index, args)  # with an index: its embedding pipeline, its model's fingerprint
    images, skipped, found = checked_source(args)
    dataset, split = embedder.embed_images(images, desc="embedding the calibration split", **found)
    if skipped:
        print(f"left out {len(skipped)} unreadable image(s), the first: {skipped[0]} (--strict: refuse instead)")
    source = {"dataset": args.dataset or str(Path(args.images).resolve()), "split": args.split or dataset.split,
              "items": len(split.paths), "fingerprint": embedder.fingerprint}
    result = calibrate(split.embeddings, split.labels, args.fmr, similarity=index.similarity if index else "cosine",
                       source=source)
    chosen = result.threshold
    print(format_table(result))
    print(f"threshold {chosen['value']:.6f} at FMR {args.fmr:g}: achieved FMR {chosen['achieved_fmr']:.3e}, FNMR "
          f"{chosen['fnmr']:.4f} ({chosen['genuine_pairs']} genuine, {chosen['impostor_pairs']} impostor pairs)")
    if index is not None:
        with Index.editing(args.index) as stored:
            stored.set_threshold(chosen)
        print(f"stored in {args.index} (version {stored.info['version']})")
    if args.out:
        from rankopt.viz import plot_fnmr_fmr

        out = Path(args.out)
        write_text_atomic(out / "calibration.json", json.dumps({"threshold": chosen, "table": result.table}, indent=2))
        figure = plot_fnmr_fmr(*result.curve, out / "fnmr_fmr.png", target=args.fmr, chosen_fmr=chosen["achieved_fmr"],
                               chosen_fnmr=chosen["fnmr"], threshold=chosen["value"],
                               pairs=(chosen["genuine_pairs"], chosen["impostor_pairs"]), title_note=source["dataset"])
        print(f"wrote {out / 'calibration.json'} and {figure}")
    return 0
