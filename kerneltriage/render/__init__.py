"""Renderers for a ``Report``: terminal (rich), Markdown, JSON, CSV and HTML. Rendering only:
every number shown was computed in ``analysis``.

``render(report, fmt)`` picks the format: JSON and CSV are the report's own tables, the terminal
(``terminal.py``), Markdown (``markdown.py``) and HTML (``html.py``) renderings have a module
each. Several ranks (``ranks_render.py``) and a ``Diff`` (``diff_render.py``) have theirs.
"""

from __future__ import annotations

import json
from typing import TextIO

from kerneltriage.analysis.model import Report
from kerneltriage.render.markdown import markdown
from kerneltriage.render.terminal import terminal

__all__ = ["FORMATS", "csv_text", "render"]

FORMATS = ("terminal", "markdown", "json", "csv", "html")


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
        from kerneltriage.render.html import html  # matplotlib is imported only for HTML

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
