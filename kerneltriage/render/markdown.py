"""The Markdown rendering of a ``Report``: the header as a list, the candidates table, then a
section per actionable candidate (for PR comments and design docs)."""

from __future__ import annotations

from kerneltriage.analysis.model import Report
from kerneltriage.analysis.vocabulary import Verdict
from kerneltriage.render.header import header_lines
from kerneltriage.render.shared import offers_scaffold, scaffold_command
from kerneltriage.render.text import (
    compiled_lines,
    condition_line,
    headroom_text,
    idle_lines,
    ms,
    pct,
    roofline_line,
    saving_basis,
    saving_cell,
    verdict_text,
)
from kerneltriage.render.verify_text import realized_cell, verification_line


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(report: Report, *, top: int | None, run_ref: str, rank: int | None = None) -> str:
    out = [f"## kerneltriage report: `{report.source.get('path', '')}`", ""]
    out += [f"- {line}" for line in header_lines(report)]
    out.append("")
    if report.idle_bound:
        out += ["> **" + idle_lines(report)[0] + "**", ">"]
        out += [f"> - {line.strip()}" for line in idle_lines(report)[1:]]
        out.append("")
    if report.compiled:
        out += ["```", *compiled_lines(report), "```", ""]
    candidates = report.candidates[:top] if top else report.candidates
    verified = any(c.verification for c in candidates)
    out += [
        "| # | id | candidate | kind | share | headroom | bound | shapes | verdict | saving |"
        + (" realized |" if verified else ""),
        "|---:|---|---|---|---:|---:|---|---:|---|---:|" + ("---:|" if verified else ""),
    ]
    for c in candidates:
        out.append(
            f"| {c.rank} | {c.id} | {_md_escape(c.name)} | {c.kind} | {pct(c.time_share)} | {headroom_text(c)} | "
            f"{c.roofline.bound or '—'} | {c.shapes.distinct} | {_md_escape(verdict_text(c, short=True))} | {saving_cell(c)} |"
            + (f" {realized_cell(c.verification)} |" if verified else "")
        )
    for c in [c for c in candidates if c.verdict != Verdict.SKIP or c.fix]:
        out += ["", f"### {c.id} {_md_escape(c.name)} → {verdict_text(c)}", ""]
        for name in ("headroom", "hotness", "stability"):
            mark, label, text = condition_line(name, c.conditions[name])
            out.append(f"- {mark} **{label}**: {text}")
        out.append(f"- roofline: {roofline_line(c)}")
        if c.expected_saving_share:
            out.append(
                f"- saving: up to {pct(c.expected_saving_share)} of step time ({ms(c.expected_saving_ms)})"
                f" = {_md_escape(saving_basis(c))}"
            )
        if c.verification:
            out.append(f"- verify: {_md_escape(verification_line(c.verification))}")
        out.append(f"- why: {c.reason}" + (f"; {c.note}" if c.note else ""))
        if c.fix:
            out += ["- fix:", "", "  ```python", *[f"  {line}" for line in c.fix.splitlines()], "  ```", ""]
        if offers_scaffold(c):
            out.append(f"- start: `{scaffold_command(run_ref, c.id, rank)}`")
    if report.warnings:
        out += ["", "**Warnings**", ""] + [f"- {w}" for w in report.warnings]
    return "\n".join(out) + "\n"
