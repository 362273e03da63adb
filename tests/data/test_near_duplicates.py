"""Near-duplicates by difference hash (:mod:`rankopt.data.near_duplicates`) and the validation split that keeps each
group on one side (:func:`rankopt.fit.validation.make_split`); on SYNTHETIC smooth images (blurred noise)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageFilter

from rankopt.data import image_files
from rankopt.data.image_files import decode_problem, difference_hash, hash_distance, image_hash
from rankopt.data.near_duplicates import NEAR_BITS, duplicate_groups, grouped_count, hamming, photo_hashes


def as_hashes(*values: int) -> np.ndarray:
    """256-bit hashes given as integers, as :func:`photo_hashes` returns them."""
    return np.stack([np.frombuffer(v.to_bytes(32, "big"), dtype=np.uint8) for v in values])
from rankopt.fit.validation import make_split


def smooth(seed: int, size: tuple[int, int] = (160, 120)) -> Image.Image:
    """A photo-like image: coarse random structure, blurred."""
    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)).resize(size, Image.BICUBIC)
    return coarse.filter(ImageFilter.GaussianBlur(3))


def reencoded(img: Image.Image, quality: int) -> Image.Image:
    buffer = io.BytesIO()
    img.save(buffer, format="JPEG", quality=quality)
    return Image.open(io.BytesIO(buffer.getvalue()))


def test_hamming_counts_the_differing_bits():
    rng = np.random.default_rng(0)
    a, b = (rng.integers(0, 256, (7, 32), dtype=np.uint8) for _ in range(2))
    expected = np.array([[hash_distance(x.tobytes(), y.tobytes()) for y in b] for x in a])
    assert np.array_equal(hamming(a, b), expected)
    assert hash_distance(bytes(32), bytes([255]) + bytes(31)) == 8


def test_copies_are_within_the_bound_and_other_photos_are_not():
    photo = smooth(0)
    base = difference_hash(photo)
    copies = [photo.resize((80, 60), Image.BILINEAR), reencoded(photo, 60), photo.crop((3, 2, 157, 118)),
              photo.resize((400, 300), Image.BICUBIC)]
    for copy in copies:
        assert hash_distance(base, difference_hash(copy)) <= NEAR_BITS
    others = [hash_distance(base, difference_hash(smooth(seed))) for seed in range(1, 30)]
    assert min(others) > NEAR_BITS and 90 < np.mean(others) < 166  # unrelated: about half of the 256 bits


def test_the_hash_follows_the_exif_orientation(tmp_path):
    photo = smooth(3)
    turned = photo.transpose(Image.Transpose.ROTATE_90)  # stored turned, EXIF says turn back
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation 6: shown turned back (ImageOps.exif_transpose: ROTATE_270)
    turned.save(tmp_path / "turned.jpg", exif=exif, quality=95)
    photo.save(tmp_path / "upright.jpg", quality=95)
    a, b = image_hash(str(tmp_path / "turned.jpg")), image_hash(str(tmp_path / "upright.jpg"))
    assert a is not None and b is not None and hash_distance(a, b) <= NEAR_BITS


def test_the_decode_check_remembers_the_hash(tmp_path, monkeypatch):
    path = tmp_path / "p.png"
    smooth(5).save(path)
    assert decode_problem(str(path)) is None
    monkeypatch.setattr(image_files, "decode_problem", lambda p: pytest.fail("decoded twice"))
    assert image_hash(str(path)) == difference_hash(Image.open(path))
    smooth(6).save(path)  # changed on disk (another size or time): decoded again
    monkeypatch.undo()
    assert image_hash(str(path)) == difference_hash(smooth(6))
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8\xff")
    assert image_hash(str(tmp_path / "bad.jpg")) is None
    found = photo_hashes([str(tmp_path / "bad.jpg"), str(path)])
    assert not found[0].any() and found[1].tobytes() == difference_hash(smooth(6))


def test_groups_are_linked_within_a_class_and_transitively():
    h = as_hashes(0b0, 0b111111, 0b1111111 << 6, 0b1, 0xFFFFFFFF00000000, 0b0)
    labels = np.array([0, 0, 0, 0, 0, 1])
    groups = duplicate_groups(h, labels, max_bits=6)
    # 0~3 (1 bit), 0~1 (6 bits); 2 is 7+ bits from each, 4 is 32+ bits from each; 5 equals 0 in another class
    assert groups[0] == groups[1] == groups[3] and len({groups[0], groups[2], groups[4], groups[5]}) == 4
    assert grouped_count(groups) == 3
    chain = as_hashes(0b0, 0b111, 0b111111, 0b111111111)  # each 3 bits from the next
    assert len(set(duplicate_groups(chain, np.zeros(4, int), max_bits=3))) == 1


def test_the_split_keeps_each_group_on_one_side():
    labels = np.repeat(np.arange(12), 10)
    groups = np.arange(labels.size)
    for c in range(12):  # in every class, photos 0-3 are copies of each other, 4-5 too
        first = c * 10
        groups[first:first + 4] = first
        groups[first + 4:first + 6] = first + 4
    split = make_split(labels, [f"c{c}" for c in range(12)], seed=0, groups=groups)
    queries = np.union1d(split.known_queries, split.new_queries)
    indexed = np.union1d(split.train, split.new_gallery)
    for g in np.unique(groups):
        members = np.flatnonzero(groups == g)
        assert np.isin(members, queries).all() or not np.isin(members, queries).any(), members
        assert not (np.isin(members, queries).any() and np.isin(members, indexed).any())
    assert split.known_queries.size > 0 and split.new_queries.size > 0
    # without near-duplicates the split is the one drawn photo by photo
    plain, singles = (make_split(labels, [f"c{c}" for c in range(12)], seed=1, groups=g)
                      for g in (None, np.arange(labels.size)))
    assert np.array_equal(plain.known_queries, singles.known_queries) and np.array_equal(plain.train, singles.train)
