"""``kerneltriage diff`` rendered: a slowdown reads as one, the HTML page is styled like the
report and charts the predicted against the realized saving. The runs are the shipped GPT on
an H200 with naive attention and with SDPA, compared in both directions."""

from __future__ import annotations

import csv
import io
import re

import pytest
from markupsafe import escape

from kerneltriage.analysis.compare.diff import compare
from kerneltriage.analysis.frames import DIFF_COLUMNS
from kerneltriage.render.diff_render import render_diff, saving_text, step_change_text


@pytest.fixture(scope="module")
def sides(example_report, sdpa_report):
    return example_report, sdpa_report


@pytest.fixture(scope="module")
def faster(sides):
    return compare(sides[0], sides[1], ("naive", "sdpa"))


@pytest.fixture(scope="module")
def slower(sides):
    return compare(sides[1], sides[0], ("sdpa", "naive"))


def test_saving_text():
    assert saving_text(0.64) == "64.0%"
    assert saving_text(-0.062) == "+6.2% slower"
    assert saving_text(-0.0001) == "0.0%"  # no "-0.0%"


def test_a_slowdown_reads_as_a_slowdown(faster, slower):
    assert step_change_text(faster) == "64.0% saved"
    assert step_change_text(slower) == f"+{100 * -slower.step_saving_share:.1f}% slower"
    for fmt in ("terminal", "markdown"):
        text = render_diff(slower, fmt)
        assert "(+178.1% slower)" in text and "saved)" not in text
        assert not re.search(r"-\d+\.\d%", text)  # no negative saving anywhere
    attention = next(m for m in slower.candidates if m.kind == "attention")
    assert attention.realized_saving_share < -1
    assert f"| {saving_text(attention.realized_saving_share)} |" in render_diff(slower, "markdown")


def test_html_is_styled_like_the_report_and_charts_the_savings(faster):
    page = render_diff(faster, "html")
    assert page.startswith("<!DOCTYPE html>") and "http" not in page and "<script" not in page
    assert ".pill.v-use-builtin" in page and "section.candidate" in page  # the report's stylesheet
    chart = page[page.index('<section id="chart">') : page.index('<section id="candidates">')]
    assert chart.count("<svg") == 1
    attention = next(m for m in faster.candidates if m.kind == "attention")
    first = re.search(r'<g id="kt-diff-0">\s*<title>([^<]*)</title>', chart)
    assert first and first.group(1).startswith(str(escape(attention.name)))
    assert f"predicted {100 * attention.predicted_saving_share:.1f}%" in first.group(1)
    assert f"realized {100 * attention.realized_saving_share:.1f}%" in first.group(1)
    assert '<g id="kt-diff-0-predicted">' in chart
    table = page[page.index('<section id="candidates">') : page.index('<section id="kinds">')]
    assert table.count("<tr>") == len(faster.candidates) + 1
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(ids) == len(set(ids))


def test_html_marks_a_slowdown(slower):
    page = render_diff(slower, "html")
    assert '<dd class="fail"><strong>+178.1% slower</strong></dd>' in page
    assert '<td class="num slower">' in page


def test_csv(faster):
    rows = list(csv.DictReader(io.StringIO(render_diff(faster, "csv"))))
    assert list(rows[0]) == list(DIFF_COLUMNS) and len(rows) == len(faster.candidates)
    attention = next(r for r in rows if r["kind"] == "attention")
    assert float(attention["realized_saving_share"]) > 0.5
