"""Rendering of the cross-rank summary (multi-process runs)."""

from __future__ import annotations

from kerneltriage.analysis.ranks import RankSummary
from kerneltriage.report.text import ms, pct


def render_ranks(summary: RankSummary, fmt: str, top: int = 10) -> str:
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
