"""The header of a terminal or Markdown report: the GPU and its ceilings, the steps and how
they were timed, idle time, communication, counters and unattributed kernel time."""

from __future__ import annotations

from kerneltriage.analysis.model import Report
from kerneltriage.render.gpu_text import gpu_lines
from kerneltriage.render.ladder_text import applied_fixes_line
from kerneltriage.render.text import (
    communication_line,
    counters_text,
    idle_line,
    idle_text,
    ms,
    step_time_text,
    unattributed_text,
)


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
    host = _host_part(t.get("host") or {})
    if host:
        parts.append(host)
    return " · ".join(parts)


def _host_part(host: dict) -> str:
    if host.get("judged"):
        return (
            f"host issues a step in {ms(host['host_issue_ms'])} from an idle GPU "
            f"({host['share_of_step']:.0%} of the step, {host['samples']} steps)"
        )
    return f"host time not judged: {host.get('why_not', '')}" if host else ""


def host_text(report: Report) -> str:
    """The host's time to issue a step against the step ('' where not measured)."""
    return _host_part((report.source.get("timing") or {}).get("host") or {})


def host_fix_text(report: Report) -> str:
    """The step-level fix of a step the host paces ('' where there is none)."""
    fix = ((report.source.get("timing") or {}).get("host") or {}).get("fix")
    return _step_fix_line(fix) if fix else ""


def _step_fix_line(fix: dict) -> str:
    """The fix of a step the host paces (CUDA graphs), its prediction and what verify found."""
    line = (
        f"Host-paced step → {fix['id']}: {fix['fix'].splitlines()[0]} · predicted "
        f"{fix['predicted_saving_share']:.1%} ({fix['saving_basis']})"
    )
    v = fix.get("verification") or {}
    if v.get("status"):
        realized = v.get("realized_saving_share")
        line += f" · verify: {v['status']}" + (f", realized {realized:.1%}" if realized is not None else "")
    else:
        line += f" · `kerneltriage verify RUN --candidates {fix['id']}` measures it"
    return line


def header_lines(report: Report) -> list[str]:
    lines = [
        *gpu_lines(report),
        f"Steps: {report.steps} ({report.step_source}) · step time {step_time_text(report)}"
        + f" · GPU busy {report.gpu_busy_pct:.1f}% · idle {idle_text(report)}",
    ]
    if report.source.get("applied_fixes"):
        lines.append(applied_fixes_line(report.source))
    if report.source.get("timing"):
        lines.append(_timing_line(report.source["timing"]))
        fix = (report.source["timing"].get("host") or {}).get("fix")
        if fix:
            lines.append(_step_fix_line(fix))
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
