"""What a person sees: the HTML report and the SVG plot opened in headless Chromium (offline:
every host name fails to resolve), and the PNG plot, checked to be real pictures, not blank.

Needs Chromium (Debian: ``apt-get install -y chromium``, binary /usr/bin/chromium) or
KERNELTRIAGE_CHROMIUM pointing at a Chromium/Chrome binary. Without one the tests fail with
that message; they are never skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from kerneltriage.render.html import html
from kerneltriage.render.roofline_chart import save_roofline

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "runs" / "gpt-naive-h200"
ROOF_FILL = (0xF3, 0xF6, 0xFA)  # the shaded area under the roof, only in the roofline chart
ATTENTION = (0x4E, 0x79, 0xA7)  # the attention segment, only in the breakdown chart
USE_BUILTIN = (0x21, 0x66, 0xAC)  # the C1 point (blended with the roof fill by its alpha)


@pytest.fixture(scope="module")
def chromium() -> str:
    found = os.environ.get("KERNELTRIAGE_CHROMIUM") or next(
        (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
        None,
    )
    if not found or not os.access(found, os.X_OK):
        pytest.fail(
            "headless Chromium is needed for the screenshot tests and was not found: "
            "apt-get install -y chromium (Debian package, binary /usr/bin/chromium), "
            "or set KERNELTRIAGE_CHROMIUM to a Chromium binary",
            pytrace=False,
        )
    return found


@pytest.fixture(scope="module")
def report(example_report):
    return example_report


def screenshot(chromium: str, target: Path, out: Path, size: tuple[int, int]) -> np.ndarray:
    profile = out.parent / f"{out.stem}-profile"
    profile.mkdir()
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-quic",
        "--hide-scrollbars",
        "--host-resolver-rules=MAP * ~NOTFOUND",  # offline: any URL the page needed would fail
        f"--user-data-dir={profile}",
        f"--screenshot={out}",
        f"--window-size={size[0]},{size[1]}",
        target.resolve().as_uri(),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"chromium did not finish a screenshot of {target.name} in 90 s", pytrace=False)
    assert out.exists(), f"chromium wrote no screenshot (exit {done.returncode}):\n{done.stderr[-2000:]}"
    return load(out)


def load(path: Path) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB")).astype(np.int16)


def count_near(img: np.ndarray, rgb: tuple[int, int, int], tolerance: int) -> int:
    return int((np.abs(img - np.array(rgb)).max(axis=2) <= tolerance).sum())


def assert_picture(img: np.ndarray, *, min_size: tuple[int, int]) -> None:
    """Not blank: big enough, varied, many colours, a fair amount of ink on white."""
    height, width, _ = img.shape
    assert width >= min_size[0] and height >= min_size[1], img.shape
    assert img.std() > 15, f"nearly uniform image (std {img.std():.1f})"
    packed = (img[..., 0].astype(np.int32) << 16) | (img[..., 1].astype(np.int32) << 8) | img[..., 2]
    colours = len(np.unique(packed))
    assert colours >= 200, f"only {colours} distinct colours"
    ink = float((img.min(axis=2) < 200).mean())
    assert ink > 0.03, f"only {ink:.1%} of the pixels are not near-white"


def test_html_report_renders(chromium, report, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(html(report, run_ref="examples/runs/gpt-naive-h200"), encoding="utf-8")
    img = screenshot(chromium, page, tmp_path / "report.png", (1400, 2600))
    assert_picture(img, min_size=(1400, 2600))
    # both inline SVG charts were drawn: the roof's shaded area and the attention segment
    assert count_near(img, ROOF_FILL, 1) > 100_000
    assert count_near(img, ATTENTION, 2) > 20_000
    # the header is at the top: the first rows are not empty
    assert (img[:120].min(axis=2) < 128).sum() > 500


def test_svg_plot_renders(chromium, report, tmp_path):
    svg = save_roofline(report, tmp_path / "roofline.svg")
    img = screenshot(chromium, svg, tmp_path / "svg.png", (1000, 880))
    assert_picture(img, min_size=(1000, 880))
    assert count_near(img, ROOF_FILL, 1) > 150_000
    assert count_near(img, USE_BUILTIN, 40) > 400


def test_png_plot_is_a_picture(report, tmp_path):
    png = save_roofline(report, tmp_path / "roofline.png")
    img = load(png)
    assert_picture(img, min_size=(1200, 1000))
    assert count_near(img, ROOF_FILL, 1) > 300_000
    assert count_near(img, USE_BUILTIN, 40) > 800


def test_blank_images_fail_the_check(tmp_path):
    """The not-blank check itself: a white page and a two-colour page do not pass."""
    white = np.full((900, 1200, 3), 255, dtype=np.int16)
    with pytest.raises(AssertionError):
        assert_picture(white, min_size=(100, 100))
    stripes = white.copy()
    stripes[::4] = 0
    with pytest.raises(AssertionError, match="distinct colours"):
        assert_picture(stripes, min_size=(100, 100))
