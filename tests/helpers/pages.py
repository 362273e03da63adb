"""A page as a person sees it: a headless-chromium screenshot, checked not blank (skipped without chromium)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image


def screenshot_stats(png: Path) -> tuple[int, float]:
    """``(number of distinct colours, standard deviation of the pixel values)`` of an image."""
    with Image.open(png) as image:
        pixels = np.asarray(image.convert("RGB"))
    return len(np.unique(pixels.reshape(-1, 3), axis=0)), float(pixels.std())


@pytest.fixture
def render_page(tmp_path: Path) -> Callable[..., Path]:
    """``render_page(html_path, out=None, size=(1280, 2000)) -> PNG``: a headless-chromium
    screenshot of the page, asserted not blank (skips where chromium is absent)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed: no screenshot")

    def render(html_path: Path, out: Path | None = None, size: tuple[int, int] = (1280, 2000)) -> Path:
        out = out or tmp_path / f"{Path(html_path).stem}_screenshot.png"
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--screenshot={out}", f"--window-size={size[0]},{size[1]}", Path(html_path).resolve().as_uri()]
        subprocess.run(cmd, capture_output=True, timeout=60, check=False)
        assert out.is_file(), f"chromium wrote no screenshot of {html_path}"
        colours, spread = screenshot_stats(out)
        assert colours > 50 and spread > 10, f"blank screenshot of {html_path}: {colours} colours, std {spread:.1f}"
        return out

    return render
