"""The terminal rendering of a ``Report`` (rich): the header, the candidates table, then each
actionable candidate (and the hottest skipped ones) in detail."""

from __future__ import annotations

import io
from typing import TextIO

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kerneltriage.analysis.model import Candidate, Report
from kerneltriage.analysis.vocabulary import Verdict
from kerneltriage.render.header import header_lines
from kerneltriage.render.shared import name_widths, scaffold_command, wrap_name
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

_VERDICT_STYLE = {
    Verdict.WRITE: "bold green",
    Verdict.USE_BUILTIN: "bold cyan",
    Verdict.COMPILE: "bold yellow",
    Verdict.SKIP: "dim",
}


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
    for line in header_lines(report):
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
            saving_cell(c),
            *([realized_cell(c.verification)] if verified else []),
        ]
        for c in candidates
    ]
    # Names wrap between words or at their joints, never mid-word (see render.shared).
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
    # A skip that carries a setting to try (DDP's buckets on exposed communication) is shown too.
    detail = [c for c in candidates if c.verdict != Verdict.SKIP or c.fix] or candidates[:1]
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
    if c.verdict != Verdict.SKIP or c.fix or c.note:
        why = c.reason + (f"; {c.note}" if c.note else "")
        console.print(f"  why        {why}")
        if c.fix:
            fix = c.fix.replace("\n", "\n             ")
            console.print(Text(f"  fix        {fix}"))
    if c.verdict != Verdict.SKIP:
        console.print(f"  start      {scaffold_command(run_ref, c.id, rank)}")
