"""Rendering of a multi-process run: the cross-rank summary, then each rank's own report.

- terminal: the summary as rich tables, then each rank's report under a rule;
- markdown: the summary as Markdown tables, then a ``## Rank N`` section per rank;
- html: one document (``render.html``'s page with the summary first and a section per rank);
- csv: every rank's candidates, one table, with a leading ``process_rank`` column;
- json: schema ``kerneltriage.report-ranks/1``: ``{"schema", "summary" (the
  ``kerneltriage.ranks/1`` summary), "ranks": {rank: kerneltriage.report/1}}``.

Candidate ids are numbered per rank (C3 of rank 0 need not be C3 of rank 1), so the summary
names each candidate's id on every rank and scaffold commands carry ``--rank N``. Ranks that
share an id or a verdict are one entry (``0–4, 6–63: C1; 5: C2``), so 64 ranks stay readable.
"""

from __future__ import annotations

import io
import json

from kerneltriage.analysis.compare.ranks import RankRow, RankSummary
from kerneltriage.analysis.model import Report
from kerneltriage.render import csv_text, render
from kerneltriage.render.shared import RANK_HEAD, name_widths, rank_rows, wrap_name
from kerneltriage.render.text import ms, pct

SCHEMA = "kerneltriage.report-ranks/1"

CANDIDATE_HEAD = (
    "candidate",
    "kind",
    "mean share",
    "max share",
    "skew (max ÷ mean)",
    "id by rank",
    "verdict by rank",
)


def render_rank_reports(
    summary: RankSummary,
    reports: dict[int, Report],
    fmt: str,
    *,
    top: int | None = None,
    run_ref: str = "RUN",
    color: bool | None = None,
    width: int | None = None,
) -> str:
    """Several ranks as ``fmt``: the summary across ranks, then each rank's report."""
    if fmt == "json":
        data = {
            "schema": SCHEMA,
            "summary": summary.to_json(),
            "ranks": {str(r): json.loads(render(rep, "json", top=top)) for r, rep in reports.items()},
        }
        return json.dumps(data, indent=2) + "\n"
    if fmt == "csv":
        from kerneltriage.analysis.frames import candidates_table

        return csv_text(candidates_table(reports, top))
    if fmt == "html":
        from kerneltriage.render.html import html_ranks

        return html_ranks(summary, reports, top=top, run_ref=run_ref)
    if fmt == "markdown":
        parts = [f"# kerneltriage report: `{_path(reports)}` ({len(reports)} ranks)\n\n"]
        parts.append(render_ranks(summary, "markdown", top or 10))
        for rank, rep in reports.items():
            parts.append(f"\n# Rank {rank}\n\n")
            parts.append(render(rep, "markdown", top=top, run_ref=run_ref, rank=rank))
        return "".join(parts)
    parts = [render_ranks(summary, "terminal", top or 10, color=color, width=width)]
    for rank, rep in reports.items():
        parts.append(_rule(f"rank {rank}", color, width))
        parts.append(render(rep, "terminal", top=top, run_ref=run_ref, color=color, width=width, rank=rank))
    return "".join(parts)


def _path(reports: dict[int, Report]) -> str:
    return str(next(iter(reports.values())).source.get("path", ""))


def _console(buffer: io.StringIO, color: bool | None, width: int | None):
    from rich.console import Console

    return Console(
        file=buffer,
        width=width or 140,
        force_terminal=color,
        no_color=color is False,
        highlight=False,
        soft_wrap=False,
        markup=False,
    )


def _rule(title: str, color: bool | None, width: int | None) -> str:
    from rich.rule import Rule

    buffer = io.StringIO()
    console = _console(buffer, color, width)
    console.print()
    console.print(Rule(title, style="bold", characters="═"))
    return buffer.getvalue()


def candidate_rows(summary: RankSummary, top: int, sep: str = "; ") -> list[list[str]]:
    """The candidates across ranks, formatted; ``sep`` between groups of ranks that share an
    id or a verdict (``0–4, 6–63: skip; 5: write``: one entry per rank would make 64 lines)."""
    return [
        [
            c.name,
            c.kind,
            pct(c.mean_share),
            pct(c.max_share),
            f"{c.skew:.2f}",
            by_rank(c.ids, sep),
            by_rank(c.verdicts, sep),
        ]
        for c in summary.candidates[:top]
    ]


def by_rank(values: dict[int, str], sep: str = "; ") -> str:
    """``{rank: value}`` as groups of ranks with one value, in the order of their first rank."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(values):
        groups.setdefault(values[rank], []).append(rank)
    ordered = sorted(groups.items(), key=lambda item: item[1][0])
    return sep.join(f"{rank_spans(ranks)}: {value}" for value, ranks in ordered)


def rank_spans(ranks: list[int]) -> str:
    """Sorted ranks as runs: ``[0, 1, 2, 3, 5]`` → ``0–3, 5``."""
    spans: list[list[int]] = []
    for rank in ranks:
        if spans and rank == spans[-1][1] + 1:
            spans[-1][1] = rank
        else:
            spans.append([rank, rank])
    return ", ".join(str(a) if a == b else f"{a}, {b}" if b == a + 1 else f"{a}–{b}" for a, b in spans)


def render_ranks(
    summary: RankSummary, fmt: str, top: int = 10, *, color: bool | None = None, width: int | None = None
) -> str:
    """The summary across ranks: Markdown tables, or rich tables for the terminal."""
    ranks = [row + _more_cells(r) for row, r in zip(rank_rows(summary), summary.ranks)]
    if fmt != "markdown":  # one line per rank in a terminal cell
        return _terminal(summary, ranks, candidate_rows(summary, top, "\n"), color, width)
    candidates = candidate_rows(summary, top)
    out = ["## Ranks", ""]
    out += ["| " + " | ".join(RANK_HEAD + MORE_HEAD) + " |", "|" + "---:|" * len(RANK_HEAD + MORE_HEAD)]
    out += ["| " + " | ".join(row) + " |" for row in ranks]
    out += ["", "| " + " | ".join(CANDIDATE_HEAD) + " |", "|---|---|---:|---:|---:|---|---|"]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in candidates]
    if summary.stragglers:
        out += ["", "Stragglers:"] + [f"- {s}" for s in summary.stragglers]
    if summary.notes:
        out += ["", "Waiting:"] + [f"- {n}" for n in summary.notes]
    if summary.warnings:
        out += ["", "Warnings:"] + [f"- {w}" for w in summary.warnings]
    out.append("")
    return "\n".join(out) + "\n"


def _terminal(
    summary: RankSummary,
    ranks: list[list[str]],
    candidates: list[list[str]],
    color: bool | None,
    width: int | None,
) -> str:
    from rich.table import Table
    from rich.text import Text

    buffer = io.StringIO()
    console = _console(buffer, color, width)
    console.print(Text(f"kerneltriage report — {len(summary.ranks)} ranks", style="bold"))
    table = Table(title="Ranks", title_justify="left")
    for col in RANK_HEAD + MORE_HEAD:
        table.add_column(col, justify="right")
    for row in ranks:
        table.add_row(*row)
    console.print(table)
    table = Table(title="Candidates across ranks (by mean share)", title_justify="left")
    widths = name_widths(console.width, CANDIDATE_HEAD, candidates, {0: 60})
    for i, col in enumerate(CANDIDATE_HEAD):
        table.add_column(
            col, justify="right" if 2 <= i <= 4 else "left", width=widths.get(i), overflow="ellipsis"
        )
    for row in candidates:
        table.add_row(*(wrap_name(cell, widths.get(i)) for i, cell in enumerate(row)))
    console.print(table)
    if summary.stragglers:
        console.print(Text("Stragglers:", style="bold"))
        for s in summary.stragglers:
            console.print(f"  {s}")
    if summary.notes:
        console.print(Text("Waiting:", style="bold"))
        for n in summary.notes:
            console.print(f"  {n}")
    for w in summary.warnings:
        console.print(Text(f"warning: {w}", style="yellow"))
    return buffer.getvalue()


#: Columns after ``RANK_HEAD``: the steps the step time is of, with its interval, and the
#: communication's wait for other ranks and its transfer (blank where not known).
MORE_HEAD = ("timed on (interval)", "comm. wait / transfer")


def _more_cells(row: RankRow) -> list[str]:
    timed = row.timed_on
    if row.step_low_ms is not None and row.step_high_ms is not None and row.step_high_ms > row.step_low_ms:
        timed += f" ({ms(row.step_low_ms)}–{ms(row.step_high_ms)})"
    split = "" if row.wait_ms is None else f"{ms(row.wait_ms)} / {ms(row.transfer_ms or 0.0)}"
    return [timed, split]
