"""The three conditions of a candidate against the rules' thresholds (headroom, hotness, shape
stability), each compared on the figure the report shows, and what its headroom rests on.

Headroom = measured time ÷ roofline ceiling; a headroom below 1 is a disagreement between the
measurement and its ceiling, never a condition passed or failed. Hotness is the candidate's
share of the step (or its rank among the hottest); stability, few shape signatures or a
dominant few.
"""

from __future__ import annotations

from typing import Any

from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.model import Candidate, Condition
from kerneltriage.analysis.rules import Rules


def shown_share(share: float) -> float:
    """A share as the report shows it (one decimal of a percent): thresholds are compared on
    the figure the row shows, so a row reading "3.0%" passes "≥ 3%"."""
    return round(share * 1000.0) / 1000.0


def shown_headroom(h: float) -> float:
    """A headroom as the report shows it (``render.text.times``: one decimal, none from 100)."""
    return float(round(h)) if h >= 100 else round(h, 1)


def set_conditions(c: Candidate, rules: Rules, top: bool) -> None:
    """The three conditions of ``c`` against the rules' thresholds; ``top``: it is among the
    hottest ``top_fraction`` of the candidates."""
    t = rules.thresholds
    max_shapes = t.max_shapes
    shares = [s["share"] for s in c.shapes.signatures]
    c.shapes.dominant_coverage = float(sum(shares[:max_shapes])) if shares else 0.0
    h = c.headroom
    c.conditions["headroom"] = Condition(
        value=h,
        threshold=t.min_headroom,
        # Within the rules' at_roof of the ceiling is at the roof whatever --min-headroom
        # says; below 1 the measurement and its ceiling disagree: no verdict is built on it.
        passed=None
        if h is None or h < 1.0
        else shown_headroom(h) >= max(t.min_headroom, rules.thresholds.at_roof),
        detail=_headroom_detail(c),
    )
    share = shown_share(c.time_share)
    hot = share >= t.min_share or (top and share >= t.min_share_floor)
    c.conditions["hotness"] = Condition(
        value=c.time_share,
        threshold=t.min_share,
        passed=hot,
        detail=f"{c.time_share:.1%} of step time ({c.gpu_share:.1%} of GPU-busy time)"
        + (f"; among the hottest {t.top_fraction:.0%}" if top else ""),
    )
    stable = (
        c.shapes.distinct <= max_shapes
        or c.shapes.dominant_coverage >= t.min_dominant_coverage
        or c.shapes.row_wise_stable
    )
    detail = (
        f"{c.shapes.distinct} shape signature(s); top {max_shapes} cover {c.shapes.dominant_coverage:.0%}"
    )
    if c.shapes.varying_dims:
        detail += f"; varying: {', '.join(c.shapes.varying_dims[:6])}"
        if c.shapes.row_wise_stable:
            detail += " (row-wise op, last dim fixed: stable)"
    c.conditions["stability"] = Condition(
        value=float(c.shapes.distinct), threshold=float(max_shapes), passed=stable, detail=detail
    )


def headroom_basis(c: Candidate, gpu: GPUSpec | None) -> dict[str, Any] | None:
    """What a candidate's headroom rests on, in the JSON: its kind (ncu counters, a shape
    model of this trace's recorded shapes, a fused-region model, a measured attention rate,
    the launch floor), the shapes' origin, the precision and fill of the ceiling, and whether
    the GPU's achievable fractions were measured on its family. None without a headroom."""
    if c.headroom is None:
        return None
    r = c.roofline
    kind = {
        "ncu": "ncu counters",
        "ncu+estimate": "ncu counters (raised to the shape model's ceiling)",
        "estimate": "shape model",
        "fused estimate": "fused-region shape model",
        "attention table": "measured attention rate",
        "first principles": "first-principles ceiling",
    }.get(r.source, r.source)
    basis: dict[str, Any] = {
        "kind": "launch floor" if r.launch_bound and r.source != "attention table" else kind,
        "source": r.source,
        "shapes": c.attrs.get("shapes_from") or ("recorded op shapes" if c.example else "none"),
        "precision": r.precision,
        "disagreement": c.headroom < 1.0,
    }
    if r.source == "attention table":
        basis["table"] = c.attrs.get("attention_table")
    elif r.source == "first principles":
        basis["first_principles"] = c.attrs.get("first_principles")
    else:
        basis["fill"] = round(r.fill, 3)
        if r.launch_bound:
            basis["launches_per_step"] = r.launches_per_step
    if gpu is not None:
        basis["gpu"] = gpu.key
        basis["achievable"] = gpu.achievable.label
    return basis


def _headroom_detail(c: Candidate) -> str:
    r = c.roofline
    if c.headroom is None:
        if r.source == "no GPU":
            return "no GPU spec (the trace names no known GPU): no ceiling; pass --gpu"
        return "no counters and no shape model for this op: headroom unknown"
    if r.source == "attention table":
        return c.attrs.get("attention_rates", "")
    if c.headroom < 1.0:
        return (
            f"{c.time_ms_per_step:.3g} ms measured vs {r.ceiling_ms:.3g} ms ceiling [{r.source}]: it ran "
            f"{1 / c.headroom:.2f}× faster than its ceiling allows, a measurement disagreement, not a headroom"
        )
    stats = bool(c.attrs.get("batch_statistics"))  # a batch norm's statistics: a pass of their own
    if r.source == "fused estimate":
        what = "fused ceiling (external inputs/outputs" + (
            ", and the pass its batch statistics take)" if stats else " only)"
        )
    else:
        what = f"{r.bound}-bound ceiling" + (" (with the pass its batch statistics take)" if stats else "")
    if r.launch_bound:
        what = f"launch floor ({r.launches_per_step:.3g} launches per step as launched × {_floor_us(r):.3g} µs, no launch above what it ran; the work alone needs {_ms(r.work_ceiling_ms)})"
    elif r.fill < 0.95:
        what += f" (its output tiles fill {r.fill:.0%} of the SMs)"
    return f"{c.time_ms_per_step:.3g} ms measured vs {r.ceiling_ms:.3g} ms {what} [{r.source}]"


def _floor_us(r) -> float:
    return r.launch_floor_ms * 1e3 / r.launches_per_step if r.launches_per_step else 0.0


def _ms(value: float | None) -> str:
    return "nothing measurable" if not value else f"{value:.3g} ms"
