"""Renderings of a ``Diff``: terminal, Markdown, JSON, CSV and a self-contained HTML page
(the report's style, with a chart of the predicted against the realized saving).

A saving is a share of the step before; a negative one is a slowdown and reads as one
("+6.2% slower"), never as a negative saving.
"""

from __future__ import annotations

import json
from typing import Any

from kerneltriage.analysis.compare.diff import Diff, Match
from kerneltriage.render.shared import name_widths, wrap_name
from kerneltriage.render.text import ms, pct, truncate
from kerneltriage.render.verify_text import realized_cell

_HEAD = ["candidate", "kind", "before", "after", "predicted", "realized", "of ceiling", "ids", "matched by"]
_RIGHT = {"before", "after", "predicted", "realized", "of ceiling"}
_SHOWN = 0.0005  # below this share of the step, a change shows as 0.0%


def saving_text(share: float) -> str:
    """``64.0%`` saved, ``+6.2% slower`` for a slowdown, ``0.0%`` for no change."""
    if share <= -_SHOWN:
        return f"+{pct(-share)} slower"
    return pct(max(share, 0.0))


def step_change_text(d: Diff) -> str:
    """``64.0% saved`` or ``+6.2% slower``: the step time's change."""
    share = d.step_saving_share
    if share <= -_SHOWN:
        return f"+{pct(-share)} slower"
    return f"{pct(max(share, 0.0))} saved"


def _row(m: Match, verified: bool = False) -> list[str]:
    t = m.time_ms_per_step
    row = [
        m.name,
        m.kind,
        ms(t["before"]),
        ms(t["after"]),
        pct(m.predicted_saving_share),
        saving_text(m.realized_saving_share),
        pct(m.ceiling_reached, 0) if m.ceiling_reached else "—",
        ", ".join(m.ids["before"]) + " → " + (", ".join(m.ids["after"]) or "—"),
        m.how,
    ]
    if verified:
        # What `kerneltriage verify` measured on the run before, beside what this pair shows.
        row.insert(6, ", ".join(realized_cell(v) for v in m.verified) or "—")
    return row


def _head(matches: list[Match]) -> tuple[list[str], bool]:
    verified = any(m.verified for m in matches)
    return ([*_HEAD[:6], "verify (before)", *_HEAD[6:]] if verified else list(_HEAD)), verified


def _summary(d: Diff) -> list[str]:
    s, b = d.step_time_ms, d.gpu_busy_ms
    return [
        f"step time: {ms(s['before'])} → {ms(s['after'])} ({step_change_text(d)})",
        f"GPU busy: {ms(b['before'])} → {ms(b['after'])}",
    ]


def ladder_fix_text(r: dict[str, Any]) -> str:
    """One applied fix: its prediction, its saving alone (``verify`` on the run before) and in
    this pair."""
    alone = r["realized_saving_share"]
    pair = r["pair_realized_saving_share"]
    with_ = f"; applied as one with {', '.join(r['applied_with'])}" if r["applied_with"] else ""
    return (
        f"{r['id']} {r['name'] or ''} — {r['recipe_id'] or r['kind']} ({r['status'] or 'not verified'}): "
        f"predicted {pct(r['predicted_saving_share'])}, alone "
        + (f"{saving_text(alone)} (verify)" if alone is not None else "not measured")
        + (f", its candidates in this pair {saving_text(pair)}" if pair is not None else "")
        + with_
    )


def ladder_combined_text(d: Diff) -> str:
    """The fixes together (the step time before → after) against the sum of their savings alone."""
    lad = d.ladder or {}
    s = d.step_time_ms
    alone = lad["sum_realized_saving_share"]
    if alone is None:
        apart = "none was measured alone (verify)"
    elif lad["unmeasured"]:
        apart = f"those measured alone sum to {pct(alone)} (verify)"
    else:
        apart = f"alone they sum to {pct(alone)} (verify)"
    text = (
        f"together: {saving_text(lad['combined_realized_saving_share'])} of the step "
        f"({ms(s['before'])} → {ms(s['after'])}); {apart}, predicted {pct(lad['sum_predicted_saving_share'])}"
    )
    inter = lad.get("interaction_share")
    if inter is None:
        return text + f"; not measured alone: {', '.join(lad['unmeasured'])}"
    if inter <= -_SHOWN:
        return text + f": they overlap, {pct(-inter)} of the step less together than the sum"
    if inter >= _SHOWN:
        return text + f": {pct(inter)} of the step more together than the sum"
    return text + ": together as the sum"


def ladder_lines(d: Diff, bullet: str) -> list[str]:
    """The fixes ``profile --apply`` profiled the run after with, one by one, then together."""
    lad = d.ladder
    if not lad:
        return []
    out = ["", f"Fixes applied (profile --apply, from {lad['parent_run'] or 'the run before'}):"]
    out += [f"{bullet}{ladder_fix_text(r)}" for r in lad["fixes"]]
    out.append(f"{bullet}{ladder_combined_text(d)}")
    return out


def render_diff(d: Diff, fmt: str, top: int | None = None) -> str:
    matches = d.candidates[:top] if top else list(d.candidates)
    head, verified = _head(matches)
    rows = [_row(m, verified) for m in matches]
    if fmt == "json":
        return json.dumps(d.to_json(), indent=2) + "\n"
    if fmt == "csv":
        from kerneltriage.analysis.frames import diff_frame
        from kerneltriage.render import csv_text

        frame = diff_frame(d)
        return csv_text(frame.head(top) if top else frame)
    if fmt == "markdown":
        out = [f"## kerneltriage diff: `{d.before}` → `{d.after}`", ""]
        out += [f"- {line}" for line in _summary(d)] + [""]
        out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
        if d.compiled:
            out += ["", "Eager → compiled, op by op:", ""]
            out += ["| " + " | ".join(_COMPILED_HEAD) + " |", "|" + "---|" * len(_COMPILED_HEAD)]
            out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in _compiled_rows(d)]
            out += _compiled_lines(d, "- ")
        out += ladder_lines(d, "- ")
        out += ["", "| kind | before | after |", "|---|---:|---:|"]
        out += [f"| {k} | {ms(v['before'])} | {ms(v['after'])} |" for k, v in d.kinds.items()]
        out += _lists(d, "- ")
        return "\n".join(out) + "\n"
    if fmt == "html":
        return _page(d, matches, rows, head)
    return _terminal(d, rows, head)


_COMPILED_HEAD = ["eager ops", "kind", "eager", "compiled", "speed-up", "compiled kernels", "matched by"]


def _compiled_rows(d: Diff) -> list[list[str]]:
    """Eager → torch.compile, op by op: eager time, compiled time, speed-up, the kernels."""
    rows = []
    for r in (d.compiled or {}).get("rows", []):
        kernels = r["compiled_kernels"]
        names = ", ".join(kernels[:3]) + (f" (+{len(kernels) - 3})" if len(kernels) > 3 else "")
        rows.append(
            [
                r["eager"],
                r["kind"],
                ms(r["eager_ms_per_step"]),
                ms(r["compiled_ms_per_step"]),
                f"{r['speedup']:.2f}×" if r.get("speedup") else "—",
                names,
                r["how"],
            ]
        )
    return rows


def _compiled_lines(d: Diff, bullet: str) -> list[str]:
    """The compiled section's totals and the predictions of the run before, checked."""
    c = d.compiled
    if not c:
        return []
    out = [
        "",
        f"Compiled kernels: {ms(c['compiled_ms_per_step'])} per step; "
        f"{ms(c['unmatched_compiled_ms_per_step'])} of it matched no eager candidate "
        f"({', '.join(c['unmatched_compiled_ids']) or 'none'})",
    ]
    checks = c.get("compile_predictions") or []
    if checks:
        out.append("Predictions of the run before, against what compiling realized:")
        for p in checks:
            mark = "held" if p["held"] else "did not hold"
            where = "" if p["compiled"] else " (not compiled after: outside the compiled graphs)"
            out.append(
                f"{bullet}{p['name']} — {p['verdict_before']}: predicted {pct(p['predicted_saving_share'])}, "
                f"realized {saving_text(p['realized_saving_share'])}: {mark}{where}"
            )
    else:
        out.append("The run before predicted no saving to check (no actionable verdict).")
    return out


def _hot_spot(h: dict[str, Any]) -> str:
    return f"{h['id']} {h['name']} ({h['kind']}): {ms(h['time_ms_per_step'])}, {pct(h['time_share'])}"


def _regression(r: dict[str, Any]) -> str:
    t = r["time_ms_per_step"]
    return f"{r['name']} ({r['kind']}): {ms(t['before'])} → {ms(t['after'])}"


def _lists(d: Diff, bullet: str) -> list[str]:
    out = []
    if d.new_hot_spots:
        out += ["", "New hot spots (the bottleneck moved):"]
        out += [f"{bullet}{_hot_spot(h)}" for h in d.new_hot_spots]
    if d.regressions:
        out += ["", "Regressions:"]
        out += [f"{bullet}{_regression(r)}" for r in d.regressions]
    if d.warnings:
        out += ["", "Warnings (the runs may not be comparable):"] + [f"{bullet}{w}" for w in d.warnings]
    return out


def _terminal(d: Diff, rows: list[list[str]], head: list[str], width: int = 160) -> str:
    from io import StringIO

    from rich.console import Console
    from rich.table import Table

    buf = StringIO()
    console = Console(file=buf, width=width, highlight=False, markup=False, no_color=True)
    console.print(f"kerneltriage diff: {d.before} → {d.after}")
    for line in _summary(d):
        console.print(line)
    for line in ladder_lines(d, "  "):
        console.print(line)
    table = Table(title="Predicted vs realized saving (shares of the step before)", title_justify="left")
    # Names wrap between words or at their joints, never mid-word (see render.shared).
    caps = {head.index("candidate"): 48, head.index("ids"): 24, head.index("matched by"): 24}
    widths = name_widths(console.width, head, rows, caps)
    for i, col in enumerate(head):
        table.add_column(
            col, justify="right" if col in _RIGHT else "left", width=widths.get(i), overflow="ellipsis"
        )
    for r in rows:
        table.add_row(*(wrap_name(cell, widths.get(i)) for i, cell in enumerate(r)))
    console.print(table)
    if d.compiled:
        comp = Table(title="Eager → compiled, op by op (did compile pay?)", title_justify="left")
        crow = _compiled_rows(d)
        cw = name_widths(console.width, _COMPILED_HEAD, crow, {0: 48, 5: 40, 6: 22})
        for i, col in enumerate(_COMPILED_HEAD):
            comp.add_column(
                col,
                justify="right" if col in ("eager", "compiled", "speed-up") else "left",
                width=cw.get(i),
                overflow="ellipsis",
            )
        for r in crow:
            comp.add_row(*(wrap_name(cell, cw.get(i)) for i, cell in enumerate(r)))
        console.print(comp)
        for line in _compiled_lines(d, "  "):
            console.print(line)
    kinds = Table(title="Time per step by kind", title_justify="left")
    for col in ("kind", "before", "after"):
        kinds.add_column(col, justify="left" if col == "kind" else "right")
    for k, v in d.kinds.items():
        kinds.add_row(k, ms(v["before"]), ms(v["after"]))
    console.print(kinds)
    for line in _lists(d, "  "):
        console.print(line)
    return buf.getvalue()


# --- HTML ------------------------------------------------------------------------------------

CHART_ROWS = 12  # matched candidates drawn, largest prediction or change first
PREDICTED_COLOR = "#9ecae1"
SAVED_COLOR = "#1a9850"
SLOWER_COLOR = "#c62828"


def chart_matches(matches: list[Match]) -> list[Match]:
    """The candidates the chart draws: those with a prediction or a visible change."""
    shown = [
        m for m in matches if m.predicted_saving_share >= _SHOWN or abs(m.realized_saving_share) >= _SHOWN
    ]
    shown.sort(key=lambda m: -max(m.predicted_saving_share, abs(m.realized_saving_share)))
    return shown[:CHART_ROWS]


def diff_svg(d: Diff, matches: list[Match]) -> str:
    """Predicted against realized saving per candidate, as inline SVG: a ``<g id="kt-diff-N">``
    with a ``<title>`` per bar pair (N: its row in the chart, from the top)."""
    from matplotlib.patches import Patch

    from kerneltriage.render.canvas import chart_style, inline_svg, new_figure, svg_text, titled_svg

    shown = chart_matches(matches)
    n = max(len(shown), 1)
    with chart_style():
        fig = new_figure(10.0, 1.3 + 0.42 * n)
        ax = fig.add_axes((0.36, 0.9 / (1.3 + 0.42 * n), 0.6, 0.42 * n / (1.3 + 0.42 * n)))
        ys = list(range(len(shown)))[::-1]
        for y, m in zip(ys, shown):
            pred = ax.barh(y + 0.19, 100 * m.predicted_saving_share, height=0.36, color=PREDICTED_COLOR)
            real = m.realized_saving_share
            done = ax.barh(
                y - 0.19, 100 * real, height=0.36, color=SAVED_COLOR if real >= 0 else SLOWER_COLOR
            )
            pred.patches[0].set_gid(f"kt-diff-{len(shown) - 1 - y}-predicted")
            done.patches[0].set_gid(f"kt-diff-{len(shown) - 1 - y}")
        ax.set_yticks(ys)
        ax.set_yticklabels([truncate(m.name, 48) for m in shown], fontsize=8.5)
        ax.axvline(0, color="#555555", lw=0.8)
        ax.set_xlabel("saving, % of the step before (negative: slower)")
        ax.grid(axis="x", color="#e2e2e2", lw=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
        if not shown:
            ax.text(
                0.5,
                0.5,
                "no candidate with a predicted or realized saving",
                ha="center",
                transform=ax.transAxes,
            )
            ax.set_yticks([])
        fig.legend(
            handles=[
                Patch(color=PREDICTED_COLOR, label="predicted (before's report)"),
                Patch(color=SAVED_COLOR, label="realized"),
                Patch(color=SLOWER_COLOR, label="realized: slower"),
            ],
            loc="upper left",
            bbox_to_anchor=(0.02, 1.0),
            ncol=3,
            frameon=False,
            fontsize=8.5,
        )
    titles = {}
    for i, m in enumerate(shown):
        text = (
            f"{m.name}: predicted {pct(m.predicted_saving_share)}, realized "
            f"{saving_text(m.realized_saving_share)} ({ms(m.time_ms_per_step['before'])} → "
            f"{ms(m.time_ms_per_step['after'])})"
        )
        titles[f"kt-diff-{i}"] = text
        titles[f"kt-diff-{i}-predicted"] = text
    svg = titled_svg(svg_text(fig), titles)
    return inline_svg(svg, "diff", "Predicted against realized saving per candidate")


def _page(d: Diff, matches: list[Match], rows: list[list[str]], head: list[str]) -> str:
    from markupsafe import Markup

    from kerneltriage.render.canvas import VERDICT_COLORS
    from kerneltriage.render.html import _environment

    s, b = d.step_time_ms, d.gpu_busy_ms
    context = {
        "title": f"kerneltriage diff: {d.before} → {d.after}",
        "schema": d.schema,
        "verdict_colors": VERDICT_COLORS,
        "before": d.before,
        "after": d.after,
        "facts": [
            ("step time", f"{ms(s['before'])} → {ms(s['after'])}"),
            ("change", step_change_text(d)),
            ("GPU busy", f"{ms(b['before'])} → {ms(b['after'])}"),
        ],
        "slower": d.step_saving_share <= -_SHOWN,
        "warnings": list(d.warnings),
        "chart": Markup(diff_svg(d, matches)),
        "head": head,
        "right": [col in _RIGHT for col in head],
        "rows": [{"cells": r, "slower": m.realized_saving_share <= -_SHOWN} for r, m in zip(rows, matches)],
        "kinds": [(k, ms(v["before"]), ms(v["after"])) for k, v in d.kinds.items()],
        "new_hot_spots": [_hot_spot(h) for h in d.new_hot_spots],
        "regressions": [_regression(r) for r in d.regressions],
        "ladder": [ladder_fix_text(r) for r in d.ladder["fixes"]] + [ladder_combined_text(d)]
        if d.ladder
        else [],
        "ladder_parent": (d.ladder or {}).get("parent_run"),
    }
    return _environment().get_template("diff.html.j2").render(**context)
