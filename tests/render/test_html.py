"""The HTML report of the shipped example: self-contained, the charts, every candidate, escaping."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from markupsafe import escape

from kerneltriage.analysis.model import Gap
from kerneltriage.analysis.rules import load_rules
from kerneltriage.analysis.triage import idle_by_class
from kerneltriage.cli import main
from kerneltriage.render import render
from kerneltriage.render.gpu_text import precision_label, tflops_text
from kerneltriage.render.html import breakable, html
from kerneltriage.render.text import headroom_text, ms, pct

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "runs" / "gpt-naive-h200"
RUN_REF = "examples/runs/gpt-naive-h200"


@pytest.fixture(scope="module")
def report(example_report):
    return example_report


@pytest.fixture(scope="module")
def page(report):
    return html(report, run_ref=RUN_REF)


def placed_ids(report) -> list[str]:
    """Candidates that have a place on a log-log roofline (worked out here, not by roofline_layout.py)."""
    return [
        c.id
        for c in report.candidates
        if c.roofline.intensity
        and c.roofline.intensity > 0
        and c.roofline.achieved_tflops
        and c.roofline.achieved_tflops > 0
    ]


def section(page: str, ident: str) -> str:
    """The detail section of one candidate."""
    start = page.index(f'<section class="candidate" id="{ident}">')
    return page[start : page.index("</section>", start)]


def test_self_contained(page):
    assert page.startswith("<!DOCTYPE html>")
    for bad in ("http://", "https://", 'src="//', "<script", "<link", "@import", "<img", "<iframe"):
        assert bad not in page, bad
    assert not re.search(r"\ssrc=", page)
    # the only url() references are to ids inside the page (clip paths)
    assert all(ref.startswith("#") for ref in re.findall(r"url\(([^)]*)\)", page))
    assert "<style>" in page


def test_roofline_has_a_point_per_placed_candidate(report, page):
    placed = placed_ids(report)
    assert len(placed) >= 10  # the example places most of its candidates
    points = re.findall(r'<g id="kt-point-(C\d+)"', page)
    assert sorted(points) == sorted(placed)
    roofline = page[page.index('<section id="roofline">') : page.index('<section id="breakdown">')]
    assert roofline.count("<svg") == 1
    for ident in placed:
        c = report.candidate(ident)
        # hover text: the first child of the point's group, with its name and numbers
        match = re.search(rf'<g id="kt-point-{ident}">\s*<title>([^<]*)</title>', roofline)
        assert match, ident
        title = match.group(1)
        assert title.startswith(f"{ident}  {escape(c.name)}")
        assert f"achieved {c.roofline.achieved_tflops:.3g} TFLOP/s" in title
        # the point links to its detail section
        group = roofline[match.start() : roofline.index("</g>\n   </g>", match.start())]
        assert f'xlink:href="#{ident}"' in group
    # an arrow up to the ceiling for each placed candidate with headroom
    arrows = re.findall(r'<g id="kt-arrow-(C\d+)"', roofline)
    want = [i for i in placed if (report.candidate(i).headroom or 0) > 1.02]
    assert sorted(arrows) == sorted(want)


def test_not_placed_are_listed_under_the_chart(report, page):
    placed = set(placed_ids(report))
    missing = [c.id for c in report.candidates if c.id not in placed]
    assert missing  # the example has some (randint, embedding, _foreach_add_)
    start = page.index('id="not-placed"')
    listing = page[start : page.index("</ul>", start)]
    for ident in missing:
        assert f'<a href="#{ident}">{ident}</a>' in listing
    for ident in placed:
        assert f'<a href="#{ident}">' not in listing


def test_every_candidate_in_table_and_details(report, page):
    table = page[page.index('<table class="verdicts">') : page.index('<section id="details">')]
    details = page[page.index('<section id="details">') :]
    assert table.count("<tr class=") == len(report.candidates)
    memcpy = [c for c in report.candidates if c.reason == "not-a-kernel"]
    assert memcpy and all(
        c.kind == "memcpy" and c.verdict == "skip" for c in memcpy
    )  # the example's aten::to
    for c in report.candidates:
        assert f'<td><a href="#{c.id}">{c.id}</a></td>' in table
        full = escape(c.full_name or c.name)
        assert f'<a href="#{c.id}" title="{full}">{breakable(c.name)}</a>' in table  # full name on hover
        assert f'id="{c.id}"' in details
        body = section(page, c.id)
        assert str(escape(c.name)) in body
        if c.verdict == "skip" and c.reason in ("not-a-kernel", "communication"):
            # a copy or a collective is no kernel: no scaffold offered, not even "anyway"
            assert "kerneltriage scaffold" not in body and "Start" not in body
        else:
            assert f"kerneltriage scaffold {RUN_REF} {c.id}" in body
        assert body.count('class="kname mono"') == len(c.kernels)
        for s in c.shapes.signatures:
            assert f'<td class="mono">{escape(s["shape"])}</td>' in body
            assert f'<td class="num">{s["count"]}</td>' in body
        for name in ("headroom", "hotness", "stability"):
            assert f"<b>{name}</b>" in body
    # table rows follow the report's ranking
    ranked = re.findall(r'<td><a href="#(C\d+)">C\d+</a></td>', table)
    assert ranked == [c.id for c in report.candidates]


def test_detail_numbers(report, page):
    c1 = report.candidates[0]
    body = section(page, c1.id)
    assert c1.verdict != "skip" and c1.builtin  # the example's headline: use the library op
    assert f'<span class="mono">{escape(c1.builtin)}</span>' in body
    assert f'<td class="num">{headroom_text(c1)}</td>' in body
    assert f"{c1.roofline.intensity:.3g} FLOP/B" in body
    assert f"{c1.roofline.achieved_tflops:.3g} TFLOP/s" in body
    assert f'<td class="num">{ms(c1.roofline.ceiling_ms)}</td>' in body
    assert c1.roofline.source == "fused estimate"
    assert "fused estimate (external inputs/outputs only)" in body
    assert "<details open>" in body  # actionable: expanded
    skip = next(c for c in report.candidates if c.verdict == "skip")
    assert "<details open>" not in section(page, skip.id)
    assert "Start anyway" in section(page, skip.id)


def test_breakdown_chart(report, page):
    part = page[page.index('<section id="breakdown">') : page.index('<section id="candidates">')]
    assert part.count("<svg") == 1
    kinds = [k for k, v in report.kind_breakdown.items() if v > 0]
    assert "idle" in kinds
    for kind in kinds:
        assert f'<g id="kt-kind-{kind}">' in part, kind
    assert part.count('<g id="kt-kind-') == len(kinds)
    attention = report.kind_breakdown["attention"]
    assert f"{ms(attention)}</td>" in part
    assert f"{pct(attention / sum(report.kind_breakdown.values()))}</td>" in part
    # ids inside the two inline SVGs do not collide
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(ids) == len(set(ids))


def test_header(report, page):
    header = page[: page.index('<section id="roofline">')]
    gpu = report.gpu
    assert gpu.name in header
    # The example run was calibrated on its GPU: the badge says the ceilings were measured.
    badge = "measured" if gpu.source.startswith("measured") else "datasheet"
    assert f">{badge}</span>" in header
    assert gpu.source.startswith("measured")
    # The ceilings the report used (measured, else datasheet × achievable), not the datasheet's.
    assert f"memory {gpu.ceiling_bandwidth_gbs:,.0f} GB/s" in header
    for precision, ceiling in gpu.ceiling_tflops.items():
        assert f"{precision_label(gpu, precision)} {tflops_text(ceiling)} TFLOP/s" in header
    # fp16 has two rates, named by their units: its CUDA-core rate is not fp16 itself being slow
    fp16 = gpu.ceiling_tflops
    assert f">fp16 vector {tflops_text(fp16['fp16'])} TFLOP/s<" in header
    assert f">fp16 tensor {tflops_text(fp16['fp16_tensor'])} TFLOP/s<" in header
    assert (
        ">fp16 " + tflops_text(fp16["fp16"]) not in header
        and "fp16_tensor" not in header.split("ceilings from")[0]
    )
    for name, version in report.source["versions"].items():
        assert f'{name} <span class="mono">{escape(version)}</span>' in header
    assert " ".join(report.source["command"]) in header
    assert f"{report.steps} ({report.step_source})" in header
    assert ms(report.step_time_ms) in header
    assert f"{report.join['rows_joined']}/{report.join['rows']} ncu rows joined" in header
    assert escape(report.warnings[0]) in header
    assert 'id="idle-warning"' not in page  # 4.5% idle is below the 10% threshold
    assert 'id="summary"' in header and "Worth acting on" in header


def test_idle_warning_comes_first(report):
    idle = copy.deepcopy(report)
    idle.idle_pct = 42.0
    idle.gaps = [Gap("host sync: cudaStreamSynchronize in aten::item", 8.0, 2.0, 5.5, kind="host sync")]
    step = idle.step_time_ms
    idle.idle = idle_by_class(step, 0.58 * step, idle.step_spread_ms, idle.gaps, 0.0, load_rules())
    assert idle.idle_bound
    assert "Led by host sync: 8.00 ms per step" in html(idle)
    text = html(idle)
    assert 'id="idle-warning"' in text
    assert "The GPU is idle 42% of the step" in text
    assert text.index('id="idle-warning"') < text.index('<dl class="facts">') < text.index('id="warnings"')
    assert idle.gaps and escape(idle.gaps[0].cause) in text  # the biggest gap's cause


def test_escapes_trace_text(report, page):
    kernels = [k for c in report.candidates for k in c.kernels if "<" in k.full_name]
    assert kernels  # C++ template names
    for k in kernels[:20]:
        assert str(escape(k.full_name)) in page
        assert k.full_name not in page
    hostile = copy.deepcopy(report)
    c = hostile.candidates[0]
    c.name = "</title><script>alert(1)</script> a<b & c"
    c.kernels[0].name = "<img src=x onerror=alert(2)>"
    c.shapes.signatures[0]["shape"] = "<svg onload=alert(3)>"
    text = html(hostile, run_ref="runs/<x>")
    for raw in ("<script>", "alert(1)</script>", "<img src=x", "<svg onload", "runs/<x>"):
        assert raw not in text, raw
    assert (
        "&lt;/title&gt;&lt;script&gt;alert(1)&lt;/script&gt; a&lt;b &amp; c" in text
    )  # table, details, SVG title
    assert text.count("&lt;/title&gt;&lt;script&gt;") >= 3


def test_top_limits_table_details_and_chart(report):
    text = html(report, top=3)
    first = [c.id for c in report.candidates[:3]]  # the ranking's first three, by expected saving
    assert re.findall(r'<section class="candidate" id="(C\d+)">', text) == first
    assert sorted(re.findall(r'<g id="kt-point-(C\d+)"', text)) == sorted(first)
    assert f"first 3 of {len(report.candidates)}" in text


def test_no_actionable_candidates(report):
    quiet = copy.deepcopy(report)
    for c in quiet.candidates:
        c.verdict, c.builtin = "skip", None
    text = html(quiet)
    assert "No candidate meets all three conditions" in text
    nothing = copy.deepcopy(report)
    nothing.candidates = []
    text = html(nothing)
    assert "<svg" in text and 'id="kt-point-' not in text


def test_render_dispatches_html(report, page):
    assert render(report, "html", run_ref=RUN_REF) == page


def test_cli_writes_html(tmp_path):
    out = tmp_path / "report.html"
    result = CliRunner().invoke(main, ["report", str(EXAMPLE), "--format", "html", "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert '<g id="kt-point-C1">' in text
    assert f"kerneltriage scaffold {EXAMPLE} C1" in text


def test_a_compiled_run_shows_its_graph_breaks_and_an_eager_run_no_compiled_section(page):
    from kerneltriage.api import report as build

    compiled = html(build(ROOT / "examples" / "runs" / "gpt2-compile-h100"))
    section = compiled[compiled.index('id="compiled"') :]
    section = section[: section.index("</div>")]
    assert "3 compiled region(s) per step" in section and "graph breaks: 0 per step" in section
    assert "break in GPT" not in section  # a wrapper and a resume stub are no graph break
    assert 'id="compiled"' not in page  # the eager example has no compiled code
