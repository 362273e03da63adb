"""Landmark retrieval: Revisited Oxford/Paris, Google Landmarks v2 (and its hierarchy), SfM-120k.

- ``revisited_oxford`` / ``revisited_paris``: ``gnd_roxford5k.pkl`` / ``gnd_rparis6k.pkl`` (keys
  ``imlist``, ``qimlist``, ``gnd``) and ``jpg/<name>.jpg``. Queries are cropped to their ``bbx``.
  Relevance is *not* a class label: ``dataset.metadata["ground_truth"]`` (query split) holds the
  per-query ``easy``/``hard``/``junk`` gallery indices (order of ``imlist``) for the Easy/Medium/
  Hard protocols; the label is only the landmark keyword of the file name. Use
  ``on_bad_image="raise"`` (default) so that gallery indices stay valid.
- ``gldv2``: ``train_clean.csv`` (``landmark_id,images``) with ``images/train/a/b/c/<id>.jpg``
  (or ``train/``); query = ``retrieval_solution_v2.1.csv`` rows with ground truth (label = landmark
  of the first ground-truth index image), ``test/a/b/c/<id>.jpg``; gallery =
  ``index_image_to_landmark.csv``, ``index/a/b/c/<id>.jpg``.
- ``h_gldv2``: the same with the SupRank hierarchy ``{train,index}_label_to_subcategory_with_clusters.csv``
  (landmark -> cluster -> overall_cluster); landmarks without a cluster are dropped.
- ``landmarks_clean``: Gordo et al.'s cleaned Landmarks (IJCV'17; the training set of SoftBin-AP,
  ICCV'19 §4.1: 42,410 images of 586 landmarks). The public list ``annotation_clean_train.txt``
  (in the root, ``annotations/`` or ``annotations_landmarks/``, or ``list_file=FILE``) has one
  ``<image> <landmark id>`` line per image; ``<image>`` is the original download URL (the image
  is then ``root/<last component of the URL>``, the name download scripts save it under) or a
  path relative to the root (naver's dirtorch layout).
- ``sfm120k``: ``retrieval-SfM-120k-imagenames-clusterids.mat`` (``cids``, ``cluster``), images
  ``ims/<cid[-2:]>/<cid[-4:-2]>/<cid[-6:-4]>/<cid>``; every image, class = cluster id (training
  only, as ROADMAP; evaluate on Revisited Oxford/Paris).
"""

from __future__ import annotations

import csv
import pickle
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from rankopt.data.base import (
    DatasetSpec, Items, label_file_error, parse_int, read_lines, register_dataset, require_file, split_fields,
)

_NUMPY_PICKLE = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
}


class _GroundTruthUnpickler(pickle.Unpickler):
    """Only builtins and numpy arrays: a ground-truth file never needs more."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _NUMPY_PICKLE:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a ground-truth file")


def load_gnd(path: Path) -> dict[str, Any]:
    with open(require_file(path, "ground-truth file"), "rb") as fh:
        try:
            gnd = _GroundTruthUnpickler(fh).load()
        except (pickle.UnpicklingError, EOFError, ValueError) as err:
            raise ValueError(f"{path}: not a revisitop ground-truth pickle ({err})") from err
    missing = {"imlist", "qimlist", "gnd"} - set(gnd)
    if missing:
        raise ValueError(f"{path}: missing key(s) {sorted(missing)}")
    if len(gnd["gnd"]) != len(gnd["qimlist"]):
        raise ValueError(f"{path}: {len(gnd['gnd'])} ground-truth entries for {len(gnd['qimlist'])} queries")
    return gnd


def _keyword(name: str) -> str:
    """``all_souls_000013`` -> ``all_souls``: the landmark keyword of an Oxford/Paris file name."""
    return name.rsplit("_", 1)[0]


def load_revisited(root: Path, split: str, city: str) -> Items:
    gnd_path = root / f"gnd_{city}.pkl"
    gnd = load_gnd(gnd_path)
    rows, boxes = [], {}
    for i, name in enumerate(gnd["qimlist"]):
        bbx = gnd["gnd"][i].get("bbx")
        if bbx is not None:
            boxes[len(rows)] = tuple(float(v) for v in bbx)
        rows.append((str(root / "jpg" / f"{name}.jpg"), (_keyword(name),), "query", f"{gnd_path}:qimlist[{i}]"))
    rows += [(str(root / "jpg" / f"{n}.jpg"), (_keyword(n),), "gallery", f"{gnd_path}:imlist[{i}]")
             for i, n in enumerate(gnd["imlist"])]
    truth = [{k: np.asarray(v).tolist() for k, v in g.items()} for g in gnd["gnd"]]
    extra = {"query": {"ground_truth": truth, "protocol": "revisitop"}, "gallery": {"names": list(gnd["imlist"])}}
    return Items.from_rows(rows, ("landmark_keyword",), boxes=boxes, extra=extra)


# --------------------------------------------------------------------------- GLDv2
def _gld_path(folder: Path, image_id: str) -> str:
    return str(folder / image_id[0] / image_id[1] / image_id[2] / f"{image_id}.jpg")


def _csv_rows(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    with open(require_file(path), newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh)
        missing = set(columns) - set(reader.fieldnames or ())
        if missing:
            raise label_file_error(path, 1, f"missing column(s) {sorted(missing)} in header {reader.fieldnames}")
        return [(i + 2, row) for i, row in enumerate(reader)]


def _first_existing(*paths: Path) -> Path:
    return next((p for p in paths if p.exists()), paths[0])


def _clusters(path: Path) -> dict[str, tuple[str, str]]:
    """landmark id -> (cluster, overall_cluster), skipping landmarks without a cluster."""
    out = {}
    for _, row in _csv_rows(path, ("landmark_id", "cluster", "overall_cluster")):
        if row["cluster"] not in ("", "nan", "NaN") and row["overall_cluster"] not in ("", "nan", "NaN"):
            out[row["landmark_id"]] = (row["cluster"], row["overall_cluster"])
    return out


def load_gldv2(root: Path, split: str, hierarchy: bool = False) -> Items:
    rows: list[tuple[str, tuple[str, ...], str, str]] = []
    if split == "train":
        listing = _first_existing(root / "train_clean.csv", root / "train" / "train_clean.csv")
        folder = _first_existing(root / "images" / "train", root / "train")
        for line, row in _csv_rows(listing, ("landmark_id", "images")):
            rows += [(_gld_path(folder, i), (row["landmark_id"],), split, f"{listing}:{line}")
                     for i in row["images"].split()]
        cluster_file = root / "train_label_to_subcategory_with_clusters.csv"
    else:
        index_file = root / "index_image_to_landmark.csv"
        landmark_of = {row["id"]: (line,
                                   row["landmark_id"]) for line, row in _csv_rows(index_file, ("id", "landmark_id"))}
        rows += [(_gld_path(root / "index", i), (lm,), "gallery",
                  f"{index_file}:{line}") for i, (line, lm) in landmark_of.items()]
        solution = root / "retrieval_solution_v2.1.csv"
        for line, row in _csv_rows(solution, ("id", "images")):
            if row["images"].strip() in ("", "None"):
                continue
            first = row["images"].split()[0]
            if first not in landmark_of:
                raise label_file_error(solution, line, f"index image {first!r} is not in {index_file.name}")
            rows.append((_gld_path(root / "test", row["id"]), (landmark_of[first][1],), "query", f"{solution}:{line}"))
        cluster_file = root / "index_label_to_subcategory_with_clusters.csv"
    if not hierarchy:
        return Items.from_rows(rows, ("landmark",))
    clusters = _clusters(cluster_file)
    rows = [(p, (lab[0], *clusters[lab[0]]), s, src) for p, lab, s, src in rows if lab[0] in clusters]
    return Items.from_rows(rows, ("landmark", "cluster", "overall_cluster"))


LANDMARKS_CLEAN_LIST = "annotation_clean_train.txt"


def load_landmarks_clean(root: Path, split: str, list_file: str | None = None) -> Items:
    listing = Path(list_file).expanduser() if list_file else _first_existing(
        *(folder / LANDMARKS_CLEAN_LIST for folder in (root, root / "annotations", root / "annotations_landmarks")))
    rows = []
    for line, text in read_lines(listing):
        image, landmark = split_fields(text, 2, listing, line)
        path = root / image.rsplit("/", 1)[-1] if "://" in image else root / image
        rows.append((str(path), (parse_int(landmark, listing, line, "landmark id"),), split, f"{listing}:{line}"))
    return Items.from_rows(rows, ("landmark",))


def load_sfm120k(root: Path, split: str) -> Items:
    from scipy.io import loadmat  # SciPy's MATLAB reader, loaded only for the datasets stored that way

    mat_path = require_file(root / "retrieval-SfM-120k-imagenames-clusterids.mat")
    try:
        mat = loadmat(str(mat_path), squeeze_me=True)
        cids = [str(c) for c in np.atleast_1d(mat["cids"])]
        clusters = np.atleast_1d(mat["cluster"]).astype(np.int64)
    except (KeyError, ValueError, TypeError) as err:
        raise ValueError(f"{mat_path}: expected 'cids' and 'cluster' ({err})") from err
    if len(cids) != len(clusters):
        raise ValueError(f"{mat_path}: {len(cids)} cids but {len(clusters)} cluster ids")
    rows = [
        (str(root / "ims" / c[-2:] / c[-4:-2] / c[-6:-4] / c), (int(k),), split, f"{mat_path}:cids[{i}]")
        for i, (c, k) in enumerate(zip(cids, clusters))
    ]
    return Items.from_rows(rows, ("cluster",))


for _name, _city, _title, _gallery in (("revisited_oxford", "roxford5k", "Oxford", 4993),
                                       ("revisited_paris", "rparis6k", "Paris", 6322)):
    register_dataset(
        DatasetSpec(
            name=_name,
            description=f"Revisited {_title} (Radenovic et al. 2018): 70 cropped queries, Easy/Medium/Hard ground "
                        "truth",
            level_names=("landmark_keyword",),
            splits=("query", "gallery"),
            evaluation_splits=("query", "gallery"),
            native_files=(f"gnd_{_city}.pkl", "jpg/*.jpg"),
            load=partial(load_revisited, city=_city),
            published={"query": {"images": 70}, "gallery": {"images": _gallery}},
        ),
        _city,
    )
_GLD_FILES = ("train_clean.csv", "images/train/a/b/c/*.jpg", "retrieval_solution_v2.1.csv",
              "index_image_to_landmark.csv", "test/", "index/")
register_dataset(
    DatasetSpec(
        name="gldv2",
        description="Google Landmarks v2 (clean train; retrieval test/index)",
        level_names=("landmark",),
        splits=("train", "query", "gallery"),
        evaluation_splits=("query", "gallery"),
        native_files=_GLD_FILES,
        load=load_gldv2,
        published={"train": {"images": 1580470, "landmark": 81313}, "query": {"images": 1129},
                   "gallery": {"images": 761757}},
    )
)
register_dataset(
    DatasetSpec(
        name="h_gldv2",
        description="Hierarchical GLDv2 (SupRank): landmark -> cluster -> overall_cluster; unclustered landmarks "
                    "dropped",
        level_names=("landmark", "cluster", "overall_cluster"),
        splits=("train", "query", "gallery"),
        evaluation_splits=("query", "gallery"),
        native_files=(*_GLD_FILES, "{train,index}_label_to_subcategory_with_clusters.csv"),
        load=partial(load_gldv2, hierarchy=True),
        published={"train": {"images": 970981, "landmark": 46593}},
    )
)
register_dataset(
    DatasetSpec(
        name="landmarks_clean",
        description="Landmarks-clean (Gordo et al. IJCV'17; SoftBin-AP's training set, training only: "
                    "evaluate on revisited_oxford/paris)",
        level_names=("landmark",),
        splits=("train",),
        evaluation_splits=(),
        native_files=(f"{LANDMARKS_CLEAN_LIST} (or annotations/{LANDMARKS_CLEAN_LIST}): '<url or path> <landmark id>' "
                      "lines",
                      "the images, named as the URL's last component or by their listed path"),
        load=load_landmarks_clean,
        published={"train": {"images": 42410, "landmark": 586}},
    )
)
register_dataset(
    DatasetSpec(
        name="sfm120k",
        description="retrieval-SfM-120k (training only: class = 3D-model cluster; evaluate on revisited_oxford/paris)",
        level_names=("cluster",),
        splits=("train",),
        evaluation_splits=(),
        native_files=("retrieval-SfM-120k-imagenames-clusterids.mat", "ims/xx/yy/zz/<cid>"),
        load=load_sfm120k,
    )
)
