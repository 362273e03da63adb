"""Change an index folder in place: ``rankopt index-add``, ``index-remove``, ``index-update``.

    rankopt index-add INDEX_DIR (--images DIR | --dataset NAME --root ROOT [--split S]) [--metadata FILE]
    rankopt index-remove INDEX_DIR [--id ID ...] [--path PATH ...]
    rankopt index-update INDEX_DIR        # re-embed changed files, remove vanished ones

Each change holds the folder's writers' lock from loading to saving and saves atomically
(``rankopt.search.storage``): a running ``rankopt serve`` sees the old or the new index. Item ids never
change; new items get new ones. Images are embedded by the index's checkpoint, or ``--checkpoint`` /
``--onnx`` (same fingerprint).
"""

from __future__ import annotations

import argparse
from typing import Any

from rankopt.cli._model import add_index_argument, add_index_model_options, index_embedder
from rankopt.cli.index import add_source_arguments


def register(subparsers: Any) -> None:
    add = subparsers.add_parser(
        "index-add", help="embed images and add them to an index (new ids)",
        description="Embed images (a class tree, or a dataset split) with the index's model and add them to the "
                    "index folder, atomically. A path already indexed is refused (use index-update).")
    add_index_argument(add)
    add_source_arguments(add, "add")
    add_index_model_options(add)
    add.set_defaults(func=run_add)

    remove = subparsers.add_parser(
        "index-remove", help="remove items from an index by id or path",
        description="Remove items from the index folder, atomically; an unknown id or path is an error (nothing "
                    "is removed). Removed ids are never reused.")
    add_index_argument(remove)
    remove.add_argument("--id", dest="ids", action="append", default=[], metavar="ID", help="an item id (repeatable)")
    remove.add_argument("--path", dest="paths", action="append", default=[], metavar="PATH",
                        help="an item's image path (repeatable)")
    remove.set_defaults(func=run_remove)

    update = subparsers.add_parser(
        "index-update", help="re-embed the changed files of an index, remove the vanished ones",
        description="Re-embed every item whose file changed since it was indexed (size or mtime moved and the "
                    "sha256 differs) and remove the items whose file is gone; ids, labels and metadata stay.")
    add_index_argument(update)
    add_index_model_options(update)
    update.set_defaults(func=run_update)


def _done(index: Any, args: argparse.Namespace, change: str) -> int:
    from rankopt.cli.index import summary

    print(change)
    print(f"{args.index} (version {index.info.get('version')}): {summary(index)}")
    return 0


def run_add(args: argparse.Namespace) -> int:
    from rankopt.cli.index import checked_source, write_skipped
    from rankopt.search import Index
    from rankopt.search.storage import index_folder

    images, skipped, found = checked_source(args)
    with Index.editing(args.index) as index:
        before = len(index)
        index.add(images, metadata=args.metadata, model=index_embedder(index, args), **found)
        write_skipped(index_folder(args.index), skipped, replace=False)
    return _done(index, args, f"added {len(index) - before} item(s): ids {index.ids[before]} ... {index.ids[-1]}"
                 if len(index) > before else "added no item")


def run_remove(args: argparse.Namespace) -> int:
    from rankopt.search import Index

    if not args.ids and not args.paths:
        raise ValueError("name the items to remove: --id ID and/or --path PATH")
    with Index.editing(args.index) as index:
        removed = index.remove(ids=args.ids, paths=args.paths)
    return _done(index, args,
                 f"removed {len(removed)} item(s): {', '.join(removed[:10])}{' ...' if len(removed) > 10 else ''}")


def run_update(args: argparse.Namespace) -> int:
    from rankopt.search import Index

    with Index.editing(args.index) as index:
        model = index_embedder(index, args) if index.items.stamps else None
        report = index.update(model=model)
    changed, removed = report["changed"], report["removed"]
    return _done(index, args, f"checked {report['checked']} file(s): re-embedded {len(changed)}"
                 f"{' (' + ', '.join(changed[:10]) + ')' if changed else ''}, removed {len(removed)} vanished"
                 f"{' (' + ', '.join(removed[:10]) + ')' if removed else ''}")
