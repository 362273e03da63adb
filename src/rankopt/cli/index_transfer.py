"""Embeddings + metadata of an index as Parquet, and back (``rankopt.search.parquet``; needs pyarrow).

    rankopt index-export INDEX_DIR (--parquet OUT.parquet | --clip-layout OUT_DIR)
    rankopt index-import (FILE.parquet | CLIP_DIR) --out INDEX_DIR [--fingerprint F] [--faiss SPEC]

``--clip-layout`` writes clip-retrieval's ``img_emb/img_emb_N.npy`` + ``metadata/metadata_N.parquet``, which
autofaiss reads (``autofaiss build_index --embeddings=OUT_DIR/img_emb``). The fingerprint, labels, ids and
threshold travel in the Parquet schema metadata; someone else's clip-retrieval output needs ``--fingerprint``.
"""

from __future__ import annotations

import argparse
from typing import Any

from rankopt.cli._model import add_index_argument


def register(subparsers: Any) -> None:
    export = subparsers.add_parser(
        "index-export", help="write an index's embeddings and metadata as Parquet",
        description="Write the embeddings, ids, paths, labels and metadata of an index as one Parquet table or in "
                    "clip-retrieval's layout (img_emb/*.npy + metadata/*.parquet: autofaiss reads it).")
    add_index_argument(export)
    target = export.add_mutually_exclusive_group(required=True)
    target.add_argument("--parquet", metavar="OUT.parquet", help="one table; the embedding a fixed-size list column")
    target.add_argument("--clip-layout", metavar="OUT_DIR", help="clip-retrieval's folders (OUT_DIR absent or empty)")
    export.set_defaults(func=run_export)

    imported = subparsers.add_parser(
        "index-import", help="make an index folder from a Parquet export",
        description="Make an index folder from a Parquet file or clip-retrieval folder (rankopt index-export, or "
                    "clip-retrieval with --fingerprint).")
    imported.add_argument("source", metavar="FILE_OR_DIR", help="a .parquet file or a clip-retrieval folder")
    imported.add_argument("--out", required=True, metavar="INDEX_DIR",
                          help="index folder to write (replaced atomically)")
    imported.add_argument("--fingerprint", metavar="F",
                          help="the model fingerprint of embeddings rankopt did not export")
    imported.add_argument("--faiss", metavar="SPEC", help="faiss factory string (default: exact search)")
    imported.add_argument("--faiss-params", metavar="P", help="faiss search parameters, e.g. nprobe=32")
    imported.set_defaults(func=run_import)


def run_export(args: argparse.Namespace) -> int:
    from rankopt.search import Index
    from rankopt.search.parquet import export_clip_layout, export_parquet

    index = Index.load(args.index)
    out = export_parquet(index, args.parquet) if args.parquet else export_clip_layout(index, args.clip_layout)
    print(f"wrote {out}: {len(index)} items, {index.dim}-d, fingerprint {index.fingerprint}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    from rankopt.cli.index import summary
    from rankopt.search.parquet import import_index
    from rankopt.search.storage import check_target

    check_target(args.out)
    index = import_index(args.source, fingerprint=args.fingerprint, faiss=args.faiss, faiss_params=args.faiss_params)
    folder = index.save(args.out)
    print(summary(index))
    print(f"saved {folder}")
    return 0
