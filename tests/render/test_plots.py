"""Roofline and breakdown charts of the shipped example, and ``--plot`` PNG/SVG files."""

from __future__ import annotations

import copy
import itertools
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from kerneltriage.cli import main
from kerneltriage.errors import InputError
from kerneltriage.render.breakdown import breakdown_figure, breakdown_items
from kerneltriage.render.canvas import VERDICT_COLORS
from kerneltriage.render.roofline_chart import check_plot_path, roofline_figure, roofline_svg, save_roofline
from kerneltriage.render.roofline_layout import MAX_LABELS, hot_points, roofline_data
from kerneltriage.render.text import times

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "runs" / "gpt-naive-h200"


@pytest.fixture(scope="module")
def report(example_report):
    return example_report


@pytest.fixture(scope="module")
def figure(report):
    return roofline_figure(report)


def placeable(report):
    return [
        c
        for c in report.candidates
        if (c.roofline.intensity or 0) > 0 and (c.roofline.achieved_tflops or 0) > 0
    ]


def by_gid(fig, prefix):
    artists = fig.findobj() + [
        t.arrow_patch for ax in fig.axes for t in ax.texts if getattr(t, "arrow_patch", None)
    ]
    return {a.get_gid()[len(prefix) :]: a for a in artists if (a.get_gid() or "").startswith(prefix)}


def test_importing_the_report_package_stays_light():
    code = (
        "import sys, kerneltriage.render, kerneltriage.render.roofline_chart, kerneltriage.render.breakdown, "
        "kerneltriage.render.html; "
        "assert 'matplotlib' not in sys.modules and 'jinja2' not in sys.modules, 'imported eagerly'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_roofline_data(report):
    data = roofline_data(report)
    expected = placeable(report)
    assert [p.id for p in data.points] == [c.id for c in expected]
    assert {c.id for c, _ in data.not_placed} == {c.id for c in report.candidates} - {c.id for c in expected}
    assert data.not_placed and all(why for _, why in data.not_placed)
    # The roofs are the ceilings the report used (measured by the run's calibration, else
    # datasheet × achievable), no longer the datasheet peaks.
    bw = report.gpu.ceiling_bandwidth_gbs / 1000
    assert data.bandwidth_tbs == pytest.approx(bw)
    assert set(data.roofs) == {c.roofline.precision for c in expected}
    assert len(data.roofs) >= 2  # the example mixes bf16 GEMMs with fp32/fp16 memory-bound ops
    for precision, peak in data.roofs.items():
        assert peak == report.gpu.ceiling_tflops[precision]
    for p in data.points:
        c = p.candidate
        r = c.roofline
        # A fused region with counters sits where it runs today (its FLOPs over the DRAM bytes
        # ncu measured); its arrow ends at the fused intensity. Anything else: at its intensity.
        today = r.flops / r.measured_dram_bytes if p.measured else r.intensity
        assert (p.intensity, p.achieved) == pytest.approx((today, r.achieved_tflops))
        assert p.ceiling_intensity == r.intensity
        assert p.measured == bool(p.fused and r.measured_dram_bytes)
        assert p.ceiling == pytest.approx(r.achieved_tflops * c.headroom)
        roof = min(report.gpu.ceiling_tflops[r.precision], r.intensity * bw)
        assert p.roof == pytest.approx(roof)
        assert p.ceiling <= roof * 1.001  # a ceiling is never above the roof
        assert p.fused == (r.source == "fused estimate")
        if r.source in ("ncu", "ncu+estimate"):  # a measured point is never above its roof
            assert p.achieved <= min(report.gpu.ceiling_tflops[p.precision], p.intensity * bw) * 1.001, p.id
    c1 = next(p for p in data.points if p.id == "C1")
    peak = report.gpu.ceiling_tflops[c1.precision]
    assert c1.fused and c1.ceiling == pytest.approx(peak, rel=1e-3)  # up to its compute roof
    # Naive attention today: ncu measured ~95 GB of DRAM traffic per step, so it sits near the
    # memory roof at a few FLOP/B, not at the ~590 FLOP/B of one fused kernel.
    assert c1.measured and 3 < c1.intensity < 8 and c1.ceiling_intensity > 500
    assert c1.achieved / (c1.intensity * bw) > 0.5


def test_roofline_figure(report, figure):
    ax = figure.axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    data = roofline_data(report)
    at = {p.id: p for p in data.points}
    x0, x1 = ax.get_xlim()
    y0, y1 = ax.get_ylim()
    # The axes span the hot candidates; the cold _foreach_add_ (0.0% of the step at ~1e-5
    # TFLOP/s) would add three empty decades: it is drawn at the bottom edge instead.
    cold = [p for p in data.points if not (y0 < p.achieved < y1 and x0 < p.intensity < x1)]
    foreach = next(c.id for c in report.candidates if "_foreach_add_" in c.name)
    assert [p.id for p in cold] == [foreach] and cold[0] not in hot_points(data.points)
    assert y0 >= 0.01 and cold[0].achieved < 1e-4
    for p in data.points:  # every other point and ceiling inside the axes
        if p in cold:
            continue
        assert x0 < p.intensity < x1
        assert y0 < p.achieved < y1
        assert p.ceiling is None or p.ceiling < y1
    points = by_gid(figure, "kt-point-")
    assert sorted(points) == sorted(c.id for c in placeable(report))
    for ident, artist in points.items():
        c = report.candidate(ident)
        (x, y) = artist.get_offsets()[0]
        if ident == foreach:  # clamped just inside the bottom-left corner, a triangle pointing down
            assert y0 < y < y0 * 1.3 and x0 < x < x0 * 1.3
            assert artist.get_paths()[0].vertices.shape != points["C1"].get_paths()[0].vertices.shape
            continue
        assert (x, y) == pytest.approx((at[ident].intensity, c.roofline.achieved_tflops))
        color = VERDICT_COLORS[c.verdict]
        rgb = tuple(int(color[i : i + 2], 16) / 255 for i in (1, 3, 5))
        assert tuple(artist.get_facecolor()[0][:3]) == pytest.approx(rgb)
    # size by time share
    shares = sorted((c for c in placeable(report) if c.id != foreach), key=lambda c: -c.time_share)
    # area ∝ share (diamonds drawn at 0.8 of the area: they look bigger than circles)
    sizes = [
        points[c.id].get_sizes()[0] / (0.8 if c.roofline.source == "fused estimate" else 1) for c in shares
    ]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > 4 * sizes[-1]
    # arrows from the point up to the ceiling
    arrows = by_gid(figure, "kt-arrow-")
    assert "C1" in arrows and "C2" in arrows
    assert foreach not in arrows  # no arrow from a point drawn at the edge
    ann = next(a for a in ax.texts if getattr(a, "arrow_patch", None) is arrows["C1"])
    c1 = report.candidate("C1")
    # from where naive attention runs today to its fused ceiling
    assert ann.xy == pytest.approx((c1.roofline.intensity, c1.roofline.achieved_tflops * c1.headroom))
    assert ann.xyann == pytest.approx((at["C1"].intensity, c1.roofline.achieved_tflops))
    assert ann.xyann[0] < ann.xy[0] / 50
    # roof labels: the memory roof and one compute roof per precision used
    texts = [t.get_text() for t in ax.texts]
    # (the roofs are the ceilings the report used, not the datasheet peaks)
    assert f"memory roof {report.gpu.ceiling_bandwidth_gbs / 1000:.3g} TB/s" in texts
    used = {c.roofline.precision for c in placeable(report)}
    for precision, peak in report.gpu.ceiling_tflops.items():
        assert (f"{precision} ceiling {peak:,.4g} TFLOP/s" in texts) == (precision in used), precision


def text_box(t, renderer):
    """The box of a text alone (an annotation's own box takes in its leader line)."""
    t.get_window_extent(renderer)  # places an annotation's text
    return Text.get_window_extent(t, renderer)


def test_labels_name_the_top_candidates_without_overlap(report, figure):
    labels = by_gid(figure, "kt-label-")
    actionable = [c.id for c in report.candidates if c.verdict != "skip"]
    assert set(actionable) <= set(labels)
    assert len(labels) == min(MAX_LABELS, len(placeable(report)))
    assert labels["C1"].get_text() == f"C1 {times(report.candidate('C1').headroom)}"
    renderer = figure.canvas.get_renderer()
    # No text on the chart (id labels, roof labels) touches another, and no leader line
    # crosses a text other than its own label.
    ax = figure.axes[0]
    boxes = {t.get_text(): text_box(t, renderer) for t in ax.texts if t.get_text()}
    assert set(boxes) >= {a.get_text() for a in labels.values()}
    for (a, box_a), (b, box_b) in itertools.combinations(boxes.items(), 2):
        assert not box_a.overlaps(box_b), (a, b)
    for label in labels.values():
        if label.arrow_patch is None:
            continue
        line = label.arrow_patch.get_path()
        crossed = [t for t, box in boxes.items() if t != label.get_text() and line.intersects_bbox(box)]
        assert not crossed, (label.get_text(), crossed)
    # the key under the standalone chart names them
    key = [t.get_text() for t in figure.texts]
    assert any(t.startswith("C1  attention (naive, causal)") for t in key)
    unplaced = [c.id for c in report.candidates if c not in placeable(report)]
    assert unplaced and any(t.startswith("Not placed: ") and all(i in t for i in unplaced[:3]) for t in key)
    foreach = next(c.id for c in report.candidates if "_foreach_add_" in c.name)
    assert any(t.startswith(f"Off the chart, drawn at its edge: {foreach} (") for t in key)


def test_crowded_labels_never_overlap(report):
    """Eight actionable candidates on one spot (the GEMM cluster): every label that is drawn
    stays clear of every other text; one with no clear place is left to the key."""
    crowded = copy.deepcopy(report)
    gemms = [c for c in crowded.candidates if c.kind == "gemm"]
    anchor = gemms[0].roofline
    for c in crowded.candidates[:8]:
        c.roofline = copy.deepcopy(anchor)
        c.roofline.intensity *= 1.0 + 0.02 * crowded.candidates.index(c)
        c.verdict, c.headroom = "compile", 2.5
    fig = roofline_figure(crowded)
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    boxes = {t.get_text(): text_box(t, renderer) for t in ax.texts if t.get_text()}
    labels = by_gid(fig, "kt-label-")
    assert len(labels) >= 6  # most find a place
    for (a, box_a), (b, box_b) in itertools.combinations(boxes.items(), 2):
        assert not box_a.overlaps(box_b), (a, b)
    key = "\n".join(t.get_text() for t in fig.texts)
    for c in crowded.candidates[:8]:
        assert f"{c.id}  " in key  # labelled on the chart or not, the key names each


def test_breakdown_figure(report):
    fig = breakdown_figure(report)
    segments = by_gid(fig, "kt-kind-")
    kinds = {k for k, v in report.kind_breakdown.items() if v > 0}
    assert set(segments) == kinds
    widths = {k: s.get_width() for k, s in segments.items()}
    assert widths == pytest.approx(report.kind_breakdown)
    assert sum(widths.values()) == pytest.approx(report.step_time_ms, rel=1e-3)
    assert [k for k, _ in breakdown_items(report)][-1] == "idle"
    assert segments["idle"].get_hatch() == "///"


def test_inline_svg(report):
    svg = roofline_svg(report)
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert "http" not in svg and "<metadata" not in svg and "<?xml" not in svg
    assert 'target="_blank"' not in svg
    assert svg.count('<g id="kt-point-') == len(placeable(report))
    assert 'width="100%"' in svg and "viewBox=" in svg
    assert '<g id="kt-off-chart">' in svg  # no key under the inline chart: the chart says it


def test_save_png(report, tmp_path):
    path = save_roofline(report, tmp_path / "roofline.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    with Image.open(path) as img:
        assert img.size[0] == 1500 and img.size[1] > 1100  # 10 in wide at 150 dpi, taller with the key
    assert check_plot_path("ROOFLINE.PNG").name == "ROOFLINE.PNG"  # any case
    assert check_plot_path("out/roofline.Svg").suffix == ".Svg"


def test_save_svg(report, tmp_path):
    path = save_roofline(report, tmp_path / "roofline.svg")
    text = path.read_text()
    root = ET.fromstring(text.encode())  # well-formed: the hover titles are escaped
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    ns = {"svg": "http://www.w3.org/2000/svg"}
    groups = {g.get("id"): g for g in root.iter("{http://www.w3.org/2000/svg}g")}
    for c in placeable(report):
        title = groups[f"kt-point-{c.id}"].find("svg:title", ns)
        assert title is not None and title.text.startswith(f"{c.id}  {c.name}")
    assert "<a " not in text  # no links to #C1 outside the HTML


def test_save_rejects_other_suffixes(report, tmp_path):
    for name in ("roofline.pdf", "roofline", "roofline.jpg"):
        with pytest.raises(InputError, match=r"\.png or \.svg") as info:
            save_roofline(report, tmp_path / name)
        assert info.value.exit_code == 2
        assert not (tmp_path / name).exists()
    with pytest.raises(InputError, match="cannot write the plot"):
        save_roofline(report, tmp_path / "missing" / "dir" / "roofline.png")


def test_hostile_names_stay_escaped_in_svg(report, tmp_path):
    hostile = copy.deepcopy(report)
    hostile.candidates[0].name = "a<b & </title><script>x</script>"
    path = save_roofline(hostile, tmp_path / "x.svg")
    text = path.read_text()
    ET.fromstring(text.encode())
    assert "<script>" not in text
    assert "a&lt;b &amp; &lt;/title&gt;&lt;script&gt;" in text


def test_degenerate_reports_still_draw(report, tmp_path):
    unplaced = copy.deepcopy(report)
    for c in unplaced.candidates:
        c.roofline.intensity = None
    fig = roofline_figure(unplaced)
    assert not by_gid(fig, "kt-point-")
    assert save_roofline(unplaced, tmp_path / "empty.svg").exists()
    empty = copy.deepcopy(report)
    empty.candidates = []
    empty.kind_breakdown = {}
    assert save_roofline(empty, tmp_path / "empty.png").exists()
    breakdown_figure(empty)


@pytest.mark.parametrize("name", ["roofline.png", "roofline.svg"])
def test_cli_plot(tmp_path, name):
    out = tmp_path / name
    result = CliRunner().invoke(main, ["report", str(EXAMPLE), "--format", "json", "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output
    head = out.read_bytes()[:64]
    assert head.startswith(b"\x89PNG") if name.endswith(".png") else b"<svg" in out.read_bytes()[:1000]


def test_cli_plot_pdf_is_an_input_error(tmp_path):
    out = tmp_path / "roofline.pdf"
    result = CliRunner().invoke(main, ["report", str(EXAMPLE), "--format", "json", "--plot", str(out)])
    assert result.exit_code == 2
    assert "kerneltriage: error:" in result.output and ".png or .svg" in result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_roof_labels_stay_clear_of_points_and_above_arrows():
    """Gemma2 on an H100: GEMMs sit at the bf16 roof's right end and the attention's arrow rises
    through the fp16 and fp32 roofs. Each roof label goes where no point covers it, and an
    arrow that must cross one passes behind it."""
    import kerneltriage

    fig = roofline_figure(kerneltriage.report(ROOT / "examples" / "runs" / "gemma2-h100"))
    renderer = fig.canvas.get_renderer()
    labels = by_gid(fig, "kt-roof-label-")
    assert set(labels) == {"bf16", "fp16", "fp32"}
    points = {}
    for gid, p in by_gid(fig, "kt-point-").items():  # each marker's box: its centre ± its radius
        (x, y), r = p.get_offset_transform().transform(p.get_offsets())[0], p.get_sizes()[0] ** 0.5 / 2
        r *= fig.dpi / 72
        points[gid] = Bbox.from_extents(x - r, y - r, x + r, y + r)
    arrows = by_gid(fig, "kt-arrow-")
    for precision, label in labels.items():
        box = text_box(label, renderer)
        # at most the rim of a point under a corner, and the label drawn over it
        covered = sum(
            max(0.0, min(box.x1, p.x1) - max(box.x0, p.x0)) * max(0.0, min(box.y1, p.y1) - max(box.y0, p.y0))
            for p in points.values()
        )
        assert covered < 0.03 * box.width * box.height, precision
        for artist in [*arrows.values(), *by_gid(fig, "kt-point-").values()]:
            assert label.get_zorder() > artist.get_zorder()
        assert label.get_bbox_patch() is not None  # the backdrop that keeps it legible
    # the fp16 and fp32 labels no longer lie across the attention's arrow
    c1 = arrows["C1"].get_window_extent(renderer)
    for precision in ("fp16", "fp32"):
        assert not text_box(labels[precision], renderer).overlaps(c1), precision
