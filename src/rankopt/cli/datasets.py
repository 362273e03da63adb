"""``rankopt datasets`` (what is supported) and ``rankopt dataset-info NAME --root PATH`` (check a copy)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register(subparsers: argparse._SubParsersAction) -> None:
    listing = subparsers.add_parser("datasets", help="list the supported datasets (levels, splits, native files)")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(func=run_datasets)

    info = subparsers.add_parser(
        "dataset-info", help="check a local copy of a dataset against the published counts"
    )
    info.add_argument("name", help="dataset name (see `rankopt datasets`)")
    info.add_argument("--root", default=None, help="folder with the dataset's native files (not needed for synthetic)")
    info.add_argument("--split", action="append", default=None, help="split(s) to check (default: all)")
    info.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE",
        help="loader option, e.g. subset=vehicle for dyml or test_size=1600 for vehicleid",
    )
    info.add_argument("--verify", action="store_true", help="also open every image to find unreadable files (slow)")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(func=run_dataset_info)


def _parse_options(options: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or not key:
            raise ValueError(f"--option must look like KEY=VALUE, got {option!r}")
        out[key] = int(value) if value.lstrip("-").isdigit() else value
    return out


def run_datasets(args: argparse.Namespace) -> int:
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
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        aliases = f" (alias: {', '.join(row['aliases'])})" if row["aliases"] else ""
        print(f"{row['name']}{aliases}: {row['description']}")
        print(f"  levels (finest first): {', '.join(row['levels'])}")
        print(f"  splits: {', '.join(row['splits'])}; evaluation: {', '.join(row['evaluation_splits'])}")
        print(f"  native files: {', '.join(row['native_files'])}")
    return 0


def dataset_report(name: str, root: str | None, splits: list[str] | None, options: dict[str, Any], verify: bool) -> dict[str, Any]:
    """Counts per split against the published numbers, plus what is missing or unreadable."""
    from rankopt.data import build_dataset, dataset_spec

    spec = dataset_spec(name)
    report: dict[str, Any] = {"dataset": name, "description": spec.description, "root": root, "splits": {}}
    suffix = "".join(f"[{k}={v}]" for k, v in sorted(options.items()))
    for split in splits or list(spec.splits):
        published = spec.published.get(split + suffix, {} if options else spec.published.get(split, {}))
        entry: dict[str, Any] = {"published": published}
        try:
            ds = build_dataset(name, root, split, on_bad_image="skip", verify_images=verify, **options)
        except (FileNotFoundError, NotADirectoryError, ValueError) as err:
            entry.update(ok=False, error=str(err))
        else:
            found = {"images": len(ds), **ds.summary()["classes"]}
            mismatches = {k: {"found": found.get(k), "published": v} for k, v in entry["published"].items() if found.get(k) != v}
            entry.update(
                ok=not mismatches and not ds.metadata["num_bad_images"],
                found=found,
                mismatches=mismatches,
                num_bad_images=ds.metadata["num_bad_images"],
                bad_images=ds.metadata["bad_images"][:20],
            )
        report["splits"][split] = entry
    report["ok"] = all(e["ok"] for e in report["splits"].values())
    return report


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
            print(f"  missing/unreadable: {entry['error']}")
            continue
        for key, value in entry["found"].items():
            published = entry["published"].get(key)
            ref = "" if published is None else f" (published {published}{'' if published == value else ', MISMATCH'})"
            print(f"  {key}: {value}{ref}")
        if entry["num_bad_images"]:
            print(f"  {entry['num_bad_images']} missing or unreadable image(s), e.g.:")
            for line in entry["bad_images"][:5]:
                print(f"    {line}")
    return 0 if report["ok"] else 1
