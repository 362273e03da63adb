"""``decode_jpeg_pixels`` (libjpeg-turbo via simplejpeg straight into an array) against its reference, Pillow's
decode (``decode_image`` + ``to_rgb``): equal pixels at every DCT scale, EXIF orientation as
``ImageOps.exif_transpose``, None (the Pillow path) for everything it does not handle; the dataset's use of it."""

from __future__ import annotations

import io
import math
import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

from rankopt.data.base import BadImageError, RetrievalDataset
from rankopt.data.decode import DRAFT_GAP, decode_image, decode_jpeg_pixels, draft_scale, exif_orientation
from rankopt.data.image_files import load_image, to_rgb
from rankopt.data.transforms import build_transform

from test_fast_loading import photo

pytest.importorskip("simplejpeg")


def jpeg(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    previous, ImageFile.MAXBLOCK = ImageFile.MAXBLOCK, 1 << 24  # progressive saves need the whole image in one block
    try:
        image.save(buffer, "JPEG", **options)
    finally:
        ImageFile.MAXBLOCK = previous
    return buffer.getvalue()


def reference(data: bytes, min_side: int | None) -> np.ndarray:
    return np.asarray(to_rgb(decode_image(data, min_side)))


CASES = [  # (width, height, mode, save options)
    (300, 200, "RGB", {"quality": 90}),  # 4:2:0
    (301, 199, "RGB", {"quality": 75, "subsampling": 0}),  # 4:4:4, odd sides
    (257, 411, "RGB", {"quality": 95, "subsampling": 1}),  # 4:2:2
    (640, 427, "RGB", {"quality": 85, "progressive": True}),
    (1600, 1203, "RGB", {"quality": 90}),
    (5, 700, "RGB", {"quality": 60}),
    (9, 12, "RGB", {"quality": 90}),
    (500, 333, "L", {"quality": 90}),
    (1201, 801, "L", {"quality": 80, "progressive": True}),
]


@pytest.mark.parametrize("width,height,mode,options", CASES)
@pytest.mark.parametrize("min_side", [None, 40, 90, 150])
def test_pixels_equal_pillows_decode_at_every_scale(width, height, mode, options, min_side):
    data = jpeg(photo(width, height, seed=width).convert(mode), **options)
    pixels = decode_jpeg_pixels(data, min_side)
    expected = reference(data, min_side)
    assert pixels is not None and pixels.dtype == np.uint8 and pixels.flags.c_contiguous
    assert pixels.shape == expected.shape
    np.testing.assert_array_equal(pixels, expected)


def test_draft_scale_is_pillows_choice():
    for width, height in [(1600, 1200), (1200, 1700), (300, 200), (2000, 130), (64, 64)]:
        for min_side in (None, 16, 40, 100, 300):
            with Image.open(io.BytesIO(jpeg(Image.new("RGB", (width, height), (90, 30, 200))))) as img:
                if min_side is not None:
                    side = math.ceil(DRAFT_GAP * min_side)
                    img.draft(None, (side, side))
                scale = img.decoderconfig[0] if img.decoderconfig else 1
            assert draft_scale(width, height, min_side) == scale, (width, height, min_side)
    assert draft_scale(1600, 1200, 100) == 4 and draft_scale(1600, 1200, None) == 1 and draft_scale(100, 90, 30) == 1


def exif_bytes(orientation: int, byte_order: str = "<", kind: int = 3, count: int = 1) -> bytes:
    """A TIFF block with one IFD0 entry, tag 0x0112, written by hand in either byte order."""
    mark = b"II" if byte_order == "<" else b"MM"
    value = struct.pack(byte_order + "HH", orientation, 0) if kind == 3 else struct.pack(byte_order + "I", orientation)
    entry = struct.pack(byte_order + "HHI", 0x0112, kind, count) + value
    return mark + struct.pack(byte_order + "HI", 42, 8) + struct.pack(byte_order + "H", 1) + entry + b"\0\0\0\0"


def with_segment(data: bytes, marker: int, payload: bytes) -> bytes:
    """``data`` with an APPn segment inserted right after SOI."""
    return data[:2] + bytes([0xFF, marker]) + struct.pack(">H", len(payload) + 2) + payload + data[2:]


@pytest.mark.parametrize("orientation", range(1, 9))
@pytest.mark.parametrize("byte_order", ["<", ">"])
def test_exif_orientation_is_applied_as_pillow_does(orientation, byte_order):
    plain = jpeg(photo(120, 70, seed=orientation), quality=90)
    data = with_segment(plain, 0xE1, b"Exif\0\0" + exif_bytes(orientation, byte_order))
    assert exif_orientation(data) == orientation
    pixels = decode_jpeg_pixels(data, None)
    expected = reference(data, None)
    assert expected.shape[:2] == ((70, 120) if orientation < 5 else (120, 70))
    np.testing.assert_array_equal(pixels, expected)
    assert pixels.flags.c_contiguous


def test_pillows_own_exif_writer_is_read():
    exif = Image.Exif()
    exif[0x0112] = 6
    data = jpeg(photo(200, 100), quality=90, exif=exif)
    assert exif_orientation(data) == 6
    np.testing.assert_array_equal(decode_jpeg_pixels(data, 30), reference(data, 30))


def test_what_it_cannot_read_goes_to_pillow():
    plain = jpeg(photo(120, 80), quality=90)
    assert exif_orientation(plain) == 1
    cannot = {
        "xmp": with_segment(plain, 0xE1, b"http://ns.adobe.com/xap/1.0/\0<x:xmpmeta/>"),
        "two exif": with_segment(with_segment(plain, 0xE1, b"Exif\0\0" + exif_bytes(3)), 0xE1, b"Exif\0\0" + exif_bytes(6)),
        "long type": with_segment(plain, 0xE1, b"Exif\0\0" + exif_bytes(6, kind=4)),
        "two values": with_segment(plain, 0xE1, b"Exif\0\0" + exif_bytes(6, count=2)),
        "bad tiff": with_segment(plain, 0xE1, b"Exif\0\0" + b"XX*\0\x08\0\0\0"),
        "ifd past the end": with_segment(plain, 0xE1, b"Exif\0\0" + b"II*\0\xff\0\0\0"),
        "junk between segments": plain[:2] + b"\x00" + plain[2:],
        "length past the end": plain[:2] + b"\xff\xe1\xff\xff" + plain[2:40],
    }
    for name, data in cannot.items():
        assert exif_orientation(data) is None, name
        assert decode_jpeg_pixels(data, None) is None, name
    others = {
        "png": (lambda b: (photo(50, 40).save(b, "PNG"), b.getvalue())[1])(io.BytesIO()),
        "cmyk": jpeg(photo(60, 40).convert("CMYK"), quality=90),
        "truncated": plain[: len(plain) // 2],
        "empty": b"",
        "header only": plain[:20],
    }
    for name, data in others.items():
        assert decode_jpeg_pixels(data, None) is None, name


def test_over_pillows_pixel_limit_goes_to_pillow(monkeypatch):
    data = jpeg(photo(300, 200), quality=90)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300 * 200 - 1)
    assert decode_jpeg_pixels(data, None) is None
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 300 * 200)
    assert decode_jpeg_pixels(data, None) is not None


def test_without_simplejpeg_every_image_takes_pillow(monkeypatch):
    data = jpeg(photo(120, 80), quality=90)
    monkeypatch.setitem(sys.modules, "simplejpeg", None)  # import raises ImportError
    assert decode_jpeg_pixels(data, None) is None


def test_transform_takes_pixels_and_checks_them():
    image = to_rgb(decode_image(jpeg(photo(300, 220), quality=90)))
    pixels = np.asarray(image)
    for preset in ("train", "test"):
        transform = build_transform(preset, 64)
        assert transform.takes_pixels
        torch.manual_seed(3)
        a = transform(pixels)
        torch.manual_seed(3)
        assert torch.equal(a, transform(image))
    area = build_transform("omniglot_test", None)  # area resize: no fused path, the array goes through a Pillow image
    assert not area.takes_pixels and torch.equal(area(pixels), area(image))
    with pytest.raises(ValueError, match=r"\(H, W, 3\) uint8"):
        build_transform("test", 64)(pixels.astype(np.float32))
    with pytest.raises(ValueError, match=r"\(H, W, 3\) uint8"):
        build_transform("test", 64)(pixels[..., 0])


def test_dataset_takes_the_array_path_with_identical_tensors(tmp_path, monkeypatch):
    paths = []
    for i, (image, options) in enumerate([(photo(640, 480, seed=1), {"quality": 90}),
                                          (photo(300, 500, seed=2).convert("L"), {"quality": 85}),
                                          (photo(200, 150, seed=3), {"format": "PNG"})]):
        path = tmp_path / f"{i}.{'png' if options.get('format') else 'jpg'}"
        image.save(path, **options)
        paths.append(str(path))
    paths.append(paths[0])  # the same file with a box: the Pillow path
    calls = []
    import rankopt.data.base as base

    counted = base.decode_jpeg_pixels
    monkeypatch.setattr(base, "decode_jpeg_pixels", lambda *a: calls.append(a) or counted(*a))
    for preset in ("train", "test"):
        transform = build_transform(preset, 96)
        ds = RetrievalDataset(paths, np.zeros(len(paths), dtype=np.int64), "train", ("class",), transform,
                              boxes={3: (40, 30, 600, 400)})
        for index in range(len(paths)):
            torch.manual_seed(index)
            got = ds[index]["image"]
            torch.manual_seed(index)
            assert torch.equal(got, transform(ds.load(index, transform.decode_min_side))), (preset, index)
    assert len(calls) == 2 * 3  # the boxed item never asked for pixels
    plain = RetrievalDataset(paths[:1], np.zeros(1, dtype=np.int64), "train", ("class",), None)
    assert plain[0]["image"].shape == (3, 480, 640)  # no transform: the Pillow decode


def test_dataset_errors_still_name_the_file(tmp_path):
    good = jpeg(photo(400, 300), quality=90)
    (tmp_path / "truncated.jpg").write_bytes(good[: len(good) // 2])
    ds = RetrievalDataset([str(tmp_path / "truncated.jpg"), str(tmp_path / "missing.jpg")], np.zeros(2, dtype=np.int64),
                          "test", ("class",), build_transform("test", 64), sources=["list.txt:1", "list.txt:2"])
    with pytest.raises(BadImageError, match=r"truncated\.jpg.*list\.txt:1"):
        ds[0]
    with pytest.raises(BadImageError, match=r"missing\.jpg.*list\.txt:2"):
        ds[1]


CALTECH = os.environ.get("RANKOPT_CALTECH101")


@pytest.mark.skipif(not CALTECH or not Path(CALTECH).is_dir(), reason="set RANKOPT_CALTECH101 to the Caltech-101 folder")
def test_caltech_jpegs_decode_to_the_same_pixels():
    files = sorted(Path(CALTECH).glob("*/*.jpg"))[::45]
    assert len(files) >= 150
    for path in files:
        data = path.read_bytes()
        for min_side in (None, 64):
            pixels = decode_jpeg_pixels(data, min_side)
            assert pixels is not None, path
            np.testing.assert_array_equal(pixels, np.asarray(load_image(str(path), min_side)), err_msg=str(path))
