"""The HTML report: one self-contained file (inline CSS and SVG charts, no scripts, fonts or
URLs) that opens offline and pastes into PRs and design docs.

Rendering only: numbers come from the ``Report`` and are formatted with ``render.text``.
Everything from a trace (kernel and op names, shapes, paths) is escaped by Jinja2's
autoescaping; the charts are matplotlib SVG whose text matplotlib escapes.
"""

from __future__ import annotations

import re
import shlex
from functools import cache
from typing import Any

from kerneltriage.analysis.compare.ranks import RankSummary
from kerneltriage.analysis.model import Candidate, Report
from kerneltriage.analysis.vocabulary import Verdict
from kerneltriage.render.gpu_text import NO_CEILINGS, precision_label, tflops_text, unresolved_text
from kerneltriage.render.header import host_fix_text, host_text
from kerneltriage.render.ladder_text import applied_fixes_line
from kerneltriage.render.shared import RANK_HEAD, offers_scaffold, rank_rows, scaffold_command
from kerneltriage.render.text import (
    bytes_,
    communication_line,
    compiled_lines,
    condition_line,
    counters_text,
    flops,
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
from kerneltriage.render.verify_text import realized_cell, verification_line
from kerneltriage.resources import data_path

CONDITIONS = ("headroom", "hotness", "stability")


@cache
def _environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_path("html"))),
        autoescape=True,  # report.html.j2 does not end in .html: turn it on explicitly
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["wbr"] = breakable
    return env


# A name's joints, where a table cell may break it: after . _ , : / ( and before a camelCase
# hump (LigerFusedLinearCrossEntropy|Loss). Elsewhere a word is never broken.
_JOINT = re.compile(r"(?<=[._,:/(])(?=\w)|(?<=[a-z0-9])(?=[A-Z])")


def breakable(text: Any) -> Any:
    """``text`` escaped, with ``<wbr>`` (a break opportunity, nothing visible) at its joints."""
    from markupsafe import Markup, escape

    return Markup("<wbr>").join(escape(part) for part in _JOINT.split(str(text)))


def html(report: Report, *, top: int | None = None, run_ref: str = "RUN", rank: int | None = None) -> str:
    """The report as one HTML page; ``top`` keeps the first N candidates (table, details and
    chart). ``rank``: the process rank its scaffold commands name (a rank of a multi-rank run)."""
    context = {
        **_page(report),
        "title": f"kerneltriage report: {report.source.get('path', '')}",
        "single": _body(report, top=top, run_ref=run_ref, rank=rank),
        "ranks": None,
    }
    return _environment().get_template("report.html.j2").render(**context)


def html_ranks(
    summary: RankSummary, reports: dict[int, Report], *, top: int | None = None, run_ref: str = "RUN"
) -> str:
    """Several ranks as one HTML page: the summary across ranks as tables, then a section per
    rank with its own report (ids inside a rank's section are prefixed ``r{rank}-``)."""
    first = next(iter(reports.values()))
    path = str(first.source.get("path", ""))
    ranks = {
        "path": path,
        "count": len(reports),
        "rank_head": RANK_HEAD,
        "rank_rows": rank_rows(summary),
        "candidates": [
            {
                "name": c.name,
                "kind": c.kind,
                "mean_share": pct(c.mean_share),
                "max_share": pct(c.max_share),
                "skew": f"{c.skew:.2f}",
                "by_rank": [
                    {"rank": r, "id": c.ids[r], "verdict": c.verdicts.get(r, Verdict.SKIP)}
                    for r in sorted(c.ids)
                ],
            }
            for c in summary.candidates[: top or 10]
        ],
        "stragglers": list(summary.stragglers),
        "warnings": list(summary.warnings),
        "reports": [
            {
                "rank": r,
                "body": _body(rep, top=top, run_ref=run_ref, rank=r, prefix=f"r{r}-"),
            }
            for r, rep in reports.items()
        ],
    }
    context = {
        **_page(first),
        "title": f"kerneltriage report: {path} ({len(reports)} ranks)",
        "single": None,
        "ranks": ranks,
    }
    return _environment().get_template("report.html.j2").render(**context)


def _page(report: Report) -> dict[str, Any]:
    from kerneltriage.render.canvas import VERDICT_COLORS, VERDICT_LABELS

    return {
        "schema": report.schema,
        "verdict_colors": VERDICT_COLORS,
        "verdict_labels": VERDICT_LABELS,
    }


def _body(
    report: Report, *, top: int | None, run_ref: str, rank: int | None, prefix: str = ""
) -> dict[str, Any]:
    """What the template's ``report_body`` shows of one report."""
    from markupsafe import Markup

    from kerneltriage.render.breakdown import breakdown_svg
    from kerneltriage.render.canvas import VERDICT_COLORS
    from kerneltriage.render.roofline_chart import roofline_svg
    from kerneltriage.render.roofline_layout import roofline_data

    candidates = report.candidates[:top] if top else list(report.candidates)
    data = roofline_data(report, candidates)
    roofline = roofline_svg(report, candidates=candidates)
    breakdown = breakdown_svg(report)
    return {
        "header": _header(report),
        "idle": idle_lines(report) if report.idle_bound else None,
        "compiled": compiled_lines(report) if report.compiled else None,
        "warnings": list(report.warnings),
        "notes": list(report.notes),
        "summary": _summary(report, candidates),
        "roofline_svg": Markup(_scoped(roofline, prefix)),
        "breakdown_svg": Markup(_scoped(breakdown, prefix)),
        "breakdown": _breakdown(report),
        "placed": len(data.points),
        "not_placed": [{"id": c.id, "name": c.name, "why": why} for c, why in data.not_placed],
        "candidates": [_candidate(c, run_ref, rank) for c in candidates],
        "total_candidates": len(report.candidates),
        "verdicts_present": [v for v in VERDICT_COLORS if any(c.verdict == v for c in candidates)],
    }


def _scoped(svg: str, prefix: str) -> str:
    """An inline chart's ids and in-page links under ``prefix``: two ranks' charts on one page
    must not share ids, and a point links to its own rank's candidate."""
    if not prefix:
        return svg
    return re.sub(r'(\sid="|href="#|url\(#)([^")]+)', lambda m: f"{m.group(1)}{prefix}{m.group(2)}", svg)


# --- view models: formatted strings only ----------------------------------------------------


def _gpu_header(report: Report) -> dict[str, Any]:
    """The GPU facts: its ceilings (each with its datasheet figure and fraction on hover), where
    they come from, how the row was chosen, the launch floor; or why there are none."""
    gpu = report.gpu
    if gpu is None:
        return {
            "gpu_name": f"unknown ({unresolved_text(report)})",
            "badge": "no ceilings",
            "measured": False,
            "ceilings": [],
            "no_ceilings": NO_CEILINGS,
            "gpu_source": "",
            "gpu_resolution": "",
            "launch_floor": "",
        }
    used = {gpu.unit(c.roofline.precision) for c in report.candidates if c.roofline.precision}
    a = gpu.achievable

    def how(measured: bool, datasheet: str, fraction: float) -> str:
        return "measured by kerneltriage calibrate" if measured else f"datasheet {datasheet} × {fraction:g}"

    ceilings = [
        {
            "name": "memory",
            "value": f"{gpu.ceiling_bandwidth_gbs:,.0f} GB/s",
            "used": True,
            "how": how(
                gpu.measured_bandwidth_gbs is not None, f"{gpu.peak_bandwidth_gbs:g} GB/s", a.bandwidth
            ),
        }
    ]
    for p, v in gpu.ceiling_tflops.items():
        datasheet = f"{gpu.peak_tflops[p]:g} TFLOP/s" if p in gpu.peak_tflops else "none"
        ceilings.append(
            {
                "name": precision_label(gpu, p),
                "value": f"{tflops_text(v)} TFLOP/s",
                "used": p in used,
                "how": how(p in gpu.measured_tflops, datasheet, gpu.fraction(p)),
            }
        )
    return {
        "gpu_name": gpu.name,
        "badge": "measured" if gpu.is_measured else "datasheet × achievable",
        "measured": gpu.is_measured,
        "ceilings": ceilings,
        "no_ceilings": "",
        "gpu_source": gpu.source if gpu.is_measured else f"{gpu.source}: {a.source}",
        "gpu_resolution": f"{gpu.resolution} ({gpu.resolved_by})",
        "launch_floor": f"{gpu.launch_floor_us:g} µs per kernel ({gpu.launch_floor_source})",
    }


def _header(report: Report) -> dict[str, Any]:
    source = report.source
    command = source.get("command")
    if isinstance(command, (list, tuple)):
        command = shlex.join(str(part) for part in command)
    join = report.join
    if join:
        counters = counters_text(join)
        counters_ok = join["kernel_time_joined_share"] >= report.thresholds.join_warn
    else:
        counters = "none: rooflines from shape estimates (run `kerneltriage profile` for ncu counters)"
        counters_ok = False
    sources: dict[str, int] = {}
    for c in report.candidates:
        sources[c.roofline.source] = sources.get(c.roofline.source, 0) + 1
    return {
        **_gpu_header(report),
        "path": str(source.get("path", "")),
        "command": command,
        "applied_fixes": applied_fixes_line(source) if source.get("applied_fixes") else None,
        "versions": source.get("versions") or {},
        "status": source.get("status"),
        "steps": f"{report.steps} ({report.step_source})",
        "step_time": step_time_text(report),
        "gpu_busy": f"{ms(report.gpu_busy_ms)} ({report.gpu_busy_pct:.1f}%)",
        "idle": idle_text(report),
        "idle_bound": report.idle_bound,
        "counters": counters,
        "counters_ok": counters_ok,
        "unattributed": unattributed_text(report),
        "idle_line": idle_line(report),
        "host": host_text(report),
        "host_fix": host_fix_text(report),
        "communication": communication_line(report),
        "roofline_sources": ", ".join(
            f"{n} from {s}" for s, n in sorted(sources.items(), key=lambda kv: -kv[1])
        ),
        "schema": report.schema,
    }


def _summary(report: Report, candidates: list[Candidate]) -> list[dict[str, Any]]:
    return [
        {
            "id": c.id,
            "name": c.name,
            "verdict": c.verdict,
            "verdict_text": verdict_text(c),
            "saving": pct(c.expected_saving_share) if c.expected_saving_share else None,
            "saving_ms": ms(c.expected_saving_ms) if c.expected_saving_share else None,
        }
        for c in candidates
        if c.acted_on  # a fix verify refuted, or one that changes the results, is not worth acting on
    ]


def _breakdown(report: Report) -> list[dict[str, Any]]:
    from kerneltriage.render.breakdown import KIND_COLORS, KIND_LABELS, breakdown_items

    items = breakdown_items(report)
    total = sum(v for _, v in items) or 1.0
    return [
        {
            "kind": KIND_LABELS.get(k, k),
            "ms": ms(v),
            "share": pct(v / total),
            "color": KIND_COLORS.get(k, KIND_COLORS["other"]),
        }
        for k, v in items
    ]


def _num(value: float | None, fmt: str = ".3g", suffix: str = "") -> str:
    return "—" if value is None else f"{value:{fmt}}{suffix}"


def _candidate(c: Candidate, run_ref: str, rank: int | None = None) -> dict[str, Any]:
    r = c.roofline
    conditions = []
    for name in CONDITIONS:
        cond = c.conditions.get(name)
        if cond is None:
            conditions.append({"name": name, "mark": "?", "state": "unknown", "text": "not evaluated"})
            continue
        mark, label, text = condition_line(name, cond)
        state = "unknown" if cond.passed is None else ("pass" if cond.passed else "fail")
        conditions.append({"name": label, "mark": mark, "state": state, "text": text})
    roofline = [
        ("bytes per step", bytes_(r.bytes)),
        ("FLOPs per step", flops(r.flops)),
        ("arithmetic intensity", _num(r.intensity, ".3g", " FLOP/B")),
        ("achieved bandwidth", _num(r.achieved_gbs, ",.0f", " GB/s")),
        ("achieved compute", _num(r.achieved_tflops, ".3g", " TFLOP/s")),
        ("bound", r.bound or "—"),
        ("precision (compute roof)", r.precision or "—"),
        ("ceiling time per step", ms(r.ceiling_ms)),
        ("headroom (measured ÷ ceiling)", headroom_text(c)),
        (
            "ceiling source",
            r.source + (" (external inputs/outputs only)" if r.source == "fused estimate" else ""),
        ),
        ("DRAM bytes moved today (ncu)", bytes_(r.measured_dram_bytes)),
        ("time with joined counters", pct(r.counters_coverage)),
    ]
    shapes = c.shapes
    return {
        "id": c.id,
        "rank": c.rank,
        "name": c.name,
        "full_name": c.full_name or c.name,
        "kind": c.kind,
        "level": c.level,
        "variant": c.variant,
        "module": c.module,
        "ops": c.ops,
        "share": pct(c.time_share),
        "gpu_share": pct(c.gpu_share),
        "time": ms(c.time_ms_per_step),
        "fwd": ms(c.fwd_ms_per_step),
        "bwd": ms(c.bwd_ms_per_step),
        "instances": f"{c.instances_per_step:g}",
        "headroom": headroom_text(c),
        "bound": r.bound or "—",
        "distinct_shapes": shapes.distinct,
        "verdict": c.verdict,
        "verdict_text": verdict_text(c),
        "verdict_detail": c.reason
        if c.verdict == Verdict.SKIP
        else verdict_text(c, short=True).partition(": ")[2],
        "reason": c.reason,
        "builtin": c.builtin,
        "note": c.note,
        "saving": pct(c.expected_saving_share) if c.expected_saving_share else "—",
        "saving_ms": ms(c.expected_saving_ms) if c.expected_saving_share else None,
        "saving_basis": saving_basis(c),
        "realized": realized_cell(c.verification),
        "verification": verification_line(c.verification),
        "conditions": conditions,
        "roofline_line": roofline_line(c),
        "roofline": roofline,
        "fused": r.source == "fused estimate",
        "shapes": {
            "distinct": shapes.distinct,
            "dominant_coverage": pct(shapes.dominant_coverage),
            "varying_dims": ", ".join(shapes.varying_dims) or "none",
            "row_wise_stable": shapes.row_wise_stable,
            "signatures": [
                {
                    "shape": str(s.get("shape", "")),
                    "share": pct(s.get("share")),
                    "count": s.get("count", "—"),
                }
                for s in shapes.signatures
            ],
        },
        "kernels": [
            {
                "name": k.name,
                "full_name": k.full_name,
                "launches": f"{k.launches_per_step:g}",
                "time": ms(k.time_ms_per_step),
                "phase": k.phase,
                "joined": k.joined,
            }
            for k in c.kernels
        ],
        # Copies and collectives are no kernel: nothing to scaffold.
        "scaffold": scaffold_command(run_ref, c.id, rank, quote=True) if offers_scaffold(c) else None,
    }
