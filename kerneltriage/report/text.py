"""Number formatting and text shared by the renderers."""

from __future__ import annotations

from kerneltriage.analysis.model import Candidate, Condition, Report


def pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{100 * x:.{digits}f}%"


def counters_text(join: dict) -> str:
    """How much of the step the ncu counters cover (the report's ``join`` object)."""
    text = (
        f"{join['rows_joined']}/{join['rows']} ncu rows joined, covering "
        f"{pct(join['kernel_time_joined_share'])} of kernel time"
    )
    if "hot_time_joined_share" in join:
        text += (
            f"; hot kernels: {join['hot_kernels_joined']}/{join['hot_kernels']} with counters, "
            f"{pct(join['hot_time_joined_share'])} of their time"
        )
    return text


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
    if c.verdict == "skip":
        return f"skip ({c.reason})"
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


def idle_lines(report: Report) -> list[str]:
    """The idle-GPU warning: its headline, then the biggest idle causes. Idle time before a
    step's first kernel or after its last is named with what the host ran then."""
    from kerneltriage.analysis.idle import AFTER_LAST, BEFORE_FIRST

    lines = [
        f"The GPU is idle {report.idle_pct:.0f}% of the step: the step is bound by the host, not by kernels. "
        "No kernel fixes an idle GPU — every saving below shrinks only the busy part."
    ]
    for g in report.gaps[:5]:
        if g.cause.startswith((BEFORE_FIRST, AFTER_LAST)):
            lines.append(f"  {g.cause}")
            continue
        if g.count_per_step >= 1 or report.steps <= 1:
            count = f"in {g.count_per_step:.0f} gap(s)"
        else:
            # Fewer than one a step: say how many in how many steps, never "0.67 gap(s)".
            count = f"in {g.count_per_step * report.steps:.0f} gap(s) over {report.steps} steps"
        lines.append(f"  {ms(g.ms_per_step)} per step {count}: {g.cause}")
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
        parts.append(f"graph breaks: {comp.get('graph_breaks_per_step', 0):g} per step")
    else:
        parts.append("graph breaks: not visible (no Dynamo region or CompiledFunction in the trace)")
    lines = ["torch.compile: " + " · ".join(parts)]
    orphan = comp.get("inductor_launch_records_without_kernel_per_step") or 0
    if orphan:
        lines.append(
            f"  {orphan:g} Inductor launch record(s) per step launch no GPU kernel in the trace (captured into "
            "a CUDA graph, or run outside the profiled window): no GPU time is counted for them"
        )
    for b in comp.get("graph_breaks") or []:
        text = f"  break in {b['where']}: {b['graphs_per_call']} graphs per call"
        if b.get("empty_per_call"):
            text += f", {b['empty_per_call']:g} of them launch no GPU work (a wrapper or a break's stub)"
        if b.get("eager_ops_between"):
            text += "; eager between them: " + ", ".join(b["eager_ops_between"][:5])
        lines.append(text)
    for g in comp.get("launch_bound") or []:
        lines.append(
            f"  {g['graph']} → compile: {g['builtin']} (launch-bound): {g['note']}; "
            f"saving up to {pct(g.get('expected_saving_share'))} of step time"
        )
        if g.get("fix"):
            lines.append("    fix  " + g["fix"].replace("\n", "\n         "))
    return lines
