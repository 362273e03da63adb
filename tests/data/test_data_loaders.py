"""Every loader on a tiny fake copy of its dataset in the exact native layout (generated images,
real file names and headers): parsing, splits, hierarchy and label remapping."""

from __future__ import annotations

import json
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from PIL import Image

from rankopt.data import BadImageError, LabelFileError, build_dataset, evaluation_splits


def img(path: Path, size: tuple[int, int] = (12, 9), colour: tuple[int, int, int] = (200, 10, 10)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path, format=None if path.suffix else "JPEG")
    return path


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def assert_remapped(labels: np.ndarray, raw: list[tuple]) -> None:
    """Reference remapping: each level's sorted distinct raw values -> 0..K-1."""
    for level in range(labels.shape[1]):
        values = [r[level] for r in raw]
        order = {v: i for i, v in enumerate(sorted(set(values)))}
        assert labels[:, level].tolist() == [order[v] for v in values]


# ----------------------------------------------------------------------------- CUB
def make_cub(root: Path) -> list[tuple[str, int]]:
    entries = []
    for cls in (1, 2, 100, 101, 150, 200):
        for k in range(2):
            rel = f"{cls:03d}.Bird_{cls}/Bird_{cls}_{k:04d}_{cls * 7 + k}.jpg"
            img(root / "images" / rel)
            entries.append((rel, cls))
    write(root / "images.txt", "".join(f"{i + 1} {rel}\n" for i, (rel, _) in enumerate(entries)))
    write(root / "image_class_labels.txt", "".join(f"{i + 1} {c}\n" for i, (_, c) in enumerate(entries)))
    return entries


def test_cub(tmp_path):
    entries = make_cub(tmp_path)
    before = snapshot(tmp_path)
    train = build_dataset("cub200", tmp_path, "train")
    test = build_dataset("cub200", tmp_path, "test")
    assert [Path(p).relative_to(tmp_path / "images").as_posix() for p in train.paths] == [r for r, c in entries if c <= 100]
    assert_remapped(train.labels, [(c,) for _, c in entries if c <= 100])
    assert_remapped(test.labels, [(c,) for _, c in entries if c > 100])
    assert test.sources[0].endswith("images.txt:7")
    assert train.level_names == ("species",) and evaluation_splits("cub200") == ("test",)
    # ImageFolder fallback gives the same dataset
    (tmp_path / "images.txt").unlink()
    assert build_dataset("cub", tmp_path, "test").labels.tolist() == test.labels.tolist()
    assert snapshot(tmp_path) == before - {"images.txt"}  # nothing written into the dataset folder


def test_cub_malformed_line(tmp_path):
    make_cub(tmp_path)
    write(tmp_path / "images.txt", "1 001.Bird_1/Bird_1_0000_7.jpg\n2 oops extra fields\n")
    with pytest.raises(LabelFileError, match=r"images.txt:2"):
        build_dataset("cub200", tmp_path, "train")


# ----------------------------------------------------------------------------- Cars196
def test_cars(tmp_path):
    classes = [1, 98, 99, 196, 5, 150]
    dtype = [("relative_im_path", "O"), ("bbox_x1", "O"), ("bbox_y1", "O"), ("bbox_x2", "O"), ("bbox_y2", "O"), ("class", "O"), ("test", "O")]
    annos = np.zeros(len(classes), dtype=dtype)
    for i, c in enumerate(classes):
        rel = f"car_ims/{i + 1:06d}.jpg"
        img(tmp_path / rel)
        annos[i] = (rel, 1, 2, 10, 8, c, i % 2)
    names = np.array([f"Make Model {i}" for i in range(196)], dtype=object)
    scipy.io.savemat(tmp_path / "cars_annos.mat", {"annotations": annos.reshape(1, -1), "class_names": names.reshape(1, -1)})
    train = build_dataset("cars196", tmp_path, "train")
    test = build_dataset("cars196", tmp_path, "test")
    assert [Path(p).name for p in train.paths] == ["000001.jpg", "000002.jpg", "000005.jpg"]
    assert_remapped(train.labels, [(1,), (98,), (5,)])
    assert_remapped(test.labels, [(99,), (196,), (150,)])


# ----------------------------------------------------------------------------- SOP
def test_sop(sop_root):
    tmp_path, entries = sop_root
    ds = build_dataset("sop", tmp_path, "train")
    assert ds.level_names == ("product", "category")
    assert_remapped(ds.labels, [(c, s) for c, s, _ in entries])
    assert ds.paths[3] == str(tmp_path / "toaster_final/9_0.JPG")
    assert ds.sources[0].endswith("Ebay_train.txt:2")


def test_sop_bad_header_and_fields(sop_root):
    tmp_path, _ = sop_root
    text = (tmp_path / "Ebay_train.txt").read_text()
    write(tmp_path / "Ebay_train.txt", text.replace("image_id class_id", "id class"))
    with pytest.raises(LabelFileError, match=r"Ebay_train.txt:1: expected the header"):
        build_dataset("sop", tmp_path, "train")
    write(tmp_path / "Ebay_train.txt", text.replace("4 3 12", "4 x 12"))
    with pytest.raises(LabelFileError, match=r"Ebay_train.txt:5: class_id 'x'"):
        build_dataset("sop", tmp_path, "train")


def test_missing_image_names_file_and_line_and_skip_policy(sop_root):
    tmp_path, _ = sop_root
    (tmp_path / "bicycle_final/121_0.JPG").unlink()
    (tmp_path / "toaster_final/9_1.JPG").write_bytes(b"not an image")
    with pytest.raises(BadImageError, match=r"121_0.JPG.*Ebay_train.txt:4"):
        build_dataset("sop", tmp_path, "train")
    with pytest.warns(UserWarning, match="skipped 2"):
        ds = build_dataset("sop", tmp_path, "train", on_bad_image="skip")
    assert ds.metadata["num_bad_images"] == 2 and len(ds) == 3
    assert ds.labels.tolist() == [[0, 0], [0, 0], [1, 1]]  # remapped after skipping
    # a file that passes the existence check but fails to decode names its line too
    with pytest.warns(UserWarning, match="skipped 1"):
        raw = build_dataset("sop", tmp_path, "train", on_bad_image="skip", verify_images=False)
    bad = raw.paths.index(str(tmp_path / "toaster_final/9_1.JPG"))
    with pytest.raises(BadImageError, match=r"9_1.JPG.*Ebay_train.txt:6"):
        raw[bad]


def test_missing_root_and_unknown_names(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_dataset("sop", tmp_path / "nope", "train")
    with pytest.raises(FileNotFoundError, match="Ebay_test.txt"):
        build_dataset("sop", tmp_path, "test")
    with pytest.raises(KeyError, match="unknown dataset"):
        build_dataset("imagenet", tmp_path, "train")
    with pytest.raises(ValueError, match="no split 'query'"):
        build_dataset("sop", tmp_path, "query")
    with pytest.raises(ValueError, match="on_bad_image"):
        build_dataset("sop", tmp_path, "train", on_bad_image="ignore")


# ----------------------------------------------------------------------------- iNaturalist
INAT = [("Plantae", 7477, "a.jpg"), ("Plantae", 7477, "b.jpg"), ("Plantae", 12, "c.jpg"), ("Aves", 3, "d.jpg")]
TAXA = {
    7477: ("Plantae", "Tracheophyta", "Magnoliopsida", "Asterales", "Asteraceae", "Aster"),
    12: ("Plantae", "Tracheophyta", "Magnoliopsida", "Asterales", "Asteraceae", "Bellis"),
    3: ("Animalia", "Chordata", "Aves", "Passeriformes", "Corvidae", "Corvus"),
}


def make_inat(root: Path) -> None:
    rels = [f"train_val2018/{s}/{c}/{f}" for s, c, f in INAT]
    for rel in rels:
        img(root / rel)
    write(root / "Inat_dataset_splits/Inaturalist_train_set1.txt", "\n".join(rels) + "\n")
    cats = [dict(zip(("kingdom", "phylum", "class", "order", "family", "genus"), t), id=i, name=f"{t[-1]} sp", supercategory="x")
            for i, t in TAXA.items()]
    write(root / "train2018.json", json.dumps({"images": [], "annotations": [], "categories": cats}))


def test_inaturalist_base_and_full(tmp_path):
    make_inat(tmp_path)
    base = build_dataset("inaturalist", tmp_path, "train")
    assert base.level_names == ("species", "supercategory")
    assert_remapped(base.labels, [(c, s) for s, c, _ in INAT])
    full = build_dataset("inat_full", tmp_path, "train")
    assert full.level_names == ("species", "genus", "family", "order", "class", "phylum", "kingdom")
    assert full.labels.shape == (4, 7)
    assert full.labels[:, 0].tolist() == base.labels[:, 0].tolist()
    # items 0-2 share everything down to the family; 2 differs from 0 at genus and species
    assert (full.labels[0, 2:] == full.labels[2, 2:]).all() and (full.labels[0, :2] != full.labels[2, :2]).all()
    assert (full.labels[0] != full.labels[3]).all()


# ----------------------------------------------------------------------------- InShop
INSHOP = [
    ("img/WOMEN/Dresses/id_00000002/02_1_front.jpg", "id_00000002", "train"),
    ("img/MEN/Denim/id_00000080/01_1_front.jpg", "id_00000080", "train"),
    ("img/WOMEN/Tees/id_00000007/01_1_front.jpg", "id_00000007", "query"),
    ("img/MEN/Denim/id_00000003/01_2_side.jpg", "id_00000003", "query"),
    ("img/MEN/Denim/id_00000003/01_1_front.jpg", "id_00000003", "gallery"),
    ("img/WOMEN/Tees/id_00000005/01_1_front.jpg", "id_00000005", "gallery"),
    ("img/WOMEN/Tees/id_00000007/01_2_side.jpg", "id_00000007", "gallery"),
]


def test_inshop_query_gallery_share_identities(tmp_path):
    for rel, _, _ in INSHOP:
        img(tmp_path / rel)
    rows = "\n".join(f"{r} {i} {s}" for r, i, s in INSHOP)
    write(tmp_path / "list_eval_partition.txt", f"{len(INSHOP)}\nimage_name item_id evaluation_status\n{rows}\n")
    query = build_dataset("inshop", tmp_path, "query")
    gallery = build_dataset("inshop", tmp_path, "gallery")
    train = build_dataset("inshop", tmp_path, "train")
    assert evaluation_splits("inshop") == ("query", "gallery")
    joint = [(i, f"{r.split('/')[1]}/{r.split('/')[2]}") for r, i, s in INSHOP if s != "train"]
    assert_remapped(np.concatenate([query.labels, gallery.labels]), joint)
    assert query.labels[0, 0] == gallery.labels[2, 0]  # id_00000007 in both
    assert_remapped(train.labels, [("id_00000002", "WOMEN/Dresses"), ("id_00000080", "MEN/Denim")])


# ----------------------------------------------------------------------------- VehicleID
def test_vehicleid(tmp_path):
    lists = {"train_list.txt": [("0000001", 10), ("0000002", 10), ("0000003", 4)],
             "test_list_800.txt": [("0000004", 7), ("0000005", 7), ("0000006", 9)],
             "test_list_1600.txt": [("0000004", 7), ("0000005", 7), ("0000006", 9), ("0000007", 8), ("0000008", 8)]}
    for name, rows in lists.items():
        write(tmp_path / "train_test_split" / name, "".join(f"{i} {v}\n" for i, v in rows))
        for i, _ in rows:
            img(tmp_path / "image" / f"{i}.jpg")
    assert build_dataset("vehicleid", tmp_path, "train").labels[:, 0].tolist() == [1, 1, 0]  # numeric ids 10, 10, 4
    assert len(build_dataset("vehicleid", tmp_path, "test")) == 3
    big = build_dataset("vehicleid", tmp_path, "test", test_size=1600)
    assert len(big) == 5 and big.num_classes() == 3
    with pytest.raises(ValueError, match="test_size"):
        build_dataset("vehicleid", tmp_path, "test", test_size=1000)


# ----------------------------------------------------------------------------- DyML
def test_dyml_header_quirks(tmp_path):
    # header glued to the first row, ", " separators, columns in file order fname, coarse, middle, fine
    train = [("0.jpg", 1, 3, 30), ("1.jpg", 1, 3, 31), ("2.jpg", 2, 5, 50), ("3.jpg", 2, 5, 50)]
    head = "fname, coarse_id, middle_id, fine_id" + ", ".join(str(v) for v in train[0])
    write(tmp_path / "train/label.csv", head + "\n" + "".join(", ".join(map(str, r)) + "\n" for r in train[1:]))
    for r in train:
        img(tmp_path / "train/imgs" / r[0])
    ds = build_dataset("dyml_vehicle", tmp_path, "train")
    assert [Path(p).name for p in ds.paths] == ["0.jpg", "1.jpg", "2.jpg", "3.jpg"]  # first row recovered
    assert ds.level_names == ("fine", "middle", "coarse")
    assert_remapped(ds.labels, [(f, m, c) for _, c, m, f in train])

    query, gallery = [("0.jpg", 5), ("1.jpg", 9)], [("0.jpg", 5), ("1.jpg", 9), ("2.jpg", 11)]
    for kind, rows in (("query", query), ("gallery", gallery)):
        text = "fname, labels" + ", ".join(map(str, rows[0])) + "\n" + "".join(f"{a}, {b}\n" for a, b in rows[1:])
        write(tmp_path / f"bmk_middle/{kind}.csv", text)
        for name, _ in rows:
            img(tmp_path / f"bmk_middle/{kind}/{name}")
    q = build_dataset("dyml_vehicle", tmp_path, "query", granularity="middle")
    g = build_dataset("dyml_vehicle", tmp_path, "gallery", granularity="middle")
    assert q.level_names == ("middle",) and q.metadata["gallery_contains_queries"]
    assert q.labels[:, 0].tolist() == [0, 1] and g.labels[:, 0].tolist() == [0, 1, 2]

    write(tmp_path / "train/label.csv", "name, a, b\n0.jpg, 1, 2\n")
    with pytest.raises(LabelFileError, match=r"label.csv:1: expected a header"):
        build_dataset("dyml_animal", tmp_path, "train")


def test_dyml_product_plain_header(tmp_path):
    rows = [("0.jpg", 3, 1, 0), ("1.jpg", 4, 1, 0)]  # fname, fine, middle, coarse with a proper newline
    text = "fname, fine_id, middle_id, coarse_id\n" + "".join(", ".join(map(str, r)) + "\n" for r in rows)
    write(tmp_path / "mini-bmk_all_in_one/label.csv", text)
    for r in rows:
        img(tmp_path / "mini-bmk_all_in_one/imgs" / r[0])
    ds = build_dataset("dyml_product", tmp_path, "test")
    assert ds.labels.tolist() == [[0, 0, 0], [1, 0, 0]]
    assert evaluation_splits("dyml_product") == ("test",)


# ----------------------------------------------------------------------------- Revisited Oxford / Paris
def make_revisited(root: Path, city: str = "roxford5k") -> dict:
    imlist = ["all_souls_000000", "ashmolean_000001", "radcliffe_camera_000002"]
    qimlist = ["all_souls_000013", "radcliffe_camera_000519"]
    gnd = {
        "imlist": imlist,
        "qimlist": qimlist,
        "gnd": [
            {"bbx": [2.0, 1.0, 10.0, 7.0], "easy": np.array([0]), "hard": np.array([], dtype=np.int64), "junk": np.array([1])},
            {"bbx": [0.0, 0.0, 6.0, 5.0], "easy": [], "hard": [2], "junk": []},
        ],
    }
    for name in imlist + qimlist:
        img(root / "jpg" / f"{name}.jpg", size=(16, 12))
    with open(root / f"gnd_{city}.pkl", "wb") as fh:
        pickle.dump(gnd, fh)
    return gnd


@pytest.mark.parametrize("name,city", [("revisited_oxford", "roxford5k"), ("revisited_paris", "rparis6k")])
def test_revisited(tmp_path, name, city):
    gnd = make_revisited(tmp_path, city)
    query = build_dataset(name, tmp_path, "query")
    gallery = build_dataset(name, tmp_path, "gallery")
    assert len(query) == 2 and len(gallery) == 3
    assert query[0]["image"].shape == (3, 6, 8)  # cropped to bbx (x1, y1, x2, y2) = (2, 1, 10, 7)
    assert gallery[0]["image"].shape == (3, 12, 16)
    truth = query.metadata["ground_truth"]
    assert truth[0]["easy"] == [0] and truth[0]["junk"] == [1] and truth[1]["hard"] == [2]
    assert gallery.metadata["names"] == gnd["imlist"]
    # keywords remapped jointly: query 0 (all_souls) == gallery 0, query 1 (radcliffe_camera) == gallery 2
    assert query.labels[:, 0].tolist() == [gallery.labels[0, 0], gallery.labels[2, 0]]


def test_revisited_refuses_arbitrary_pickles(tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with open(tmp_path / "gnd_roxford5k.pkl", "wb") as fh:
        pickle.dump({"imlist": [], "qimlist": [], "gnd": [Evil()]}, fh)
    with pytest.raises(ValueError, match="refusing"):
        build_dataset("revisited_oxford", tmp_path, "query")


# ----------------------------------------------------------------------------- GLDv2 / H-GLDv2
def gld(root: Path, folder: str, image_id: str) -> None:
    img(root / folder / image_id[0] / image_id[1] / image_id[2] / f"{image_id}.jpg")


def test_gldv2_and_hierarchy(tmp_path):
    train = {"1": ["aaa1", "aab2"], "7": ["abc3"], "9": ["bbb4", "bcd5"]}
    write(tmp_path / "train_clean.csv", "landmark_id,images\n" + "".join(f"{k},{' '.join(v)}\n" for k, v in train.items()))
    for ids in train.values():
        for i in ids:
            gld(tmp_path, "images/train", i)
    index = {"i001": "20", "i002": "21", "i003": "20"}
    write(tmp_path / "index_image_to_landmark.csv", "id,landmark_id\n" + "".join(f"{k},{v}\n" for k, v in index.items()))
    write(tmp_path / "retrieval_solution_v2.1.csv", "id,images,Usage\nq001,i003 i001,Public\nq002,None,Ignored\nq003,i002,Private\n")
    for i in index:
        gld(tmp_path, "index", i)
    for q in ("q001", "q003"):
        gld(tmp_path, "test", q)
    tr = build_dataset("gldv2", tmp_path, "train")
    assert_remapped(tr.labels, [("1",), ("1",), ("7",), ("9",), ("9",)])
    q = build_dataset("gldv2", tmp_path, "query")
    g = build_dataset("gldv2", tmp_path, "gallery")
    assert [Path(p).stem for p in q.paths] == ["q001", "q003"]  # "None" row skipped
    assert q.labels[:, 0].tolist() == [g.labels[0, 0], g.labels[1, 0]]  # landmark of the first GT image
    write(tmp_path / "train_label_to_subcategory_with_clusters.csv",
          "landmark_id,category,supercategory,cluster,overall_cluster\n1,x,y,3.0,0.0\n7,x,y,,\n9,x,y,4.0,0.0\n")
    h = build_dataset("h_gldv2", tmp_path, "train")
    assert h.level_names == ("landmark", "cluster", "overall_cluster")
    assert len(h) == 4 and h.labels.tolist() == [[0, 0, 0], [0, 0, 0], [1, 1, 0], [1, 1, 0]]  # landmark 7 dropped


# ----------------------------------------------------------------------------- SfM-120k
def test_sfm120k(tmp_path):
    cids = np.array(["00aabbccddeeff1122", "0011223344556677ab", "99887766554433221100"], dtype=object)
    for c in cids:
        img(tmp_path / "ims" / c[-2:] / c[-4:-2] / c[-6:-4] / c)
    scipy.io.savemat(tmp_path / "retrieval-SfM-120k-imagenames-clusterids.mat", {"cids": cids.reshape(1, -1), "cluster": np.array([[5, 2, 5]])})
    ds = build_dataset("sfm120k", tmp_path, "train")
    assert ds.labels[:, 0].tolist() == [1, 0, 1]
    assert ds.paths[0].endswith("ims/22/11/ff/00aabbccddeeff1122")


# ----------------------------------------------------------------------------- Omniglot
def make_omniglot_zip(root: Path) -> list[str]:
    members = []
    with zipfile.ZipFile(root / "images_evaluation.zip", "w") as zf:
        zf.writestr("images_evaluation/", "")
        for alphabet, chars in (("Angelic", 2), ("ULOG", 1)):
            for c in range(1, chars + 1):
                for r in (1, 2):
                    member = f"images_evaluation/{alphabet}/character{c:02d}/{c + 964:04d}_{r:02d}.png"
                    buf = Image.new("1", (105, 105), 1)
                    from io import BytesIO

                    data = BytesIO()
                    buf.save(data, format="PNG")
                    zf.writestr(member, data.getvalue())
                    members.append(member)
    return members


def test_omniglot_fake_zip_and_folder(tmp_path):
    members = make_omniglot_zip(tmp_path)
    before = snapshot(tmp_path)
    ds = build_dataset("omniglot", tmp_path, "test")
    assert ds.labels.tolist() == [[0, 0], [0, 0], [1, 0], [1, 0], [2, 1], [2, 1]]
    assert ds.paths[0] == f"{tmp_path}/images_evaluation.zip/{members[0]}"
    item = ds[0]
    assert item["image"].shape == (3, 105, 105) and float(item["image"].min()) == 1.0  # 1-bit white -> RGB
    assert snapshot(tmp_path) == before  # read from the archive, nothing extracted
    with zipfile.ZipFile(tmp_path / "images_evaluation.zip") as zf:
        zf.extractall(tmp_path / "x")
    (tmp_path / "images_evaluation.zip").unlink()
    (tmp_path / "x" / "images_evaluation").rename(tmp_path / "images_evaluation")
    assert build_dataset("omniglot", tmp_path, "test").labels.tolist() == ds.labels.tolist()
    with pytest.raises(FileNotFoundError, match="images_background"):
        build_dataset("omniglot", tmp_path, "train")


def test_omniglot_real_archives(omniglot):
    before = snapshot(omniglot)
    train = build_dataset("omniglot", omniglot, "train")
    test = build_dataset("omniglot", omniglot, "test")
    assert (len(train), train.num_classes(0), train.num_classes(1)) == (19280, 964, 30)
    assert (len(test), test.num_classes(0), test.num_classes(1)) == (13180, 659, 20)
    assert np.bincount(train.labels[:, 0]).tolist() == [20] * 964
    alphabets = lambda ds: {Path(p).parent.parent.name for p in ds.paths}  # noqa: E731
    assert not alphabets(train) & alphabets(test)  # open-set: no shared alphabet
    item = test[123]
    assert item["image"].shape == (3, 105, 105)
    pixels = item["image"][0]
    assert set(pixels.unique().tolist()) <= {0.0, 1.0} and 0.005 < float((pixels == 0).float().mean()) < 0.3
    small = build_dataset("omniglot", omniglot, "train", train_set="background_small1")
    assert (len(small), small.num_classes(0), small.num_classes(1)) == (2720, 136, 5)
    assert snapshot(omniglot) == before


def test_inconsistent_hierarchy_warns(sop_root):
    tmp_path, _ = sop_root
    text = (tmp_path / "Ebay_train.txt").read_text()
    write(tmp_path / "Ebay_train.txt", text.replace("2 1 1 bicycle", "2 1 12 bicycle"))  # product 1 in two categories
    with pytest.warns(UserWarning, match=r"inconsistent hierarchy \{1: 1\}"):
        build_dataset("sop", tmp_path, "train")
