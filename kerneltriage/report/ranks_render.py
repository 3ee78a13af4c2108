"""Rendering of a multi-process run: the cross-rank summary, then each rank's own report.

JSON follows the schema ``kerneltriage.report-ranks/1``: ``{"schema", "summary" (the
``kerneltriage.ranks/1`` summary), "ranks": {rank: kerneltriage.report/1}}``.
"""

from __future__ import annotations

import json

from kerneltriage.analysis.model import Report
from kerneltriage.analysis.ranks import RankSummary
from kerneltriage.report.render import render
from kerneltriage.report.text import ms, pct

SCHEMA = "kerneltriage.report-ranks/1"


def render_rank_reports(
    summary: RankSummary,
    reports: dict[int, Report],
    fmt: str,
    *,
    top: int | None = None,
    run_ref: str = "RUN",
    color: bool | None = None,
) -> str:
    """Several ranks as ``fmt``: the summary across ranks, then each rank's report."""
    if fmt == "json":
        data = {
            "schema": SCHEMA,
            "summary": summary.to_json(),
            "ranks": {str(r): json.loads(render(rep, "json", top=top)) for r, rep in reports.items()},
        }
        return json.dumps(data, indent=2) + "\n"
    parts = [render_ranks(summary, "markdown" if fmt in ("markdown", "html") else "terminal", top or 10)]
    for rank, rep in reports.items():
        parts.append(f"\n=== rank {rank} ===\n" if fmt != "html" else "")
        parts.append(render(rep, fmt, top=top, run_ref=run_ref, color=color))
    return "".join(parts)


def render_ranks(summary: RankSummary, fmt: str, top: int = 10) -> str:
    """The summary across ranks as a Markdown (or plain) table."""
    md = fmt == "markdown"
    out = ["## Ranks" if md else "Ranks", ""]
    out += [
        "| rank | step time | GPU busy | communication | exposed communication |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in summary.ranks:
        out.append(
            f"| {r.rank} | {ms(r.step_time_ms)} | {r.gpu_busy_pct:.1f}% | {ms(r.communication_ms)} | "
            f"{ms(r.exposed_communication_ms)} |"
        )
    out += [
        "",
        "| candidate | kind | mean share | max share | skew (max ÷ mean) | verdicts by rank |",
        "|---|---|---:|---:|---:|---|",
    ]
    for c in summary.candidates[:top]:
        verdicts = ", ".join(f"{r}: {v}" for r, v in sorted(c.verdicts.items()))
        out.append(
            f"| {c.name} | {c.kind} | {pct(c.mean_share)} | {pct(c.max_share)} | {c.skew:.2f} | {verdicts} |"
        )
    if summary.stragglers:
        out += ["", "Stragglers:"] + [f"- {s}" for s in summary.stragglers]
    if summary.warnings:
        out += ["", "Warnings:"] + [f"- {w}" for w in summary.warnings]
    out.append("")
    return "\n".join(out) + "\n"
