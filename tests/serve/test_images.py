"""Uploads as hostile or unusual images (:mod:`rankopt.serve.images`): only accepted formats are opened, the decoded
size is checked before a pixel is, any mode converts in bounded memory and time, heavy uploads decode one at a time.
Every file is made here."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
import threading
import time
import zlib

import numpy as np
import pytest
from PIL import EpsImagePlugin, IcoImagePlugin, Image, ImageFile, TiffImagePlugin, WebPImagePlugin

from rankopt.data.decode import decode_image
from rankopt.data.image_files import to_rgb
from rankopt.serve import images
from rankopt.serve.images import CHECKABLE_FORMATS, check_formats, decode_upload
from rankopt.serve.errors import ApiError
from rankopt.serve.limits import DEFAULT_FORMATS, Limits

from helpers.serving import upload

GREY = 30000  # of 65535: 116 in 8 bits
TIFF_TAIL = 256


@pytest.fixture(scope="module")
def grey16() -> bytes:
    """A 7000 x 7000 16-bit grey PNG (49 M pixels, under the default limit, about 110 kB)."""
    buffer = io.BytesIO()
    Image.new("I;16", (7000, 7000), GREY).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[list]:
    """``[size, start, end]`` of every pixel decode (``ImageFile.load`` with tiles to read) in any thread, listed
    when it starts (``end`` None until it ends)."""
    records = []
    load = ImageFile.ImageFile.load

    def spy(self):
        if not self.tile:
            return load(self)
        record = [self.size, time.perf_counter(), None]
        records.append(record)
        try:
            return load(self)
        finally:
            record[2] = time.perf_counter()

    monkeypatch.setattr(ImageFile.ImageFile, "load", spy)
    return records


def calls(monkeypatch: pytest.MonkeyPatch, owner: object, attribute: str) -> list[object]:
    """Patches ``owner.attribute`` to record its calls (then run it)."""
    seen = []
    original = getattr(owner, attribute)

    def spy(*args, **kwargs):
        seen.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, attribute, spy)
    return seen


def encoded(fmt: str, size: tuple[int, int], mode: str = "RGB", **options) -> bytes:
    """Random pixels (random alpha where ``mode`` has one) in ``fmt``."""
    pixels = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 4), dtype=np.uint8)
    return saved(Image.fromarray(pixels, "RGBA").convert(mode), fmt, **options)


def saved(img: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    img.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def png16(pixels: np.ndarray, colour_type: int) -> bytes:
    """A 16-bit PNG of ``pixels`` (uint16, ``(H, W[, C])``) written by hand (Pillow writes 16-bit grey only)."""
    height, width = pixels.shape[:2]
    rows = b"".join(b"\0" + row.astype(">u2").tobytes() for row in pixels)

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 16, colour_type, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def tiff(width: int, height: int, entries: list[tuple[int, int, int, int]], tail: bytes = b"") -> bytes:
    """A little-endian TIFF: one grey 8-bit directory of ``(tag, type, count, value)`` entries besides its size,
    then ``tail`` (at offset :data:`TIFF_TAIL`)."""
    entries = sorted([(256, 4, 1, width), (257, 4, 1, height), (258, 3, 1, 8), (262, 3, 1, 1), *entries])
    directory = struct.pack("<H", len(entries)) + b"".join(struct.pack("<HHII", *entry) for entry in entries)
    assert 8 + len(directory) + 4 <= TIFF_TAIL
    return (b"II*\0" + struct.pack("<I", 8) + directory + b"\0" * 4).ljust(TIFF_TAIL, b"\0") + tail


MEASURE = r"""
import io, json, resource, sys, time
from PIL import Image
from rankopt.serve.images import decode_upload
from rankopt.serve.limits import Limits

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

data = open(sys.argv[1], "rb").read()
warm = io.BytesIO()
Image.new("I;16", (64, 64), 1).save(warm, format="PNG")
decode_upload(warm.getvalue(), Limits(), 224)  # plugins imported, first calls made
out, base = {}, peak_mb()
for key, min_side in (("reduced", 224), ("full", None)):
    start = time.perf_counter()
    image = decode_upload(data, Limits(), min_side)
    out[key] = {"s": time.perf_counter() - start, "peak_mb": peak_mb() - base, "size": image.size,
                "pixel": image.getpixel((0, 0))}
    del image
start = time.perf_counter()
Image.open(sys.argv[1]).load()
out["load_s"] = time.perf_counter() - start
print(json.dumps(out))
"""


def test_a_16_bit_grey_png_decodes_in_bounded_time_and_memory(grey16, tmp_path):
    path = tmp_path / "grey16.png"
    path.write_bytes(grey16)
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    # decoded, the image is 98 MB (2 bytes a pixel), its RGB 196 MB in Pillow; the float64 conversion took +1.2 GB
    reduced, full, load = out["reduced"], out["full"], out["load_s"]
    assert reduced["size"] == [467, 467] and full["size"] == [7000, 7000], out  # 7000 // (2 x 224) = 15
    assert reduced["pixel"] == full["pixel"] == [116, 116, 116], out  # a grey, not clipped to black or white
    assert reduced["peak_mb"] < 250 and full["peak_mb"] < 400, out
    assert reduced["s"] < 4 * load + 0.3 and full["s"] < 6 * load + 0.5, out  # relative to Pillow's decode alone


def test_an_ico_holding_a_huge_png_is_refused_unopened(client, loads, monkeypatch):
    buffer = io.BytesIO()
    Image.new("1", (11000, 11000)).save(buffer, format="PNG")  # 121 M pixels; its directory entry says 256 x 256
    png = buffer.getvalue()
    ico = struct.pack("<HHH", 0, 1, 1) + struct.pack("<BBBBHHII", 0, 0, 0, 0, 1, 32, len(png), 22) + png
    opened = calls(monkeypatch, IcoImagePlugin.IcoImageFile, "_open")
    answer = upload(client, ico, name="favicon.ico")
    assert answer.status_code == 415, answer.text
    error = answer.json()["error"]
    assert "'favicon.ico' is in the ICO format" in error and all(fmt in error for fmt in DEFAULT_FORMATS)
    assert loads == [] and opened == []  # no plugin opened it, nothing decoded
    with pytest.raises(ApiError) as refused:  # a Limits naming ICO (check_formats refuses it) does not open it
        decode_upload(ico, Limits(formats=("PNG", "ICO")))
    assert refused.value.status == 415 and loads == [] and opened == []
    with pytest.raises(ValueError, match="ICO"):
        check_formats(["png", "ico"])


def test_an_eps_is_refused_and_ghostscript_never_runs(client, monkeypatch):
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nnewpath 0 0 moveto 10 10 lineto stroke\n%%EOF\n"
    opened = calls(monkeypatch, EpsImagePlugin.EpsImageFile, "_open")
    ghostscript = calls(monkeypatch, EpsImagePlugin, "Ghostscript")
    answer = upload(client, eps, name="q.eps")
    assert answer.status_code == 415, answer.text
    assert "is in the EPS format, which is not accepted" in answer.json()["error"]
    assert opened == [] and ghostscript == []


def test_check_formats():
    assert set(CHECKABLE_FORMATS) >= set(DEFAULT_FORMATS)
    assert check_formats(["jpeg", " Png", "JPEG"]) == ("JPEG", "PNG")
    assert check_formats("webp,tiff") == ("WEBP", "TIFF")
    for bad in (["EPS"], ["JPG"], ["PNG", "ICO", "PSD"]):
        with pytest.raises(ValueError, match=bad[-1]):
            check_formats(bad)
    with pytest.raises(ValueError, match="at least one"):
        check_formats([])


def test_the_pixel_limit_holds_at_its_edge_in_every_default_format(make_client, loads, monkeypatch):
    client = make_client(limits=Limits(max_pixels=1024))
    plugins = {"WEBP": calls(monkeypatch, WebPImagePlugin.WebPImageFile, "_open"),
               "TIFF": calls(monkeypatch, TiffImagePlugin.TiffImageFile, "_open")}
    for fmt in DEFAULT_FORMATS:
        options = {"lossless": True} if fmt == "WEBP" else {}
        assert upload(client, encoded(fmt, (32, 32), **options)).status_code == 200, fmt  # exactly 1024
        loads.clear()
        for seen in plugins.values():
            seen.clear()
        answer = upload(client, encoded(fmt, (25, 41), **options))  # 1025
        assert answer.status_code == 413 and "1025 pixels, over the limit of 1024" in answer.json()["error"], fmt
        assert loads == [], f"{fmt}: pixels decoded before the refusal"
        assert plugins.get(fmt, []) == [], f"{fmt}: Pillow opened it (a WebP canvas is allocated on opening)"
    gif = bytearray(encoded("GIF", (32, 32)))  # its first frame reaches row 41: the canvas grows to 32 x 41
    frame = gif.index(b"\x2c\x00\x00\x00\x00")
    gif[frame + 7 : frame + 9] = struct.pack("<H", 41)
    answer = upload(client, bytes(gif))
    assert answer.status_code == 413 and "32 x 41" in answer.json()["error"]


def mode_cases() -> dict[str, bytes]:
    """Small images in the modes and formats an upload may take."""
    rng = np.random.default_rng(1)
    exif = Image.Exif()
    exif[0x0112] = 6  # shown rotated 90 degrees clockwise
    size = (192, 128)
    cases = {f"{fmt} {mode}": encoded(fmt, size, mode) for fmt, modes in {
        "PNG": ("1", "L", "LA", "P", "RGB", "RGBA"), "BMP": ("1", "L", "P", "RGB"), "GIF": ("L", "P"),
        "TIFF": ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "CMYK", "YCbCr"), "JPEG": ("L", "RGB", "CMYK"),
    }.items() for mode in modes}
    cases["WEBP RGB"] = encoded("WEBP", size, lossless=True)
    cases["WEBP RGBA"] = encoded("WEBP", size, "RGBA", lossless=True)
    cases["PNG P transparent"] = encoded("PNG", size, "P", transparency=7)
    cases["GIF P transparent"] = encoded("GIF", size, "P", transparency=7)
    cases["TIFF RGB deflate"] = encoded("TIFF", size, compression="tiff_adobe_deflate")
    cases["TIFF 1 group4"] = encoded("TIFF", size, "1", compression="group4")
    cases["JPEG RGB rotated"] = encoded("JPEG", size, exif=exif.tobytes())
    cases["PNG RGB rotated"] = encoded("PNG", size, exif=exif.tobytes())
    grey16 = rng.integers(0, 1 << 16, (128, 192), dtype=np.uint16)
    cases["TIFF I;16"] = saved(Image.fromarray(grey16), "TIFF")
    cases["TIFF I;16B"] = saved(Image.frombytes("I;16B", size, grey16.astype(">u2").tobytes()), "TIFF")
    cases["TIFF I"] = saved(Image.fromarray(rng.integers(-1000, 1 << 20, (128, 192), dtype=np.int32)), "TIFF")
    cases["TIFF F"] = saved(Image.fromarray(rng.normal(100, 50, (128, 192)).astype(np.float32)), "TIFF")
    for name, colour_type, channels in (("RGB", 2, (3,)), ("RGBA", 6, (4,)), ("LA", 4, (2,)), ("I;16", 0, ())):
        pixels = rng.integers(0, 1 << 16, (128, 192, *channels), dtype=np.uint16)
        cases[f"PNG 16-bit {name}"] = png16(pixels, colour_type)
    return cases


def test_every_mode_decodes_to_the_pixels_of_rankopt_search(monkeypatch):
    monkeypatch.setattr(images, "TILE_PIXELS", 60 * 60)  # converted in tiles of 60 x 60, some cut by the edges
    for name, data in mode_cases().items():
        for min_side in (None, 16):
            expected = to_rgb(decode_image(data, min_side))
            got = decode_upload(data, Limits(), min_side)
            assert got.mode == "RGB" and got.size == expected.size, name
            assert np.array_equal(np.asarray(got), np.asarray(expected)), f"{name}, min_side {min_side}"
    monkeypatch.setattr(images, "HEAVY_PIXELS", 1000)  # every case is heavy now: reduced by 128 // 32 = 4
    for name, data in mode_cases().items():
        expected = to_rgb(decode_image(data, 16))  # a JPEG: decoded at 1/4 by its draft, as rankopt search does
        expected = expected if name.startswith("JPEG") else expected.reduce(4)
        got = decode_upload(data, Limits(), 16)
        assert got.size == expected.size and np.array_equal(np.asarray(got), np.asarray(expected)), name
    ramp = np.arange(0, 65536, 257, dtype=np.uint16).repeat(3).reshape(1, -1)  # 0, 257, ..., 65535
    grey = np.asarray(decode_upload(png16(ramp, 0), Limits()))
    assert np.array_equal(grey[0, ::3, 0], np.arange(256)) and (grey == grey[..., :1]).all()


def test_tiff_directories_that_do_not_fit_their_image_are_refused_unopened(monkeypatch):
    opened = calls(monkeypatch, TiffImagePlugin.TiffImageFile, "_open")
    strips = 200_000  # for an 8 x 8 image: Pillow would build a tile for each
    many = tiff(8, 8, [(273, 4, strips, TIFF_TAIL), (278, 4, 1, 1), (279, 4, 1, 64)], b"\0" * 4 * strips)
    huge_tiles = tiff(16, 16, [(259, 3, 1, 8), (322, 4, 1, 1 << 16), (323, 4, 1, 1 << 16), (324, 4, 1, TIFF_TAIL),
                               (325, 4, 1, 16)], zlib.compress(b"\0" * 4096))
    for data, message in ((many, "tag 273 holds 200000 values, over 8"), (huge_tiles, "tiles of 65536 x 65536")):
        start = time.perf_counter()
        with pytest.raises(ApiError) as refused:
            decode_upload(data, Limits())
        assert refused.value.status == 400 and message in refused.value.message
        assert time.perf_counter() - start < 0.5 and opened == []


def test_heavy_uploads_decode_one_at_a_time_beside_the_others(make_client, grey16, loads):
    """Six 7000 x 7000 16-bit PNGs at once: their decodes never overlap, and small uploads sent back to back
    meanwhile all answer quickly (before: the six decoded together, 1.2 GB each, small uploads took up to 2.8 s with
    the default two workers). A heavy upload waits for the lane in the event loop, holding no worker thread."""
    heavy = 6
    client = make_client()  # the default workers: one per core
    small = encoded("PNG", (64, 64))
    assert upload(client, small).status_code == 200  # warm: the model's first forward
    loads.clear()
    answers: list = []
    threads = [threading.Thread(target=lambda: answers.append(upload(client, grey16))) for _ in range(heavy)]
    for thread in threads:
        thread.start()
    latencies = []
    while any(thread.is_alive() for thread in threads):
        start = time.perf_counter()
        assert upload(client, small).status_code == 200
        latencies.append(time.perf_counter() - start)
    assert [answer.status_code for answer in answers] == [200] * heavy
    decodes = sorted((start, end) for size, start, end in loads if size == (7000, 7000))
    assert len(decodes) == heavy
    assert all(end <= next_start for (_, end), (next_start, _) in zip(decodes, decodes[1:])), decodes
    assert max(latencies) < 0.4, f"{len(latencies)} small uploads, the slowest {max(latencies):.2f} s"
