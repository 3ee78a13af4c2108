"""A multi-rank run rendered (examples/runs/gpt-ddp-2gpu-h200, two H200s under DDP): the
summary across ranks as real tables in every format, one HTML document, per-rank sections,
scaffold commands that name their rank."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from kerneltriage.analysis.compare.ranks import summarize
from kerneltriage.analysis.frames import CANDIDATE_COLUMNS
from kerneltriage.render.ranks_render import render_rank_reports

ROOT = Path(__file__).resolve().parents[2]
DDP = ROOT / "examples" / "runs" / "gpt-ddp-2gpu-h200"
REF = "examples/runs/gpt-ddp-2gpu-h200"


@pytest.fixture(scope="module")
def reports(ddp_reports):
    return ddp_reports


@pytest.fixture(scope="module")
def summary(reports):
    return summarize(reports)


def render(summary, reports, fmt, **kw):
    return render_rank_reports(summary, reports, fmt, run_ref=REF, color=False, **kw)


def norm_ids(reports) -> dict[int, str]:
    """The eager residual-add + RMSNorm region's id on each rank: ids are numbered per rank."""
    return {
        r: next(c.id for c in rep.candidates if c.name.startswith("residual add + RMSNorm"))
        for r, rep in reports.items()
    }


def test_the_example_numbers_ids_per_rank(reports):
    ids = norm_ids(reports)
    assert ids[0] != ids[1]  # what the summary's "id by rank" is for


def test_html_is_one_document_with_a_section_per_rank(summary, reports):
    page = render(summary, reports, "html")
    assert page.count("<!DOCTYPE html>") == 1 and page.count("<body>") == 1
    assert "|---" not in page and "=== rank" not in page
    ranks = page[page.index('<section id="ranks">') : page.index('<section class="rank" id="rank-0">')]
    assert ranks.count("<table") == 2
    for row in summary.ranks:
        assert f'<a href="#rank-{row.rank}">{row.rank}</a>' in ranks
    ids = norm_ids(reports)
    for r, ident in ids.items():
        assert f'{r}: <a href="#r{r}-{ident}">{ident}</a>' in ranks
    # every id once, every in-page link lands
    all_ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(all_ids) == len(set(all_ids))
    assert set(re.findall(r'href="#([^"]+)"', page)) <= set(all_ids)
    for r, rep in reports.items():
        start = page.index(f'<section class="rank" id="rank-{r}">')
        end = page.index('<section class="rank" id="rank-1">') if r == 0 else len(page)
        part = page[start:end]
        assert part.count("<svg") == 2  # its roofline and its breakdown
        assert f'<g id="r{r}-kt-point-C1">' in part
        for c in rep.candidates:
            assert f'<section class="candidate" id="r{r}-{c.id}">' in part
        offered = [
            c
            for c in rep.candidates
            if not (c.verdict == "skip" and c.reason in ("not-a-kernel", "communication"))
        ]
        assert part.count("kerneltriage scaffold ") == len(offered) < len(rep.candidates)  # not NCCL
        assert f"kerneltriage scaffold {REF} C1 --rank {r}" in part
        assert f"step time</dt><dd><strong>{rep.step_time_ms:.2f} ms" in part


def test_terminal_summary_is_rich_tables(summary, reports):
    text = render(summary, reports, "terminal", width=140)
    head = text[: text.index("rank 0 ═")]
    assert "|---" not in head and "| rank |" not in head
    assert head.startswith("kerneltriage report — 2 ranks")
    assert head.count("┏") == 2 and "┃ rank ┃ step time ┃" in head
    ids = norm_ids(reports)
    lines = head.splitlines()
    at = next(i for i, line in enumerate(lines) if "residual add + RMSNorm" in line)
    assert f"│ 0: {ids[0]} " in lines[at] and f"│ 1: {ids[1]} " in lines[at + 1]
    assert "═ rank 1 ═" in text
    assert f"start      kerneltriage scaffold {REF} C1 --rank 1" in text


def test_markdown_has_tables_and_a_section_per_rank(summary, reports):
    text = render(summary, reports, "markdown")
    assert text.startswith(f"# kerneltriage report: `{DDP}` (2 ranks)")
    head = "| rank | step time | GPU busy | communication | exposed communication | timed on (interval) | comm. wait / transfer |"
    assert head + "\n|---:|---:|---:|---:|---:|---:|---:|\n" in text
    # The shipped run has no plain steps; its collectives are matched across the two ranks.
    assert "| recorded steps | 1.36 ms / 2.15 ms |" in text
    assert text.index("## Ranks") < text.index("# Rank 0") < text.index("# Rank 1")
    assert f"- start: `kerneltriage scaffold {REF} C1 --rank 0`" in text


def test_csv_has_every_ranks_candidates(summary, reports):
    rows = list(csv.DictReader(io.StringIO(render(summary, reports, "csv", top=5))))
    assert list(rows[0]) == ["process_rank", *CANDIDATE_COLUMNS]
    assert [r["process_rank"] for r in rows] == ["0"] * 5 + ["1"] * 5
    ids = norm_ids(reports)
    for r, ident in ids.items():
        assert any(x["process_rank"] == str(r) and x["id"] == ident for x in rows)


def test_json_schema(summary, reports):
    data = json.loads(render(summary, reports, "json"))
    assert (
        data["schema"] == "kerneltriage.report-ranks/1"
        and data["summary"]["schema"] == "kerneltriage.ranks/1"
    )
    assert sorted(data["ranks"]) == ["0", "1"]
    assert data["ranks"]["1"]["schema"] == "kerneltriage.report/1"
