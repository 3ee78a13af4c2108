"""The roofline chart's layout before anything is drawn: where each candidate sits, the roofs,
the axes, which points get a label, and the key under the chart.

Every number comes from the report. A candidate sits at its arithmetic intensity and achieved
FLOP/s; its arrow ends at its ceiling, achieved × headroom (the rate it would reach at its
ceiling time). For a single kernel that point is on the roof; for an op of several kernels with
different intensities the ceiling is the sum of theirs and can sit below.

A fused region is drawn where it runs today: at the intensity of the DRAM traffic Nsight
Compute measured (when counters cover it), its arrow going to the fused ceiling at the fused
intensity (only external inputs and outputs cross HBM). The axes span the hot candidates;
a cold one far outside (a 0.0% optimizer call at 1e-5 TFLOP/s) is drawn clamped at the edge
with a triangle pointing its way, and the key says where it really is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.model import Candidate, Report
from kerneltriage.analysis.vocabulary import Verdict
from kerneltriage.render.text import ms, pct, times, truncate, verdict_text

MAX_LABELS = 8
# The axes span the hottest candidates that together hold this share of the placed time (and
# every actionable one); the rest fit in, or are drawn at the edge.
HOT_COVERAGE = 0.9


@dataclass
class Point:
    """A candidate placed on the roofline (TFLOP/s and FLOP/byte)."""

    candidate: Candidate
    intensity: float
    achieved: float
    ceiling: float | None  # achieved × headroom; None without a headroom
    roof: float | None  # the roof at the ceiling: min(ceiling(precision), ceiling_intensity × bandwidth)
    precision: str
    fused: bool
    ceiling_intensity: float = 0.0  # where the arrow ends: the fused intensity for a region
    measured: bool = False  # a fused region drawn at its ncu-measured DRAM bytes
    at: tuple[float, float] | None = None  # where the chart draws it (clamped into the axes)
    off_chart: str = ""  # "below", "left", "below-left", …: drawn at that edge

    @property
    def id(self) -> str:
        return self.candidate.id


@dataclass
class RooflineData:
    points: list[Point]
    not_placed: list[tuple[Candidate, str]]  # (candidate, why it cannot be placed)
    bandwidth_tbs: float | None  # memory ceiling, TB/s = TFLOP/s per FLOP/byte; None without a GPU
    roofs: dict[str, float]  # precision -> ceiling TFLOP/s, the precisions of the placed points
    measured: bool
    ceilings: str  # which ceilings the roofs are: measured, datasheet × achievable, or none


def _ceilings_kind(spec: GPUSpec | None) -> str:
    if spec is None:
        return "no ceilings (unknown GPU)"
    raised = spec.measured.get("raised") or {}
    if raised:
        return "measured ceilings, " + ", ".join(raised) + " raised to this run's fastest kernel"
    if spec.is_measured:
        return "measured ceilings"
    return "ceilings: datasheet × achievable"


def _why_not_placed(c: Candidate) -> str | None:
    r = c.roofline
    if r.intensity is None or r.achieved_tflops is None:
        if r.bytes and not r.flops:
            return "no FLOPs: data movement only"
        if not r.bytes and not r.flops:
            return "no byte or FLOP count"
        return "no intensity or achieved rate"
    if r.intensity <= 0 or r.achieved_tflops <= 0:
        return "no FLOPs: data movement only"
    return None


def roofline_data(report: Report, candidates: list[Candidate] | None = None) -> RooflineData:
    """The points, roofs and unplaceable candidates of the roofline chart."""
    spec = report.gpu
    cands = report.candidates if candidates is None else candidates
    bw = spec.ceiling_bandwidth_gbs / 1000.0 if spec is not None else None
    points, not_placed = [], []
    for c in cands:
        why = _why_not_placed(c)
        if why:
            not_placed.append((c, why))
            continue
        r = c.roofline
        assert r.intensity is not None and r.achieved_tflops is not None  # _why_not_placed
        x, y = float(r.intensity), float(r.achieved_tflops)
        fused = r.source == "fused estimate"
        ceiling_x = x
        # Today's position of a fused region: the same FLOPs over the DRAM bytes ncu measured.
        measured = False
        if fused and r.measured_dram_bytes and r.flops:
            measured = True
            x = float(r.flops) / float(r.measured_dram_bytes)
        if spec is None or bw is None:
            precision, roof = r.precision or "fp32", None
        else:
            precision = spec.unit(r.precision)
            roof = min(spec.ceiling_tflop(precision), ceiling_x * bw)
        ceiling = y * c.headroom if c.headroom else None
        points.append(Point(c, x, y, ceiling, roof, precision, fused, ceiling_x, measured))
    roofs: dict[str, float] = {}
    if spec is not None:
        roofs = {p.precision: spec.ceiling_tflop(p.precision) for p in points}
        if not roofs:
            roofs = {"fp32": spec.peak("fp32") / 1e12}
    roofs = dict(sorted(roofs.items(), key=lambda kv: -kv[1]))
    measured = spec is not None and spec.is_measured
    return RooflineData(points, not_placed, bw, roofs, measured, _ceilings_kind(spec))


def point_title(p: Point) -> str:
    """Hover text of a point (plain text; escaped where it is written)."""
    c, r = p.candidate, p.candidate.roofline
    lines = [
        f"{c.id}  {c.name}",
        f"→ {verdict_text(c)}",
        f"{pct(c.time_share)} of step · {ms(c.time_ms_per_step)} per step · {c.kind}",
    ]
    if p.measured:
        gbs = (
            (r.measured_dram_bytes or 0.0) / (c.time_ms_per_step * 1e-3) / 1e9 if c.time_ms_per_step else 0.0
        )
        lines += [
            f"today: intensity {p.intensity:.3g} FLOP/B · achieved {p.achieved:.3g} TFLOP/s · {gbs:.0f} GB/s "
            "(DRAM bytes measured by ncu)",
            f"fused: intensity {p.ceiling_intensity:.3g} FLOP/B (external inputs and outputs only)",
        ]
    else:
        lines.append(
            f"intensity {p.intensity:.3g} FLOP/B · achieved {p.achieved:.3g} TFLOP/s"
            + (f" · {r.achieved_gbs:.0f} GB/s" if r.achieved_gbs else "")
        )
    if p.off_chart:
        lines.append(f"off the chart ({p.off_chart}): drawn at the edge")
    if p.ceiling is not None:
        lines.append(
            f"ceiling {p.ceiling:.3g} TFLOP/s · headroom {times(c.headroom)} · {r.bound}-bound, {p.precision}"
        )
    if p.roof is not None:
        lines.append(f"roof here {p.roof:.3g} TFLOP/s · ceiling source: {r.source}")
    else:
        lines.append("no roof: no GPU ceilings")
    return "\n".join(lines)


def marker_radius_pt(share: float) -> float:
    return math.sqrt(marker_area(share)) / 2


def marker_area(share: float) -> float:
    """Marker area in pt² ∝ share of step time, with a floor so small ones stay visible."""
    return 28.0 + 1400.0 * max(share, 0.0)


def labelled_points(points: list[Point]) -> list[Point]:
    """Points that get an id label: every actionable one, then the hottest, up to MAX_LABELS."""
    ranked = sorted(points, key=lambda p: (p.candidate.verdict == Verdict.SKIP, p.candidate.rank))
    actionable = [p for p in ranked if p.candidate.verdict != Verdict.SKIP]
    rest = sorted(
        (p for p in ranked if p.candidate.verdict == Verdict.SKIP), key=lambda p: -p.candidate.time_share
    )
    return (actionable + rest)[: max(MAX_LABELS, len(actionable))]


def chart_key(data: RooflineData, labelled: list[Point]) -> list[str]:
    lines = []
    for p in sorted(labelled, key=lambda p: p.candidate.rank):
        c = p.candidate
        head = f"headroom {times(c.headroom)}" if c.headroom else "no headroom"
        verdict = truncate(verdict_text(c, short=True), 46)
        lines.append(f"{c.id}  {truncate(c.name, 52)} — {pct(c.time_share)} of step, {head} → {verdict}")
    off = [p for p in data.points if p.off_chart]
    if off:
        parts = [
            f"{p.candidate.id} ({pct(p.candidate.time_share)} of step, {p.achieved:.2g} TFLOP/s at "
            f"{p.intensity:.2g} FLOP/B)"
            for p in off
        ]
        lines.append(truncate("Off the chart, drawn at its edge: " + "; ".join(parts), 126))
    reasons: dict[str, list[str]] = {}
    for c, why in data.not_placed:
        reasons.setdefault(why, []).append(c.id)
    if reasons:
        parts = [f"{truncate(', '.join(ids), 40)} ({why})" for why, ids in reasons.items()]
        lines.append("Not placed: " + "; ".join(parts))
    return lines


def hot_points(points: list[Point]) -> list[Point]:
    """The points the axes span: the hottest covering ``HOT_COVERAGE`` of the placed time,
    and every actionable one."""
    total = sum(p.candidate.time_share for p in points)
    hot, covered = [], 0.0
    for p in sorted(points, key=lambda p: -p.candidate.time_share):
        if covered < HOT_COVERAGE * total or p.candidate.verdict != Verdict.SKIP:
            hot.append(p)
        covered += p.candidate.time_share
    return hot or points


def axis_limits(data: RooflineData) -> tuple[float, float, float, float]:
    """Axis limits (x_lo, x_hi, y_lo, y_hi) spanning the hot points, their ceilings and the
    roofs: a cold point decades away from the rest is clamped to the edge, not given decades."""
    hot = hot_points(data.points)
    bw = data.bandwidth_tbs
    peaks = list(data.roofs.values())
    xs = [p.intensity for p in hot] + [p.ceiling_intensity or p.intensity for p in hot] or [1.0]
    ys = [p.achieved for p in hot] or [1.0]
    tops = [p.ceiling for p in hot if p.ceiling]
    ridges = [peak / bw for peak in peaks] if bw else []
    x_lo = 10 ** math.floor(math.log10(min(xs) / 1.5))
    x_hi = 10 ** math.ceil(math.log10(max(xs + ridges) * 1.5))
    if bw and peaks:
        y_lo = 10 ** math.floor(math.log10(min(*ys, x_lo * bw * 2) / 1.5))
        y_hi = max(max(peaks) * 2.5, max(ys + tops) * 2)  # room for the roof labels (and noisy points)
    else:
        y_lo = 10 ** math.floor(math.log10(min(ys) / 1.5))
        y_hi = 10 ** math.ceil(math.log10(max(ys + tops) * 4))
    return x_lo, x_hi, y_lo, y_hi


def clamp(points: list[Point], x_lo: float, x_hi: float, y_lo: float, y_hi: float) -> None:
    """Where each point is drawn (``at``): its place, or the nearest spot just inside the edge
    it lies beyond (``off_chart`` names the edges)."""
    fx, fy = (x_hi / x_lo) ** 0.015, (y_hi / y_lo) ** 0.015
    for p in points:
        x, y = p.intensity, p.achieved
        where: list[str] = []
        if y < y_lo:
            y, where = y_lo * fy, [*where, "below"]
        elif y > y_hi:
            y, where = y_hi / fy, [*where, "above"]
        if x < x_lo:
            x, where = x_lo * fx, [*where, "left"]
        elif x > x_hi:
            x, where = x_hi / fx, [*where, "right"]
        p.at, p.off_chart = (x, y), "-".join(where)


def has_arrow(p: Point) -> bool:
    """An arrow from the point to its ceiling: one that is well above it, or a fused region's
    today position away from its fused intensity; none for a point drawn at the edge."""
    if p.ceiling is None or p.off_chart:
        return False
    across = p.measured and abs(math.log(p.ceiling_intensity / p.intensity)) > 0.05
    return p.ceiling > p.achieved * 1.02 or across
