"""``landmarks_clean`` (Gordo et al.'s cleaned Landmarks, SoftBin-AP's training set) from its public
list file ``annotation_clean_train.txt`` (``<url or path> <landmark id>`` lines) and the user's images."""

from __future__ import annotations

import pytest
from PIL import Image

from rankopt.config import load_recipe
from rankopt.data import BadImageError, LabelFileError, build_dataset, dataset_spec

LINES = [
    "http://farm1.static.flickr.com/12/34_abc.jpg 5",
    "http://farm2.static.flickr.com/56/78_def.jpg 5",
    "images/gh.jpg 11",
]


@pytest.fixture
def landmarks_root(tmp_path):
    for name in ("34_abc.jpg", "78_def.jpg", "images/gh.jpg"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (9, 7), (120, 30, 60)).save(tmp_path / name)
    (tmp_path / "annotations").mkdir()
    (tmp_path / "annotations" / "annotation_clean_train.txt").write_text("\n".join(LINES) + "\n")
    return tmp_path


def test_list_file_with_urls_and_paths(landmarks_root):
    ds = build_dataset("landmarks_clean", landmarks_root, "train")
    assert ds.paths == [str(landmarks_root / n) for n in ("34_abc.jpg", "78_def.jpg", "images/gh.jpg")]
    assert ds.labels[:, 0].tolist() == [0, 0, 1] and ds.level_names == ("landmark",)
    assert ds.sources[2].endswith("annotations/annotation_clean_train.txt:3")
    spec = dataset_spec("landmarks_clean")
    assert spec.published["train"] == {"images": 42410, "landmark": 586} and spec.evaluation_splits == ()


def test_list_file_errors_name_the_line(landmarks_root, tmp_path):
    listing = tmp_path / "my_list.txt"
    listing.write_text("images/gh.jpg 11\nimages/gh.jpg\n")
    with pytest.raises(LabelFileError, match=r"my_list.txt:2: expected 2 fields, got 1"):
        build_dataset("landmarks_clean", landmarks_root, "train", list_file=str(listing))
    listing.write_text("images/gh.jpg eleven\n")
    with pytest.raises(LabelFileError, match=r"my_list.txt:1: landmark id 'eleven' is not an integer"):
        build_dataset("landmarks_clean", landmarks_root, "train", list_file=str(listing))
    listing.write_text("http://example.org/x/missing.jpg 3\n")
    with pytest.raises(BadImageError, match=r"missing.jpg \(listed at .*my_list.txt:1\)"):
        build_dataset("landmarks_clean", landmarks_root, "train", list_file=str(listing))
    with pytest.raises(FileNotFoundError, match="annotation_clean_train.txt"):
        build_dataset("landmarks_clean", tmp_path / "images", "train")


def test_softbin_recipe_trains_on_landmarks_clean():
    cfg = load_recipe("softbin_ap_landmarks")
    assert cfg.data.name == "landmarks_clean" and cfg.data.eval_name == "revisited_oxford"
