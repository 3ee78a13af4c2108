"""Number formatting and text shared by the renderers."""

from __future__ import annotations

from kerneltriage.analysis.model import Candidate, Condition, Report
from kerneltriage.analysis.timeline.idle import (
    AFTER_LAST,
    BEFORE_FIRST,
    COMMUNICATION,
    DATA_LOADING,
    DEPENDENCY,
    HOST_BUSY,
    HOST_SYNC,
    STALL,
)
from kerneltriage.analysis.vocabulary import Reason, Verdict


def pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{100 * x:.{digits}f}%"


def counters_text(join: dict) -> str:
    """How much of the step the ncu counters cover (the report's ``join`` object)."""
    text = (
        f"{join['rows_joined']}/{join['rows']} ncu rows joined, covering "
        f"{pct(join['kernel_time_joined_share'])} of kernel time"
    )
    if join.get("kernel_time_scaled_share"):
        # Part of the joined time: elementwise sizes whose counters are another size's, scaled.
        text += f" ({pct(join['kernel_time_scaled_share'])} scaled from another size by threads)"
    if "hot_time_joined_share" in join:
        text += (
            f"; hot kernels: {join['hot_kernels_joined']}/{join['hot_kernels']} with counters, "
            f"{pct(join['hot_time_joined_share'])} of their time"
        )
    if join.get("tensor_precisions") is not None:
        counted = ", ".join(join["tensor_precisions"]) or "none (no hot kernel runs on tensor cores)"
        text += f"; tensor-core FLOPs counted for {counted}"
    return text


def truncate(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, the last an ellipsis when it was longer."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def times(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.0f}×" if x >= 100 else f"{x:.1f}×"


def ms(x: float | None) -> str:
    if x is None:
        return "—"
    if x >= 100:
        return f"{x:.0f} ms"
    if x >= 1:
        return f"{x:.2f} ms"
    return f"{x * 1000:.0f} µs"


def ms_range(low: float, high: float) -> str:
    """``47.96–47.98 ms``: one unit where both ends share it."""
    if min(low, high) >= 1.0:  # two decimals: a 165 ms step's interval is 164.57–164.64 ms
        return f"{low:.2f}–{high:.2f} ms"
    a, b = ms(low), ms(high)
    unit_a, unit_b = a.rsplit(" ", 1)[-1], b.rsplit(" ", 1)[-1]
    return f"{a.rsplit(' ', 1)[0]}–{b}" if unit_a == unit_b else f"{a}–{b}"


def step_time_text(report: Report) -> str:
    """``47.97 ms (95% interval 47.96–47.98 ms, spread 10 µs)``: the step time with its interval,
    the steps' spread, and the warm-up transient cut from the plain steps."""
    parts = []
    if report.step_interval_ms is not None:
        processes = (report.source.get("timing") or {}).get("processes") or 1
        if processes > 1:  # where a further run of the script falls (steady.run_interval)
            parts.append(
                f"a run falls in {ms_range(*report.step_interval_ms)} (95%, from {processes} processes)"
            )
        else:
            parts.append(f"95% interval {ms_range(*report.step_interval_ms)}")
    if report.step_spread_ms is not None:
        parts.append(f"spread {ms(report.step_spread_ms)}")
    if report.step_transient:
        parts.append(f"{report.step_transient} warm-up steps cut")
    if report.step_settled is False:
        parts.append("not settled")
    text = ms(report.step_time_ms) + (f" ({', '.join(parts)})" if parts else "")
    p = report.step_processes
    if p and p.get("median_ms") is not None:
        between = f" ({ms_range(p['low_ms'], p['high_ms'])})" if p.get("low_ms") is not None else ""
        text += f"; over {p['runs']} processes (verify's baseline) {ms(p['median_ms'])}{between}"
    return text


def idle_text(report: Report) -> str:
    """``idle 1.7%`` or ``idle 1.7% (1.6–1.8%)``."""
    text = f"{report.idle_pct:.1f}%"
    if report.idle_interval_pct is not None:
        low, high = sorted(report.idle_interval_pct)
        if round(high - low, 1) > 0:
            text += f" ({low:.1f}–{high:.1f}%)"
    return text


def bytes_(x: float | None) -> str:
    if x is None:
        return "—"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B"


def flops(x: float | None) -> str:
    if x is None:
        return "—"
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} FLOP"


def verdict_text(c: Candidate, short: bool = False) -> str:
    """``use-builtin: torch.nn.functional.scaled_dot_product_attention``; ``short`` keeps only
    the last name (``use-builtin: scaled_dot_product_attention``) for tables."""
    if c.verdict == Verdict.SKIP:
        return f"{c.verdict} ({c.reason})"
    if c.builtin:
        name = c.builtin.split(" ")[0].rsplit(".", 1)[-1] if short else c.builtin
        return f"{c.verdict}: {name}"
    return c.verdict


def condition_line(name: str, cond: Condition) -> tuple[str, str, str]:
    """(mark, name, text) for one condition."""
    mark = "?" if cond.passed is None else ("✓" if cond.passed else "✗")
    if name == "headroom":
        value = "unknown" if cond.value is None else f"{times(cond.value)} (needs ≥ {cond.threshold:g}×)"
    elif name == "hotness":
        value = f"{pct(cond.value)} of step (needs ≥ {pct(cond.threshold, 0)} or top share)"
    else:
        value = f"{cond.value:.0f} shape(s) (≤ {cond.threshold:.0f}, or dominant coverage / row-wise)"
    return mark, name, f"{value} — {cond.detail}"


def saving_basis(c: Candidate) -> str:
    """How a row's saving was computed (the analysis says, per candidate; Amdahl by default)."""
    return str(c.attrs.get("saving_basis") or "share × (1 − 1/headroom)")


def saving_cell(c: Candidate) -> str:
    """A candidate's expected saving in a table: a share of the step, ``—`` without one."""
    return pct(c.expected_saving_share) if c.expected_saving_share else "—"


def roofline_line(c: Candidate) -> str:
    r = c.roofline
    if r.ceiling_ms is None:
        if r.achieved_tflops:
            # Library attention outside its table: the rate its shapes give, and no ceiling.
            return f"{flops(r.flops)} per step, achieved {r.achieved_tflops:.1f} TFLOP/s (recorded shapes); no ceiling"
        return "no roofline placement (no counters, no shape model)"
    parts = [
        f"{bytes_(r.bytes)} and {flops(r.flops)} per step",
        f"intensity {r.intensity:.3g} FLOP/B" if r.intensity else "",
        f"achieved {r.achieved_gbs:.0f} GB/s" if r.achieved_gbs else "",
        f"{r.achieved_tflops:.1f} TFLOP/s" if r.achieved_tflops else "",
        f"{r.bound}-bound",
        f"ceiling {ms(r.ceiling_ms)}",
        f"[{r.source}]",
    ]
    line = ", ".join(p for p in parts[:-1] if p) + " " + parts[-1]
    if r.measured_dram_bytes and r.source == "fused estimate":
        line += f"; today it moves {bytes_(r.measured_dram_bytes)} of DRAM traffic per step (ncu)"
    return line


def _share(report: Report, x: float, kind: str = "") -> str:
    """``x`` ms as a share of the step: of the step without its single stalls, unless ``x`` is
    a stall itself."""
    idle = report.idle
    base = idle.share_step_ms if idle is not None and kind != STALL else report.step_time_ms
    return pct(x / base if base else 0.0, 0)


def _spread(report: Report) -> str:
    return f" per step; steps' spread {ms(report.step_spread_ms)}" if report.step_spread_ms else " per step"


def _cause_name(cause: str | None) -> str:
    """What a gap cause names: without its class prefix, or (a stall) without the stall's."""
    if not cause:
        return ""
    if cause.startswith(f"{STALL} in "):
        return cause.split(": ", 1)[1]
    for edge in (BEFORE_FIRST, AFTER_LAST):
        if cause.startswith(edge):
            return edge
    for prefix in (HOST_BUSY, HOST_SYNC, DATA_LOADING):
        if cause.startswith(f"{prefix}: "):
            return cause[len(prefix) + 2 :]
    return cause


_LEAD_TEXT = {
    HOST_BUSY: "the host busy with its own work while the GPU waits for launches",
    HOST_SYNC: "the host blocked in calls that wait for the GPU",
    DEPENDENCY: "kernels queued but waiting on another stream, an event or a graph",
    DATA_LOADING: "data loading",
    COMMUNICATION: "communication that no compute kernel overlaps",
}


def idle_headline(report: Report) -> str:
    """The idle GPU's headline: how much, and the cause class that leads it with its share."""
    idle = report.idle
    if idle is None:  # a report made before idle was split by cause
        return (
            f"The GPU is idle {report.idle_pct:.0f}% of the step: the step is bound by the host, not by kernels. "
            "No kernel fixes an idle GPU — every saving below shrinks only the busy part."
        )
    comm = idle.classes.get(COMMUNICATION, 0.0)
    text = f"The GPU is idle {report.idle_pct:.0f}% of the step ({ms(idle.ms_per_step)}{_spread(report)})"
    if comm >= 0.01 * report.step_time_ms:
        text += f" and waits {_share(report, comm)} more on exposed communication"
    lead = idle.lead
    lead_ms = idle.classes.get(lead, 0.0) if lead else 0.0
    if lead == STALL:
        text += (
            f". One stall leads it: {ms(lead_ms)} ({_share(report, lead_ms, STALL)} of the step) in a single gap, "
            f"{_cause_name(idle.lead_cause)}. It is a one-off, not the step's pattern: the shares below are of the "
            f"step without it ({ms(idle.share_step_ms)})."
        )
    elif lead:
        text += f". Led by {lead}: {ms(lead_ms)} per step ({_share(report, lead_ms)} of the step), {_LEAD_TEXT[lead]}"
        biggest = next((g for g in report.gaps if g.kind == lead), None)
        named = _cause_name(idle.lead_cause)
        if named and biggest is not None and lead != DEPENDENCY:
            text += f"; the largest: {named}, {ms(biggest.ms_per_step)} per step"
        text += "."
    if lead != COMMUNICATION:
        text += " No kernel fixes an idle GPU — every saving below shrinks only the busy part."
    fixed = next((g for g in report.gaps if g.fix and g.kind == lead), None)
    if fixed is not None:
        # Every gap the same fix covers (the optimizer's for-loop spans mul_, addcdiv_, div …).
        same = [g for g in report.gaps if g.fix == fixed.fix and g.kind == lead]
        if len(same) == 1:
            text += f" {_cause_name(fixed.cause)} ({ms(fixed.ms_per_step)} per step) is {fixed.fix}."
        else:
            names = ", ".join(_cause_name(g.cause) for g in same[:4]) + (" …" if len(same) > 4 else "")
            together = sum(g.ms_per_step for g in same)
            text += f" {names} ({ms(together)} per step together) is {fixed.fix}."
    return text


def idle_line(report: Report) -> str | None:
    """The one line idle gets when it is not the headline (below the noise or the cut-off)."""
    idle = report.idle
    if idle is None or idle.above_noise or idle.ms_per_step <= 0:
        return None
    t = report.thresholds
    if idle.share < t.idle_warn:
        why = f"under {pct(t.idle_warn, 0)} of the step"
    elif report.idle_interval_pct is not None and report.source.get("timing"):
        low = min(report.idle_interval_pct)
        why = f"{low:.1f}% at the step interval's low end, under {pct(t.idle_warn, 0)}"
    else:
        why = f"within {t.idle_noise:g}× the steps' spread ({ms(report.step_spread_ms)})"
    text = f"Idle: {ms(idle.ms_per_step)} per step ({pct(idle.share)}), {why}: not a headline"
    causes = [c for c in idle.classes if c != COMMUNICATION]
    if causes:
        biggest = next((g for g in report.gaps if (g.kind or HOST_BUSY) == causes[0]), None)
        text += f"; mostly {causes[0]}" + (f" ({_cause_name(biggest.cause)})" if biggest is not None else "")
    return text


def communication_line(report: Report) -> str | None:
    """Communication per step and the part of it no compute overlaps (None: none)."""
    if report.communication_ms_per_step <= 0:
        return None
    exposed = report.exposed_communication_ms_per_step
    split = report.source.get("communication") or {}
    waited = (
        f"; {ms(split['wait_ms_per_step'])} of it waiting for a rank still in a profiled step, left out"
        if split.get("wait_left_out")
        else ""
    )
    return (
        f"Communication: {ms(report.communication_ms_per_step)} per step, {ms(exposed)} exposed "
        f"({_share(report, exposed)} of the step: no compute kernel runs beside it){waited}"
    )


def unattributed_text(report: Report) -> str:
    """Kernel time in the steps that no op, module or region holds, and how much of it was
    launched before the profiled window."""
    text = (
        f"{ms(report.unattributed_ms_per_step)} per step ({pct(report.unattributed_share)} of GPU-busy time"
    )
    if report.unattributed_before_window_ms > 0:
        text += f"; {ms(report.unattributed_before_window_ms)} of it launched before the profiled window"
    return text + ")"


def idle_lines(report: Report) -> list[str]:
    """The idle-GPU warning: its headline, then the biggest idle causes. Idle time before a
    step's first kernel or after its last is named with what the host ran then."""
    lines = [idle_headline(report)]
    for g in report.gaps[:8]:
        if g.cause.startswith((BEFORE_FIRST, AFTER_LAST)):
            lines.append(f"  {g.cause}")
        else:
            if g.count_per_step >= 1 or report.steps <= 1:
                count = f"in {g.count_per_step:.0f} gap(s)"
            else:
                # Fewer than one a step: say how many in how many steps, never "0.67 gap(s)".
                count = f"in {g.count_per_step * report.steps:.0f} gap(s) over {report.steps} steps"
            lines.append(f"  {ms(g.ms_per_step)} per step {count}: {g.cause}")
        if g.fix:
            lines.append(f"    → {g.fix}")
    return lines


# Where a headroom comes from, in a word (the full source is in the candidate's detail).
_HEADROOM_SOURCE = {
    "ncu": "ncu",
    "ncu+estimate": "ncu",
    "estimate": "est.",
    "fused estimate": "fused",
    "attention table": "table",
}


def headroom_text(c) -> str:
    """``44.9× fused``: the headroom and its source (ncu counters, shape estimate, fused
    estimate, measured attention table), ``launch`` when the launch floor sets the ceiling."""
    if c.headroom is None:
        return "—"
    if c.headroom < 1.0:
        # Faster than its ceiling: the measurement and the ceiling disagree (no verdict input).
        return f"{times(c.headroom)} disagrees"
    source = (
        "launch" if c.roofline.launch_bound else _HEADROOM_SOURCE.get(c.roofline.source, c.roofline.source)
    )
    return f"{times(c.headroom)} {source}"


def _dynamo_parts(dynamo: dict) -> list[str]:
    """Dynamo's own counts (``TORCH_LOGS=graph_breaks,recompiles`` reports the same)."""
    return [
        f"graphs compiled: {dynamo.get('unique_graphs', 0)}",
        f"graph breaks: {dynamo.get('graph_breaks', 0)}",
        f"recompiles: {dynamo.get('recompiles', 0)} (Dynamo's counters, before any profiler ran)",
    ]


def compiled_lines(report: Report) -> list[str]:
    """torch.compile in the trace: compiled regions, graph breaks and recompiles with where
    they happen, and the launch-bound graphs with their fix (empty without compiled code)."""
    comp = report.compiled
    if not comp:
        return []
    parts = []
    if comp.get("regions_per_step"):
        frames = ", ".join(map(str, comp.get("frames") or []))
        parts.append(f"{comp['regions_per_step']:g} compiled region(s) per step (Dynamo frames {frames})")
    if comp.get("compiled_functions_per_step"):
        parts.append(f"{comp['compiled_functions_per_step']:g} AOT graph(s) (CompiledFunction) per step")
    if comp.get("fx_graph_calls_per_step") and not comp.get("regions_per_step"):
        parts.append(f"{comp['fx_graph_calls_per_step']:g} compiled FX graph call(s) per step")
    dynamo = comp.get("dynamo")
    if dynamo:
        parts += _dynamo_parts(dynamo)
    else:
        recompiles = comp.get("recompiles") or []
        parts.append(
            "recompiles: "
            + (
                ", ".join(
                    f"frame {r['frame']} compiled {r['compilations']}× (in {r['where']})" for r in recompiles
                )
                if recompiles
                else "none seen"
            )
        )
        if comp.get("regions_per_step") or comp.get("compiled_functions_per_step"):
            parts.append(f"graph breaks: {comp.get('graph_breaks_per_step', 0):g} per step (from the trace)")
        else:
            parts.append("graph breaks: not visible (no Dynamo region or CompiledFunction in the trace)")
    lines = ["torch.compile: " + " · ".join(parts)]
    orphan = comp.get("inductor_launch_records_without_kernel_per_step") or 0
    if orphan:
        lines.append(
            f"  {orphan:g} Inductor launch record(s) per step launch no GPU kernel in the trace (captured into "
            "a CUDA graph, or run outside the profiled window): no GPU time is counted for them"
        )
    for d in (dynamo or {}).get("graph_break_reasons") or []:
        lines.append(f"  graph break ×{d['count']}: {d['reason']}")
    for r in (dynamo or {}).get("recompile_reasons") or []:
        lines.append(f"  recompile of {r['code']}: {r['reason']}")
    for b in [] if dynamo else comp.get("graph_breaks") or []:
        text = f"  break in {b['where']}: {b['graphs_per_call']} graphs per call"
        if b.get("empty_per_call"):
            text += f", {b['empty_per_call']:g} of them launch no GPU work (a wrapper or a break's stub)"
        if b.get("eager_ops_between"):
            text += "; eager between them: " + ", ".join(b["eager_ops_between"][:5])
        lines.append(text)
    for g in comp.get("launch_bound") or []:
        lines.append(
            f"  {g['graph']} → {Verdict.COMPILE}: {g['builtin']} ({Reason.LAUNCH_BOUND}): {g['note']}; "
            f"saving up to {pct(g.get('expected_saving_share'))} of step time"
        )
        if g.get("fix"):
            lines.append("    fix  " + g["fix"].replace("\n", "\n         "))
    return lines
