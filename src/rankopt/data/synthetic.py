"""The embedded default: a SYNTHETIC, procedurally generated retrieval dataset (no download).

Three-level hierarchy (finest first): *variant* (a shape in one colour and texture) →
*shape* (20) → *family* (4: polygon, round, star, glyph). Each shape has 5 colours ×
4 textures = 20 variants, i.e. 400 fine classes; per shape, 10 variants go to ``train``
and the other 10 to ``test`` (disjoint fine classes: open-set, as in the papers).
Each class has ``images_per_class`` (16) images of ``image_size`` (56) pixels with
nuisance variation: position, scale, rotation, aspect, a random muted background,
clutter strokes in random colours, brightness jitter and pixel noise. So an untrained
network retrieves poorly while training clearly helps.

Generated deterministically from ``seed`` (one RNG per class) into rankopt's cache dir on
first use (a few seconds), as PNG files plus ``manifest.json`` (generator version, seed,
sizes, items). An incomplete or corrupt cache is regenerated.
"""

from __future__ import annotations

import io
import json
import multiprocessing
import os
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageChops, ImageDraw

from rankopt.data.base import DatasetSpec, Items, register_dataset
from rankopt.data.cache import cache_dir

GENERATOR_VERSION = 1
LEVEL_NAMES = ("synthetic_variant", "synthetic_shape", "synthetic_family")
FAMILIES = ("polygon", "round", "star", "glyph")
COLOURS = {
    "red": (215, 40, 40),
    "green": (40, 165, 60),
    "blue": (45, 85, 220),
    "yellow": (230, 200, 40),
    "magenta": (200, 50, 200),
}
TEXTURES = ("solid", "stripes", "dots", "outline")
VARIANTS_PER_SHAPE = len(COLOURS) * len(TEXTURES)
_SUPERSAMPLE = 2


def _ngon(n: int, radius: float = 1.0, phase: float = 0.0, sx: float = 1.0, sy: float = 1.0) -> np.ndarray:
    t = phase + 2 * np.pi * np.arange(n) / n
    return np.stack([sx * radius * np.cos(t), sy * radius * np.sin(t)], axis=1)


def _star(points: int, inner: float) -> np.ndarray:
    outer = _ngon(2 * points, 1.0, -np.pi / 2)
    outer[1::2] *= inner
    return outer


def _poly(*xy: float) -> np.ndarray:
    return np.asarray(xy, dtype=np.float64).reshape(-1, 2)


def _half_disc() -> np.ndarray:
    t = np.linspace(0, np.pi, 25)
    return np.stack([np.cos(t), 0.5 - np.sin(t)], axis=1)


# Each shape: list of (polygon in unit coordinates, filled?) drawn in order; False cuts a hole.
SHAPES: dict[str, tuple[str, list[tuple[np.ndarray, bool]]]] = {
    "triangle": ("polygon", [(_ngon(3, 1.0, -np.pi / 2), True)]),
    "square": ("polygon", [(_ngon(4, 1.0, np.pi / 4), True)]),
    "pentagon": ("polygon", [(_ngon(5, 1.0, -np.pi / 2), True)]),
    "hexagon": ("polygon", [(_ngon(6, 1.0), True)]),
    "rhombus": ("polygon", [(_poly(0, -1, 0.55, 0, 0, 1, -0.55, 0), True)]),
    "disc": ("round", [(_ngon(40), True)]),
    "ellipse": ("round", [(_ngon(40, sx=1.0, sy=0.5), True)]),
    "semicircle": ("round", [(_half_disc(), True)]),
    "ring": ("round", [(_ngon(40), True), (_ngon(40, 0.55), False)]),
    "crescent": ("round", [(_ngon(40), True), (_ngon(40, 0.85) + [0.45, 0.0], False)]),
    "star4": ("star", [(_star(4, 0.38), True)]),
    "star5": ("star", [(_star(5, 0.45), True)]),
    "star6": ("star", [(_star(6, 0.55), True)]),
    "star8": ("star", [(_star(8, 0.6), True)]),
    "plus": ("star", [(_poly(-0.3, -1, 0.3, -1, 0.3, -0.3, 1, -0.3, 1, 0.3, 0.3, 0.3,
                             0.3, 1, -0.3, 1, -0.3, 0.3, -1, 0.3, -1, -0.3, -0.3, -0.3), True)]),
    "arrow": ("glyph", [(_poly(0, -1, 0.8, -0.1, 0.3, -0.1, 0.3, 1, -0.3, 1, -0.3, -0.1, -0.8, -0.1), True)]),
    "tee": ("glyph",
            [(_poly(-0.9, -1, 0.9, -1, 0.9, -0.55, 0.25, -0.55, 0.25, 1, -0.25, 1, -0.25, -0.55, -0.9, -0.55), True)]),
    "chevron": ("glyph", [(_poly(-0.9, -0.2, 0, -1, 0.9, -0.2, 0.9, 0.4, 0, -0.4, -0.9, 0.4), True)]),
    "cup": ("glyph", [(_poly(-0.9, -1, -0.45, -1, -0.45, 0.5, 0.45, 0.5, 0.45, -1, 0.9, -1, 0.9, 1, -0.9, 1), True)]),
    "eich": ("glyph", [(_poly(-0.9, -1, -0.45, -1, -0.45, -0.2, 0.45, -0.2, 0.45, -1, 0.9, -1,
                              0.9, 1, 0.45, 1, 0.45, 0.2, -0.45, 0.2, -0.45, 1, -0.9, 1), True)]),
}
SHAPE_NAMES = tuple(SHAPES)


def class_table(seed: int) -> list[dict[str, Any]]:
    """All 400 fine classes: ids, names, hierarchy and split (10 variants of each shape per split)."""
    rng = np.random.default_rng([seed, 7919])
    table = []
    for s, shape in enumerate(SHAPE_NAMES):
        train_variants = set(rng.permutation(VARIANTS_PER_SHAPE)[: VARIANTS_PER_SHAPE // 2].tolist())
        for v in range(VARIANTS_PER_SHAPE):
            colour, texture = list(COLOURS)[v // len(TEXTURES)], TEXTURES[v % len(TEXTURES)]
            table.append({
                "variant": s * VARIANTS_PER_SHAPE + v,
                "name": f"{colour}_{texture}_{shape}",
                "shape": s,
                "family": FAMILIES.index(SHAPES[shape][0]),
                "colour": colour,
                "texture": texture,
                "split": "train" if v in train_variants else "test",
            })
    return table


def _texture(texture: str, u: np.ndarray, v: np.ndarray, period: float) -> np.ndarray:
    """Shading factor in [0, 1] from shape-frame coordinates (so textures rotate with the shape)."""
    if texture == "stripes":
        return (np.floor(u / period) % 2).astype(np.float32)
    if texture == "dots":
        du, dv = (u % period) - period / 2, (v % period) - period / 2
        return (du**2 + dv**2 > (0.3 * period) ** 2).astype(np.float32)
    return np.ones_like(u, dtype=np.float32)


def render(cls: dict[str, Any], rng: np.random.Generator, size: int) -> np.ndarray:
    """One (size, size, 3) uint8 image of a class with random nuisance parameters."""
    big = size * _SUPERSAMPLE
    bg = rng.uniform(70, 190) + rng.uniform(-25, 25, size=3)
    canvas = Image.new("RGB", (big, big), tuple(int(c) for c in np.clip(bg, 0, 255)))
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(3, 8))):  # clutter strokes
        pts = rng.uniform(0, big, size=(2, 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        draw.line([tuple(p) for p in pts], fill=colour, width=int(rng.integers(1, 3) * _SUPERSAMPLE))
    # Shape mask at supersampled resolution.
    angle = rng.uniform(0, 2 * np.pi)
    radius = rng.uniform(0.24, 0.36) * size
    aspect = rng.uniform(0.85, 1.15)
    centre = size / 2 + rng.uniform(-0.16, 0.16, size=2) * size
    rot = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    mask, edges = Image.new("L", (big, big), 0), Image.new("L", (big, big), 0)
    mdraw, edraw = ImageDraw.Draw(mask), ImageDraw.Draw(edges)
    width = max(2, int(round(0.2 * radius * _SUPERSAMPLE)))
    for poly, filled in SHAPES[SHAPE_NAMES[cls["shape"]]][1]:
        xy = [tuple(p) for p in ((poly * [radius * aspect, radius / aspect]) @ rot.T + centre) * _SUPERSAMPLE]
        mdraw.polygon(xy, fill=255 if filled else 0)
        edraw.polygon(xy, outline=255, width=width)
    if cls["texture"] == "outline":  # inner half of the boundary strokes
        mask = ImageChops.multiply(mask, edges)
    image = np.asarray(canvas.resize((size, size), Image.BOX), dtype=np.float32)
    alpha = np.asarray(mask.resize((size, size), Image.BOX), dtype=np.float32)[..., None] / 255.0
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    u = (xx - centre[0]) * np.cos(angle) + (yy - centre[1]) * np.sin(angle)
    v = -(xx - centre[0]) * np.sin(angle) + (yy - centre[1]) * np.cos(angle)
    shade = 0.4 + 0.6 * _texture(cls["texture"], u, v, period=0.45 * radius)
    colour = np.asarray(COLOURS[cls["colour"]], dtype=np.float32) * rng.uniform(0.85, 1.15)
    image = image * (1 - alpha) + alpha * shade[..., None] * colour
    image += rng.normal(0.0, 8.0, size=image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def _settings(seed: int, images_per_class: int, image_size: int) -> dict[str, Any]:
    return {
        "generator": "rankopt.data.synthetic (SYNTHETIC procedurally generated images)",
        "version": GENERATOR_VERSION,
        "seed": seed,
        "images_per_class": images_per_class,
        "image_size": image_size,
    }


def _generate_class(folder: Path, cls: dict[str, Any], seed: int, images_per_class: int,
                    image_size: int) -> list[list[Any]]:
    """Render and write one class's images (its own RNG, so any process order gives the same files)."""
    rng = np.random.default_rng([seed, cls["variant"]])
    sub = Path(cls["split"]) / f"{cls['variant']:03d}_{cls['name']}"
    (folder / sub).mkdir(parents=True, exist_ok=True)
    items = []
    for k in range(images_per_class):
        rel = sub / f"{k:02d}.png"
        buffer = io.BytesIO()
        Image.fromarray(render(cls, rng, image_size)).save(buffer, format="PNG", compress_level=1)
        (folder / rel).write_bytes(buffer.getvalue())
        items.append([rel.as_posix(), cls["split"], cls["variant"], cls["shape"], cls["family"], buffer.tell()])
    return items


def generate(
    folder: Path, seed: int = 0, images_per_class: int = 16, image_size: int = 56, workers: int | None = None
) -> dict[str, Any]:
    """Write every image as PNG under ``folder`` and return the manifest (also written last).

    Classes are rendered by ``workers`` forked processes (default: the CPU count, at most 4)."""
    table = class_table(seed)
    job = partial(_generate_class, folder, seed=seed, images_per_class=images_per_class, image_size=image_size)
    workers = min(os.cpu_count() or 1, 4) if workers is None else workers
    if workers > 1 and "fork" in multiprocessing.get_all_start_methods():
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            per_class = list(pool.map(job, table, chunksize=10))
    else:
        per_class = [job(cls) for cls in table]
    manifest = {**_settings(seed, images_per_class, image_size), "items": [i for items in per_class for i in items]}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return manifest


def _valid_manifest(folder: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest if the cache matches ``settings`` and every file exists with its size."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if any(manifest.get(k) != v for k, v in settings.items()):
        return None
    expected = len(SHAPE_NAMES) * VARIANTS_PER_SHAPE * settings["images_per_class"]
    items = manifest.get("items", [])
    if len(items) != expected:
        return None
    for rel, *_, nbytes in items:
        try:
            if os.stat(folder / rel).st_size != nbytes:
                return None
        except OSError:
            return None
    return manifest


def ensure_generated(
    root: Path | None = None, seed: int = 0, images_per_class: int = 16, image_size: int = 56
) -> tuple[Path, dict[str, Any]]:
    """The cached copy (generated atomically on first use or when incomplete/corrupt)."""
    if images_per_class < 2 or image_size < 16:
        raise ValueError(f"need images_per_class >= 2 and image_size >= 16, got {images_per_class}, {image_size}")
    settings = _settings(seed, images_per_class, image_size)
    base = root if root is not None else cache_dir("synthetic")
    folder = Path(base) / f"v{GENERATOR_VERSION}_seed{seed}_n{images_per_class}_s{image_size}"
    manifest = _valid_manifest(folder, settings)
    if manifest is not None:
        return folder, manifest
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=folder.name + ".tmp-", dir=folder.parent))
    try:
        manifest = generate(tmp, seed, images_per_class, image_size)
        if folder.exists():
            shutil.rmtree(folder, ignore_errors=True)
        try:
            os.replace(tmp, folder)
        except OSError:  # another process finished first: use its copy if valid
            if _valid_manifest(folder, settings) is None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder, manifest


def load_synthetic(root: Path | None, split: str, seed: int = 0, images_per_class: int = 16,
                   image_size: int = 56) -> Items:
    folder, manifest = ensure_generated(root, seed, images_per_class, image_size)
    rows = [
        (str(folder / rel), (variant, shape, family), item_split, f"{folder / 'manifest.json'}:item {i}")
        for i, (rel, item_split, variant, shape, family, _) in enumerate(manifest["items"])
    ]
    note = {"synthetic": True, "generator_version": GENERATOR_VERSION, "seed": seed, "image_size": image_size,
            "cache": str(folder)}
    return Items.from_rows(rows, LEVEL_NAMES, extra={"train": note, "test": note})


SPEC = register_dataset(
    DatasetSpec(
        name="synthetic",
        description="SYNTHETIC embedded default: procedurally generated shapes (variant -> shape -> family), "
        "made from a seed into rankopt's cache dir; train/test have disjoint variants",
        level_names=LEVEL_NAMES,
        splits=("train", "test"),
        evaluation_splits=("test",),
        native_files=("(none: generated into $RANKOPT_CACHE/synthetic)",),
        load=load_synthetic,
        published={
            "train": {"images": 3200, "synthetic_variant": 200, "synthetic_shape": 20, "synthetic_family": 4},
            "test": {"images": 3200, "synthetic_variant": 200, "synthetic_shape": 20, "synthetic_family": 4},
        },
        needs_root=False,
    )
)
