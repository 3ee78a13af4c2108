"""Terminal (rich), Markdown, JSON and CSV renderings of a ``Report``."""

from __future__ import annotations

import io
import json
from typing import TextIO

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kerneltriage.analysis.model import Candidate, Report
from kerneltriage.analysis.vocabulary import Verdict
from kerneltriage.report.gpu_text import gpu_lines
from kerneltriage.report.ladder_text import applied_fixes_line
from kerneltriage.report.shared import name_widths, offers_scaffold, scaffold_command, wrap_name
from kerneltriage.report.text import (
    communication_line,
    compiled_lines,
    condition_line,
    counters_text,
    headroom_text,
    idle_line,
    idle_lines,
    idle_text,
    ms,
    pct,
    roofline_line,
    saving_basis,
    step_time_text,
    unattributed_text,
    verdict_text,
)
from kerneltriage.report.verify_text import realized_cell, verification_line

FORMATS = ("terminal", "markdown", "json", "csv", "html")
_VERDICT_STYLE = {
    Verdict.WRITE: "bold green",
    Verdict.USE_BUILTIN: "bold cyan",
    Verdict.COMPILE: "bold yellow",
    Verdict.SKIP: "dim",
}


def render(
    report: Report,
    fmt: str,
    *,
    top: int | None = None,
    out: TextIO | None = None,
    run_ref: str = "RUN",
    width: int | None = None,
    color: bool | None = None,
    rank: int | None = None,
) -> str:
    """Render ``report`` as ``fmt``. Returns the text (and writes it to ``out`` if given).
    ``rank``: the process rank to name in scaffold commands (one rank of a multi-rank run)."""
    if fmt == "json":
        data = report.to_json()
        if top is not None:
            data["candidates"] = data["candidates"][:top]
        text = json.dumps(data, indent=2) + "\n"
    elif fmt == "csv":
        text = csv_text(report.to_frame().head(top) if top else report.to_frame())
    elif fmt == "markdown":
        text = markdown(report, top=top, run_ref=run_ref, rank=rank)
    elif fmt == "terminal":
        text = terminal(report, top=top, run_ref=run_ref, width=width, color=color, out=out, rank=rank)
        return text
    elif fmt == "html":
        from kerneltriage.report.html import html  # matplotlib is imported only for HTML

        text = html(report, top=top, run_ref=run_ref, rank=rank)
    else:
        raise ValueError(f"unknown format {fmt!r}")
    if out is not None:
        out.write(text)
    return text


def csv_text(frame) -> str:
    """A DataFrame as CSV: a header row, one row per candidate, no index (as ``--export``
    writes it)."""
    return frame.to_csv(index=False, lineterminator="\n")


def _timing_line(t: dict) -> str:
    """How ``profile`` timed the step: plain steps, GPU busy from clean steps, and what the
    clean and the recorded (attribution) steps cost against the plain ones."""

    def cost(key: str) -> str:
        return "" if t.get(key) is None else f", {t[key]:+.0%} against plain"

    n = t.get("steps") or {}
    parts = [f"Timing: step time from {n.get('plain', '?')} plain steps (nothing installed)"]
    if t.get("gpu_busy_from") == "clean steps":
        parts.append(f"GPU busy from {n.get('clean', '?')} clean steps (GPU-only profiler{cost('overhead')})")
    if t.get("recorded_median_ms"):
        parts.append(
            f"ops and modules from {n.get('recorded', '?')} recorded steps "
            f"({ms(t['recorded_median_ms'])}{cost('attribution_overhead')})"
        )
    return " · ".join(parts)


def _header_lines(report: Report) -> list[str]:
    lines = [
        *gpu_lines(report),
        f"Steps: {report.steps} ({report.step_source}) · step time {step_time_text(report)}"
        + f" · GPU busy {report.gpu_busy_pct:.1f}% · idle {idle_text(report)}",
    ]
    if report.source.get("applied_fixes"):
        lines.append(applied_fixes_line(report.source))
    if report.source.get("timing"):
        lines.append(_timing_line(report.source["timing"]))
    for extra in (idle_line(report), communication_line(report)):
        if extra:
            lines.append(extra)
    if report.join:
        lines.append(f"Counters: {counters_text(report.join)}")
    else:
        lines.append(
            "Counters: none (roofline from shape estimates; run `kerneltriage profile` for ncu counters)"
        )
    lines.append(f"Unattributed kernel time: {unattributed_text(report)}")
    return lines


def _saving(c: Candidate) -> str:
    return pct(c.expected_saving_share) if c.expected_saving_share else "—"


# --- terminal -------------------------------------------------------------------------------


def terminal(
    report: Report,
    *,
    top: int | None,
    run_ref: str,
    width: int | None,
    color: bool | None,
    out: TextIO | None,
    rank: int | None = None,
) -> str:
    buffer = io.StringIO()
    console = Console(
        file=out or buffer,
        width=width or 140,
        force_terminal=color,
        no_color=color is False,
        highlight=False,
        soft_wrap=False,
        markup=False,
    )
    console.print(
        Text("kerneltriage report", style="bold"), Text(str(report.source.get("path", "")), style="dim")
    )
    for line in _header_lines(report):
        console.print(line)
    if report.idle_bound:
        console.print(Panel("\n".join(idle_lines(report)), title="GPU idle", border_style="red"))
    if report.compiled:
        console.print(Text("\n".join(compiled_lines(report))))
    candidates = report.candidates[:top] if top else report.candidates
    console.print(_candidates_table(candidates, console.width))
    for c in _detailed(candidates):
        _print_candidate_detail(console, c, run_ref, rank)
    if report.warnings:
        console.print()
        for w in report.warnings:
            console.print(Text(f"warning: {w}", style="yellow"))
    return buffer.getvalue()


def _candidates_table(candidates: list[Candidate], width: int) -> Table:
    """The candidates as a table a row each; a ``realized`` column when any was verified."""
    table = Table(
        title="Candidates (actionable first, by expected saving)", title_justify="left", expand=False
    )
    headers: tuple[str, ...] = (
        "#",
        "id",
        "candidate",
        "kind",
        "share",
        "headroom",
        "bound",
        "shapes",
        "verdict",
        "saving",
    )
    verified = any(c.verification for c in candidates)
    if verified:
        headers = (*headers, "realized")
    rows = [
        [
            str(c.rank),
            c.id,
            c.name,
            c.kind,
            pct(c.time_share),
            headroom_text(c),
            c.roofline.bound or "—",
            str(c.shapes.distinct),
            verdict_text(c, short=True),
            _saving(c),
            *([realized_cell(c.verification)] if verified else []),
        ]
        for c in candidates
    ]
    # Names wrap between words or at their joints, never mid-word (see report.shared).
    widths = name_widths(width, headers, rows, {2: 52, 8: 44})
    right = {"#", "share", "headroom", "shapes", "saving", "realized"}
    for i, col in enumerate(headers):
        table.add_column(
            col,
            justify="right" if col in right else "left",
            width=widths.get(i),
            overflow="ellipsis",
        )
    for c, row in zip(candidates, rows):
        cells: list = [wrap_name(cell, widths.get(i)) for i, cell in enumerate(row)]
        cells[8] = Text(cells[8], style=_VERDICT_STYLE[c.verdict])
        table.add_row(*cells)
    return table


def _detailed(candidates: list[Candidate]) -> list[Candidate]:
    """The candidates shown in detail: every actionable one (else the first), then up to
    three skipped ones of at least 5% of the step."""
    detail = [c for c in candidates if c.verdict != Verdict.SKIP] or candidates[:1]
    shown = {id(c) for c in detail}
    detail += [
        c for c in candidates if c.verdict == Verdict.SKIP and c.time_share >= 0.05 and id(c) not in shown
    ][:3]
    return detail


def _print_candidate_detail(console: Console, c: Candidate, run_ref: str, rank: int | None) -> None:
    """One candidate in detail: its verdict, the three conditions, roofline, time, saving,
    verification, and for an actionable one why, the fix and the scaffold command."""
    console.print()
    console.print(
        Text(f"{c.id}  {c.name}", style="bold"),
        Text(f"→ {verdict_text(c)}", style=_VERDICT_STYLE[c.verdict]),
    )
    for name in ("headroom", "hotness", "stability"):
        mark, label, text = condition_line(name, c.conditions[name])
        style = "green" if mark == "✓" else ("red" if mark == "✗" else "yellow")
        console.print(Text(f"  {mark} ", style=style), Text(f"{label:<10}", style="bold"), text)
    console.print(f"  roofline   {roofline_line(c)}")
    console.print(
        f"  time       {ms(c.time_ms_per_step)} per step (fwd {ms(c.fwd_ms_per_step)}, bwd {ms(c.bwd_ms_per_step)}), "
        f"{c.instances_per_step:g} instance(s) per step"
    )
    if c.expected_saving_share:
        console.print(
            f"  saving     up to {pct(c.expected_saving_share)} of step time "
            f"({ms(c.expected_saving_ms)}) = {saving_basis(c)}"
        )
    if c.verification:
        console.print(Text(f"  verify     {verification_line(c.verification)}"))
    if c.verdict != Verdict.SKIP:
        why = c.reason + (f"; {c.note}" if c.note else "")
        console.print(f"  why        {why}")
        if c.fix:
            fix = c.fix.replace("\n", "\n             ")
            console.print(Text(f"  fix        {fix}"))
        console.print(f"  start      {scaffold_command(run_ref, c.id, rank)}")


# --- markdown -------------------------------------------------------------------------------


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(report: Report, *, top: int | None, run_ref: str, rank: int | None = None) -> str:
    out = [f"## kerneltriage report: `{report.source.get('path', '')}`", ""]
    out += [f"- {line}" for line in _header_lines(report)]
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
            f"{c.roofline.bound or '—'} | {c.shapes.distinct} | {_md_escape(verdict_text(c, short=True))} | {_saving(c)} |"
            + (f" {realized_cell(c.verification)} |" if verified else "")
        )
    for c in [c for c in candidates if c.verdict != Verdict.SKIP]:
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
