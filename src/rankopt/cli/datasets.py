"""``rankopt datasets`` (what is supported) and ``rankopt dataset-info NAME --root PATH`` (check a copy)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml


def register(subparsers: argparse._SubParsersAction) -> None:
    listing = subparsers.add_parser("datasets", help="list the supported datasets (levels, splits, native files)")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.add_argument("--markdown", action="store_true", help="one table (the README's dataset table)")
    listing.set_defaults(func=run_datasets)

    info = subparsers.add_parser(
        "dataset-info", help="check a local copy of a dataset against the published counts"
    )
    info.add_argument("name", help="dataset name (see `rankopt datasets`)")
    info.add_argument("--root", default=None, help="folder with the dataset's native files (not needed for synthetic)")
    info.add_argument("--split", action="append", default=None, help="split(s) to check (default: all)")
    info.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE",
        help="loader option (typed as config overrides), e.g. subset=vehicle for dyml, test_fraction=0.3 for "
             "image_folder",
    )
    info.add_argument("--verify", action="store_true",
                      help="also decode every image (in parallel) to find unreadable files: empty, not an image, "
                           "truncated")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=run_dataset_info)


def _parse_options(options: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key:
            raise ValueError(f"--option must look like KEY=VALUE, got {option!r}")
        out[key] = yaml.safe_load(value)  # typed as config overrides: 3, 0.5, false, [a, b]
    return out


def dataset_rows() -> list[dict[str, Any]]:
    """Every registered dataset (aliases folded in): name, aliases, description, levels, splits, native files."""
    from rankopt.data import DATASETS, dataset_spec

    rows = []
    for name in DATASETS.names():
        spec = dataset_spec(name)
        if spec.name != name:
            continue  # an alias, listed with its dataset
        rows.append({
            "name": name,
            "aliases": [a for a in DATASETS.names() if a != name and dataset_spec(a) is spec],
            "description": spec.description,
            "levels": list(spec.level_names),
            "splits": list(spec.splits),
            "evaluation_splits": list(spec.evaluation_splits),
            "native_files": list(spec.native_files),
        })
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The datasets as one markdown table (the README's, kept equal to it by a test)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| name | dataset | levels (finest first) | evaluation splits | native files |", "|---|---|---|---|---|"]
    for row in rows:
        name = f"`{row['name']}`" + "".join(f" (`{a}`)" for a in row["aliases"])
        files = ", ".join(f"`{f}`" for f in row["native_files"])
        lines.append(f"| {name} | {cell(row['description'])} | {', '.join(row['levels'])} | "
                     f"{', '.join(row['evaluation_splits'])} | {cell(files)} |")
    return "\n".join(lines) + "\n"


def run_datasets(args: argparse.Namespace) -> int:
    rows = dataset_rows()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if args.markdown:
        print(markdown_table(rows), end="")
        return 0
    for row in rows:
        aliases = f" (alias: {', '.join(row['aliases'])})" if row["aliases"] else ""
        print(f"{row['name']}{aliases}: {row['description']}")
        print(f"  levels (finest first): {', '.join(row['levels'])}")
        print(f"  splits: {', '.join(row['splits'])}; evaluation: {', '.join(row['evaluation_splits'])}")
        print(f"  native files: {', '.join(row['native_files'])}")
    return 0


def _unique(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))


def _unanswerable_classes(query: Any, gallery: Any | None) -> int:
    """Finest classes of an evaluation split whose queries have no other image of their class to
    retrieve: a single image (self-retrieval), or none in the gallery besides the query's own copy."""
    import numpy as np

    classes, counts = np.unique(query.labels[:, 0], return_counts=True)
    if gallery is None:
        return int((counts == 1).sum())
    in_gallery = dict(zip(*np.unique(gallery.labels[:, 0], return_counts=True)))
    own = 1 if query.metadata.get("gallery_contains_queries") else 0
    return int(sum(in_gallery.get(c, 0) - own < 1 for c in classes))


def dataset_report(name: str, root: str | None, splits: list[str] | None, options: dict[str, Any],
                   verify: bool) -> dict[str, Any]:
    """Counts per split against the published numbers, every problem found (missing or unreadable
    images, problems of a user's folder or CSV), notes, and the classes that cannot be queries."""
    from rankopt.data import DatasetProblems, build_dataset, dataset_spec

    spec = dataset_spec(name)
    report: dict[str, Any] = {"dataset": name, "description": spec.description, "root": root, "splits": {},
                              "problems": [], "notes": []}
    try:
        all_splits, evaluation = spec.splits_of(root, **options)
    except (FileNotFoundError, NotADirectoryError, ValueError):
        all_splits, evaluation = spec.splits, spec.evaluation_splits  # the builds below report the error
    suffix = "".join(f"[{k}={v}]" for k, v in sorted(options.items()))
    built = {}
    for split in splits or [s for s in all_splits if s != "all"]:  # "all" is the union of the others
        published = spec.published.get(split + suffix, {} if options else spec.published.get(split, {}))
        entry: dict[str, Any] = {"published": published}
        try:
            check = "decode" if verify else False
            try:
                ds = build_dataset(name, root, split, on_bad_image="skip", verify_images=check, **options)
            except DatasetProblems:  # a user's folder or table: count and check what is usable anyway
                ds = build_dataset(name, root, split, on_bad_image="skip", verify_images=check, keep_going=True,
                                   **options)
        except DatasetProblems as err:
            entry.update(ok=False, error=f"{len(err.problems)} problem(s), listed below")
            report["problems"] += err.problems
            report["notes"] += err.notes
        except (FileNotFoundError, NotADirectoryError, ValueError) as err:
            entry.update(ok=False, error=str(err))
        else:
            built[split] = ds
            found = {"images": len(ds), **ds.summary()["classes"]}
            mismatches = {k: {"found": found.get(k), "published": v} for k, v in entry["published"].items()
                          if found.get(k) != v}
            entry.update(
                ok=not mismatches and not ds.metadata["num_bad_images"] and not ds.metadata.get("problems"),
                found=found,
                mismatches=mismatches,
                num_bad_images=ds.metadata["num_bad_images"],
                bad_images=ds.metadata["bad_images"][:20],
            )
            report["problems"] += ds.metadata.get("problems", [])
            report["problems"] += [f"[{split}] {line}" for line in ds.metadata["bad_images"]]
            report["notes"] += ds.metadata.get("notes", [])
        report["splits"][split] = entry
    query = evaluation[0] if evaluation else None
    if query in built and (len(evaluation) == 1 or evaluation[1] in built):
        count = _unanswerable_classes(built[query], built[evaluation[1]] if len(evaluation) == 2 else None)
        report["splits"][query]["classes_without_positive"] = count
        if count:
            why = "a single image" if len(evaluation) == 1 else "no other image of their class in the gallery"
            report["notes"].append(f"[{query}] {count} class(es) have {why}: their images cannot be queries "
                                   "(nothing to find; counted as queries without positive)")
    report["problems"], report["notes"] = _unique(report["problems"]), _unique(report["notes"])
    report["ok"] = all(e["ok"] for e in report["splits"].values()) and not report["problems"]
    return report


SHOWN_PROBLEMS = 50


def run_dataset_info(args: argparse.Namespace) -> int:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = dataset_report(args.name, args.root, args.split, _parse_options(args.option), args.verify)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0 if report["ok"] else 1
    print(f"{report['dataset']}: {report['description']}")
    print(f"root: {report['root']}")
    for split, entry in report["splits"].items():
        status = "OK" if entry["ok"] else "PROBLEM"
        print(f"[{split}] {status}")
        if "error" in entry:
            print(f"  {entry['error']}")
            continue
        for key, value in entry["found"].items():
            published = entry["published"].get(key)
            ref = "" if published is None else f" (published {published}{'' if published == value else ', MISMATCH'})"
            print(f"  {key}: {value}{ref}")
        if entry["num_bad_images"]:
            print(f"  {entry['num_bad_images']} missing or unreadable image(s), e.g.:")
            for line in entry["bad_images"][:5]:
                print(f"    {line}")
    problems = report["problems"]
    if problems:
        print(f"problems ({len(problems)}):")
        for line in problems[:SHOWN_PROBLEMS]:
            print(f"  {line}")
        if len(problems) > SHOWN_PROBLEMS:
            print(f"  ... and {len(problems) - SHOWN_PROBLEMS} more (--json lists them all)")
    for line in report["notes"]:
        print(f"note: {line}")
    return 0 if report["ok"] else 1
