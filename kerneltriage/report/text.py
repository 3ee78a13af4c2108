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
        count = f"{g.count_per_step:.0f}" if g.count_per_step >= 1 else f"{g.count_per_step:.2g}"
        lines.append(f"  {ms(g.ms_per_step)} per step in {count} gap(s): {g.cause}")
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
    source = (
        "launch" if c.roofline.launch_bound else _HEADROOM_SOURCE.get(c.roofline.source, c.roofline.source)
    )
    return f"{times(c.headroom)} {source}"
