"""How far apart the difference hashes of copies and of distinct photos are: the bound ``NEAR_BITS`` of
:mod:`rankopt.data.near_duplicates`, and how many photos of real folders it groups.

    python benchmarks/near_duplicates.py --caltech $RANKOPT_CALTECH101 --yaleb $RANKOPT_YALEB

For every photo of each folder: its hash (through the decode check, as ``rankopt fit`` gets it), the distance to
the nearest other photo of its class (distinct photos: Caltech-101 holds a few true copies, found here), and for a
sample of photos the distance to copies made of it (resized to half and to double, re-encoded as JPEG at quality
60, cropped by 3 % of each side, brightened by 10 %). ``--side 8`` measures the usual 64-bit hash instead (its
table beside: ``--results``). Writes ``benchmarks/results/near_duplicates.md``.
"""

from __future__ import annotations

import argparse
import datetime
import io
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageEnhance

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_fit import LEFT_OUT, machine_text  # noqa: E402

from rankopt.data import image_files  # noqa: E402
from rankopt.data.image_files import difference_hash, hash_distance, load_image, undecodable  # noqa: E402
from rankopt.data.image_folder import IMAGE_SUFFIXES  # noqa: E402
from rankopt.data.near_duplicates import NEAR_BITS, duplicate_groups, grouped_count, hamming, photo_hashes  # noqa: E402
from rankopt.files import write_text_atomic  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "near_duplicates.md"
SAMPLE = 500
FRACTIONS = (0, 1, 2, 3, 4, 6, 8)
"""Bounds as 64ths of the hash's bits."""


def jpeg(img: Image.Image, quality: int) -> Image.Image:
    buffer = io.BytesIO()
    img.convert("RGB").save(buffer, format="JPEG", quality=quality)
    return Image.open(io.BytesIO(buffer.getvalue()))


COPIES = {
    "resized to half": lambda im: im.resize((max(1, im.width // 2), max(1, im.height // 2)), Image.BILINEAR),
    "resized to double": lambda im: im.resize((im.width * 2, im.height * 2), Image.BICUBIC),
    "JPEG quality 60": lambda im: jpeg(im, 60),
    "cropped 3 % a side": lambda im: im.crop((round(0.03 * im.width), round(0.03 * im.height),
                                              round(0.97 * im.width), round(0.97 * im.height))),
    "brightened 10 %": lambda im: ImageEnhance.Brightness(im.convert("RGB")).enhance(1.1),
}


def folder(name: str, root: Path) -> list[str]:
    paths = sorted(str(p) for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and
                   p.parent.name not in LEFT_OUT)
    began = time.monotonic()
    bad = undecodable(paths)  # the decode check, as fit runs it: the hashes are remembered there
    check_s = time.monotonic() - began
    hashes = photo_hashes(paths)
    labels = np.unique([Path(p).parent.name for p in paths], return_inverse=True)[1]
    bits = image_files.HASH_SIDE ** 2
    bounds, near_bits = [f * bits // 64 for f in FRACTIONS], NEAR_BITS * bits // 256
    nearest = np.full(len(paths), bits)
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        d = hamming(hashes[members], hashes[members])
        np.fill_diagonal(d, bits)
        nearest[members] = d.min(axis=1)
    groups = duplicate_groups(hashes, labels, near_bits)
    rng = np.random.default_rng(0)
    sample = rng.choice(len(paths), min(SAMPLE, len(paths)), replace=False)
    copies: dict[str, list[int]] = {k: [] for k in COPIES}
    for i in sample:
        img = load_image(paths[i])
        base = difference_hash(img)
        for kind, make in COPIES.items():
            copies[kind].append(hash_distance(base, difference_hash(make(img))))
    lines = [f"## {name}: {len(paths):,} photos in {labels.max() + 1} classes", "",
             f"Decode check with hashes: {check_s:.1f} s ({len(bad)} unreadable). At {near_bits} of {bits} bits "
             "(`NEAR_BITS`, scaled to the hash): "
             f"{grouped_count(groups)} photos in groups of near-duplicates.", "",
             "| bits at most | " + " | ".join(str(b) for b in bounds) + " |",
             "|---|" + "---|" * len(bounds),
             "| distinct photos of a class: nearest other within (share of photos) | " +
             " | ".join(f"{(nearest <= b).mean():.2%}" for b in bounds) + " |"]
    for kind, values in copies.items():
        v = np.array(values)
        lines.append(f"| copy, {kind} (share of {len(v)}) | " + " | ".join(f"{(v <= b).mean():.1%}" for b in bounds)
                     + " |")
    print("\n".join(lines), flush=True)
    return lines + [""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--caltech", type=Path, required=True, help="101_ObjectCategories")
    parser.add_argument("--yaleb", type=Path, help="CroppedYale")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--side", type=int, default=image_files.HASH_SIDE, help="the hash's side (bits: its square)")
    args = parser.parse_args()
    image_files.HASH_SIDE = args.side
    lines = folder("Caltech-101", args.caltech)
    if args.yaleb is not None:
        lines += folder("Extended Yale B", args.yaleb)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    side = image_files.HASH_SIDE
    head = [f"# Difference hashes ({side}x{side}) of copies and of distinct photos", "",
            f"Generated by `benchmarks/near_duplicates.py` on {now}; {machine_text()}.", "",
            "    python benchmarks/near_duplicates.py --caltech $RANKOPT_CALTECH101 --yaleb $RANKOPT_YALEB "
            f"--side {side}",
            "",
            f"Each cell: the share whose hash differs from the photo's in at most that many of {side ** 2} bits. A "
            "bound should hold every copy and few distinct photos.", ""]
    write_text_atomic(args.results, "\n".join(head + lines))
    print(f"wrote {args.results}")


if __name__ == "__main__":
    main()
