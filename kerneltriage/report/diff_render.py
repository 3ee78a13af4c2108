"""Renderings of a ``Diff``: terminal, Markdown, JSON and a self-contained HTML page."""

from __future__ import annotations

import html as _html
import json

from kerneltriage.analysis.diff import Diff
from kerneltriage.report.text import ms, pct


def _rows(d: Diff) -> list[list[str]]:
    rows = []
    for m in d.candidates:
        t = m.time_ms_per_step
        rows.append(
            [
                m.name,
                m.kind,
                ms(t["before"]),
                ms(t["after"]),
                pct(m.predicted_saving_share),
                pct(m.realized_saving_share),
                pct(m.ceiling_reached, 0) if m.ceiling_reached else "—",
                ", ".join(m.ids["before"]) + " → " + (", ".join(m.ids["after"]) or "—"),
                m.how,
            ]
        )
    return rows


_HEAD = ["candidate", "kind", "before", "after", "predicted", "realized", "of ceiling", "ids", "matched by"]


def _summary(d: Diff) -> list[str]:
    s, b = d.step_time_ms, d.gpu_busy_ms
    return [
        f"step time: {ms(s['before'])} → {ms(s['after'])} ({pct(d.step_saving_share)} saved)",
        f"GPU busy: {ms(b['before'])} → {ms(b['after'])}",
    ]


def render_diff(d: Diff, fmt: str, top: int | None = None) -> str:
    rows = _rows(d)[:top] if top else _rows(d)
    if fmt == "json":
        return json.dumps(d.to_json(), indent=2) + "\n"
    if fmt == "markdown":
        out = [f"## kerneltriage diff: `{d.before}` → `{d.after}`", ""]
        out += [f"- {line}" for line in _summary(d)] + [""]
        out += ["| " + " | ".join(_HEAD) + " |", "|" + "---|" * len(_HEAD)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
        out += ["", "| kind | before | after |", "|---|---:|---:|"]
        out += [f"| {k} | {ms(v['before'])} | {ms(v['after'])} |" for k, v in d.kinds.items()]
        out += _lists(d, "- ")
        return "\n".join(out) + "\n"
    if fmt == "html":
        return _page(d, rows)
    return _terminal(d, rows)


def _lists(d: Diff, bullet: str) -> list[str]:
    out = []
    if d.new_hot_spots:
        out += ["", "New hot spots (the bottleneck moved):"]
        out += [
            f"{bullet}{h['id']} {h['name']} ({h['kind']}): {ms(h['time_ms_per_step'])}, {pct(h['time_share'])}"
            for h in d.new_hot_spots
        ]
    if d.regressions:
        out += ["", "Regressions:"]
        out += [
            f"{bullet}{r['name']} ({r['kind']}): {ms(r['time_ms_per_step']['before'])} → "
            f"{ms(r['time_ms_per_step']['after'])}"
            for r in d.regressions
        ]
    if d.warnings:
        out += ["", "Warnings (the runs may not be comparable):"] + [f"{bullet}{w}" for w in d.warnings]
    return out


def _terminal(d: Diff, rows: list[list[str]]) -> str:
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    buf = StringIO()
    console = Console(file=buf, width=160, highlight=False, markup=False, no_color=True)
    console.print(f"kerneltriage diff: {d.before} → {d.after}")
    for line in _summary(d):
        console.print(line)
    table = Table(title="Predicted vs realized saving (shares of the step before)", title_justify="left")
    for col in _HEAD:
        table.add_column(
            col,
            justify="right" if col in ("before", "after", "predicted", "realized", "of ceiling") else "left",
            max_width=48 if col == "candidate" else None,
            overflow="fold",
        )
    for r in rows:
        table.add_row(*r)
    console.print(table)
    kinds = Table(title="Time per step by kind", title_justify="left")
    for col in ("kind", "before", "after"):
        kinds.add_column(col, justify="left" if col == "kind" else "right")
    for k, v in d.kinds.items():
        kinds.add_row(k, ms(v["before"]), ms(v["after"]))
    console.print(kinds)
    for line in _lists(d, "  "):
        console.print(line)
    return buf.getvalue()


def _page(d: Diff, rows: list[list[str]]) -> str:
    e = _html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in _HEAD)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows)
    kinds = "".join(
        f"<tr><td>{e(k)}</td><td>{ms(v['before'])}</td><td>{ms(v['after'])}</td></tr>"
        for k, v in d.kinds.items()
    )
    lists = "".join(f"<p>{e(line)}</p>" for line in _lists(d, "• ") if line)
    summary = "".join(f"<li>{e(line)}</li>" for line in _summary(d))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>kerneltriage diff</title>
<style>body{{font-family:system-ui,sans-serif;margin:2em;color:#222}}table{{border-collapse:collapse;margin:1em 0}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left}}th{{background:#f3f3f3}}</style></head><body>
<h1>kerneltriage diff</h1><p><code>{e(d.before)}</code> → <code>{e(d.after)}</code></p><ul>{summary}</ul>
<h2>Predicted vs realized saving</h2><table><tr>{head}</tr>{body}</table>
<h2>Time per step by kind</h2><table><tr><th>kind</th><th>before</th><th>after</th></tr>{kinds}</table>{lists}
</body></html>
"""
