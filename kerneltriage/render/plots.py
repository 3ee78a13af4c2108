"""Charts of a ``Report``: the roofline and the time breakdown of one step, as matplotlib
figures (``--plot roofline.png|.svg``) and as inline SVG for the HTML report.

Rendering only: every number drawn comes from the report. A candidate sits at its arithmetic
intensity and achieved FLOP/s; its arrow ends at its ceiling, achieved × headroom (the rate it
would reach at its ceiling time). For a single kernel that point is on the roof; for an op of
several kernels with different intensities the ceiling is the sum of theirs and can sit below.

A fused region is drawn where it runs today: at the intensity of the DRAM traffic Nsight
Compute measured (when counters cover it), its arrow going to the fused ceiling at the fused
intensity (only external inputs and outputs cross HBM). The axes span the hot candidates;
a cold one far outside (a 0.0% optimizer call at 1e-5 TFLOP/s) is drawn clamped at the edge
with a triangle pointing its way, and the key says where it really is.

matplotlib is imported inside the functions (Agg canvas, no pyplot) so that importing
``kerneltriage.render`` stays light.
"""

from __future__ import annotations

import html as _html
import io
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.model import Candidate, Report
from kerneltriage.analysis.vocabulary import Verdict
from kerneltriage.errors import InputError
from kerneltriage.render.text import ms, pct, times, verdict_text

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

PLOT_SUFFIXES = (".png", ".svg")
VERDICT_COLORS = {
    Verdict.WRITE: "#1a9850",
    Verdict.USE_BUILTIN: "#2166ac",
    Verdict.COMPILE: "#e08214",
    Verdict.SKIP: "#8c8c8c",
}
VERDICT_LABELS = {
    Verdict.WRITE: "write a kernel",
    Verdict.USE_BUILTIN: "use a built-in",
    Verdict.COMPILE: "try torch.compile",
    Verdict.SKIP: Verdict.SKIP.value,
}
KIND_COLORS = {
    "attention": "#4e79a7",
    "gemm": "#f28e2b",
    "norm": "#59a14f",
    "elementwise": "#e15759",
    "reduction": "#76b7b2",
    "softmax": "#edc948",
    "cross-entropy": "#b07aa1",
    "embedding": "#ff9da7",
    "optimizer": "#9c755f",
    "communication": "#17becf",
    "memcpy": "#bcbd22",
    "other": "#7f7f7f",
    "idle": "#d9d9d9",
}
KIND_LABELS = {"gemm": "GEMM"}
MAX_LABELS = 8
# The axes span the hottest candidates that together hold this share of the placed time (and
# every actionable one); the rest fit in, or are drawn at the edge.
HOT_COVERAGE = 0.9
_INK = "#222222"
_ROOF = "#3b3b3b"
_FONT = {
    "font.family": "DejaVu Sans",
    "font.size": 9.5,
    "svg.fonttype": "path",
    "svg.hashsalt": "kerneltriage",
}


# --- data -----------------------------------------------------------------------------------


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


# --- figures --------------------------------------------------------------------------------


def _figure(width: float, height: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, facecolor="white")
    FigureCanvasAgg(fig)
    return fig


def _rc():
    import matplotlib

    return matplotlib.rc_context(_FONT)


def _marker_radius_pt(share: float) -> float:
    return math.sqrt(_marker_area(share)) / 2


def _marker_area(share: float) -> float:
    """Marker area in pt² ∝ share of step time, with a floor so small ones stay visible."""
    return 28.0 + 1400.0 * max(share, 0.0)


def _fmt_tick(value: float, _pos: Any = None) -> str:
    if value <= 0:
        return ""
    if value >= 1:
        return f"{value:,.0f}"
    return f"{value:g}"


def _labelled(points: list[Point]) -> list[Point]:
    """Points that get an id label: every actionable one, then the hottest, up to MAX_LABELS."""
    ranked = sorted(points, key=lambda p: (p.candidate.verdict == Verdict.SKIP, p.candidate.rank))
    actionable = [p for p in ranked if p.candidate.verdict != Verdict.SKIP]
    rest = sorted(
        (p for p in ranked if p.candidate.verdict == Verdict.SKIP), key=lambda p: -p.candidate.time_share
    )
    return (actionable + rest)[: max(MAX_LABELS, len(actionable))]


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _key_lines(data: RooflineData, labelled: list[Point]) -> list[str]:
    lines = []
    for p in sorted(labelled, key=lambda p: p.candidate.rank):
        c = p.candidate
        head = f"headroom {times(c.headroom)}" if c.headroom else "no headroom"
        verdict = _short(verdict_text(c, short=True), 46)
        lines.append(f"{c.id}  {_short(c.name, 52)} — {pct(c.time_share)} of step, {head} → {verdict}")
    off = [p for p in data.points if p.off_chart]
    if off:
        parts = [
            f"{p.candidate.id} ({pct(p.candidate.time_share)} of step, {p.achieved:.2g} TFLOP/s at "
            f"{p.intensity:.2g} FLOP/B)"
            for p in off
        ]
        lines.append(_short("Off the chart, drawn at its edge: " + "; ".join(parts), 126))
    reasons: dict[str, list[str]] = {}
    for c, why in data.not_placed:
        reasons.setdefault(why, []).append(c.id)
    if reasons:
        parts = [f"{_short(', '.join(ids), 40)} ({why})" for why, ids in reasons.items()]
        lines.append("Not placed: " + "; ".join(parts))
    return lines


_OFF_MARKERS = {"below": "v", "above": "^", "left": "<", "right": ">"}


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


def _limits(data: RooflineData) -> tuple[float, float, float, float]:
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


def _clamp(points: list[Point], x_lo: float, x_hi: float, y_lo: float, y_hi: float) -> None:
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


def _has_arrow(p: Point) -> bool:
    """An arrow from the point to its ceiling: one that is well above it, or a fused region's
    today position away from its fused intensity; none for a point drawn at the edge."""
    if p.ceiling is None or p.off_chart:
        return False
    across = p.measured and abs(math.log(p.ceiling_intensity / p.intensity)) > 0.05
    return p.ceiling > p.achieved * 1.02 or across


def roofline_figure(report: Report, *, candidates: list[Candidate] | None = None, key: bool = True) -> Figure:
    """The roofline chart: log-log intensity vs achieved TFLOP/s, the memory roof and a compute
    roof per precision used, a point per candidate (area ∝ time share, colour = verdict, diamond =
    fused region at its fused intensity) with an arrow up to its ceiling. ``key`` adds the
    labelled candidates' names under the chart (for a standalone image). Without a GPU there
    are no roofs: the points that can be placed, and a note saying why there is no roof."""
    data = roofline_data(report, candidates)
    labelled = _labelled(data.points)
    x_lo, x_hi, y_lo, y_hi = _limits(data)
    _clamp(data.points, x_lo, x_hi, y_lo, y_hi)
    key_lines = _key_lines(data, labelled) if key else []
    top_in, axes_in, bottom_in = 0.75, 5.4, 0.65
    key_in = 0.2 * len(key_lines) + (0.15 if key_lines else 0.0)
    width = 10.0
    height = top_in + axes_in + bottom_in + key_in
    with _rc():
        fig = _figure(width, height)
        ax = fig.add_axes(
            (0.075, (bottom_in + key_in) / height, 0.875, axes_in / height),
        )
        ax.set_xscale("log")
        ax.set_yscale("log")

        bw = data.bandwidth_tbs
        peaks = list(data.roofs.values())
        ridges = [peak / bw for peak in peaks] if bw else []
        ax.set_xlim(x_lo, x_hi)
        ax.set_ylim(y_lo, y_hi)

        top_ridge = max(ridges) if bw and ridges else None
        if bw is None or top_ridge is None:
            no_roofs = (
                "No roofs: the GPU is unknown, so there are no ceilings.\n"
                "Pass --gpu KEY to place the candidates against them."
            )
            _corner_note(ax, 0.98, 0.03, no_roofs, fontsize=10, color="#555555", gid="kt-no-ceilings")
        else:
            _draw_roofs(ax, data, bw, top_ridge, x_lo, x_hi, y_lo, peaks)
        _draw_points(ax, data)
        _style_log_axes(ax)
        _draw_titles(fig, report, data, height)
        legend = _draw_legend(ax, data)
        if any(p.off_chart for p in data.points) and not key_lines:  # no key: say it on the chart
            off = ", ".join(p.id for p in data.points if p.off_chart)
            note = f"{off}: off the chart, drawn at the edge"
            _corner_note(ax, 0.99, 0.01, note, fontsize=8, color="#666666", gid="kt-off-chart")
        _place_labels(fig, ax, data, labelled, legend, top_ridge)
        if key_lines:
            _draw_key(fig, key_lines, len(labelled), key_in, height)
    return fig


def _corner_note(ax: Any, x: float, y: float, text: str, *, fontsize: float, color: str, gid: str) -> None:
    """A note inside the axes, its lower right corner at (``x``, ``y``) in axes fractions."""
    ax.text(
        x, y, text, transform=ax.transAxes, ha="right", va="bottom", fontsize=fontsize, color=color, gid=gid
    )


def _draw_points(ax: Any, data: RooflineData) -> None:
    """Points, biggest first so that small ones stay on top; arrows up to the ceiling (for a
    fused region drawn at its measured bytes, across to its fused intensity too)."""
    for p in sorted(data.points, key=lambda p: -p.candidate.time_share):
        c = p.candidate
        color = VERDICT_COLORS.get(c.verdict, VERDICT_COLORS[Verdict.SKIP])
        if _has_arrow(p):
            _draw_arrow(ax, p, color)
        assert p.at is not None  # placed by _clamp
        sc = ax.scatter(
            [p.at[0]],
            [p.at[1]],
            s=max(_marker_area(c.time_share) * (0.8 if p.fused else 1.0), 60.0 if p.off_chart else 0.0),
            marker=_OFF_MARKERS[p.off_chart.split("-")[0]] if p.off_chart else ("D" if p.fused else "o"),
            color=color,
            alpha=0.88,
            edgecolors="white",
            linewidths=1.0,
            zorder=3 + (1 - c.time_share),
        )
        sc.set_gid(f"kt-point-{c.id}")
        sc.set_urls([f"#{c.id}"])


def _draw_arrow(ax: Any, p: Point, color: str) -> None:
    """The arrow from a point to its ceiling, and a tick at the ceiling when it sits well off
    the roof."""
    c = p.candidate
    ceiling = p.ceiling
    assert ceiling is not None  # _has_arrow
    radius = _marker_radius_pt(c.time_share)
    arrow = ax.annotate(
        "",
        xy=(p.ceiling_intensity, ceiling),
        xytext=p.at,
        arrowprops={
            "arrowstyle": "-|>,head_length=0.5,head_width=0.22",
            "color": color,
            "lw": 1.3,
            "alpha": 0.85,
            "shrinkA": radius * (0.75 if p.fused else 0.6),
            "shrinkB": 0,
            "linestyle": (0, (4, 2)) if p.fused else "-",
        },
        zorder=2,
    )
    assert arrow.arrow_patch is not None  # arrowprops given
    arrow.arrow_patch.set_gid(f"kt-arrow-{c.id}")
    if p.roof and abs(math.log(ceiling / p.roof)) > 0.15:  # ceiling well off the roof: mark it
        ax.plot([p.ceiling_intensity], [ceiling], marker="_", ms=9, mew=1.6, color=color, zorder=2)


def _style_log_axes(ax: Any) -> None:
    """Decade ticks (minor at 2 and 5, unlabelled), a light grid, no top or right spine."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(LogLocator(base=10))
        axis.set_minor_locator(LogLocator(base=10, subs=(2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(_fmt_tick))
    ax.yaxis.set_major_formatter(FuncFormatter(_fmt_tick))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="major", color="#dddddd", lw=0.6, zorder=0)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("achieved TFLOP/s")


def _draw_titles(fig: Figure, report: Report, data: RooflineData, height: float) -> None:
    """The title (the GPU) and a subtitle (ceilings, trace, step time, how to read the chart)
    that never runs past the figure's right edge."""
    gpu = report.gpu
    fig.text(
        0.075,
        1 - 0.3 / height,
        f"Roofline — {gpu.name if gpu is not None else 'unknown GPU'}",
        fontsize=13,
        fontweight="bold",
        color=_INK,
        va="baseline",
    )
    sub = fig.text(
        0.075,
        1 - 0.52 / height,
        f"{data.ceilings} · {report.source.get('path', '')} · step {ms(report.step_time_ms)}"
        " · area ∝ share of step time · arrow: up to the candidate's ceiling",
        fontsize=9,
        color="#555555",
        va="baseline",
    )
    # Never past the figure's right edge: drop the explanations, then the path.
    for shorter in (
        f"{data.ceilings} · {report.source.get('path', '')} · step {ms(report.step_time_ms)}",
        f"{data.ceilings} · step {ms(report.step_time_ms)}",
    ):
        if sub.get_window_extent(_renderer(fig)).x1 <= fig.bbox.width * 0.98:
            break
        sub.set_text(shorter)


def _draw_legend(ax: Any, data: RooflineData) -> Any:
    """Legend: the verdicts present, then the marker shapes."""
    from matplotlib.lines import Line2D

    verdicts = [v for v in VERDICT_COLORS if any(p.candidate.verdict == v for p in data.points)]
    handles = [
        Line2D([], [], ls="", marker="o", ms=9, color=VERDICT_COLORS[v], label=VERDICT_LABELS[v])
        for v in verdicts
    ]
    handles += [
        Line2D([], [], ls="", marker="o", ms=8, mfc="none", mec=_ROOF, label="op or kernel"),
        Line2D(
            [],
            [],
            ls="",
            marker="D",
            ms=7,
            mfc="none",
            mec=_ROOF,
            label="fused region: today → its fused ceiling",
        ),
    ]
    legend = ax.legend(
        handles=handles,
        loc="best",  # upper left in most charts: nothing can sit above the memory roof
        frameon=True,
        framealpha=0.95,
        edgecolor="#cccccc",
        fontsize=8.5,
        borderpad=0.6,
    )
    legend.set_zorder(6)
    return legend


def _draw_key(fig: Figure, key_lines: list[str], n_labelled: int, key_in: float, height: float) -> None:
    """The key under the chart: a line per labelled candidate, then the notes (greyed)."""
    step = 0.2 / height
    y0 = (key_in - 0.05) / height - 0.5 * step
    for i, line in enumerate(key_lines):
        fig.text(0.075, y0 - i * step, line, fontsize=8.5, color=_INK if i < n_labelled else "#666666")


def _renderer(fig: Figure) -> Any:
    """The renderer of a figure made by ``_figure`` (an Agg canvas), for measuring text."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas
    assert isinstance(canvas, FigureCanvasAgg)
    return canvas.get_renderer()


def _draw_roofs(
    ax: Any,
    data: RooflineData,
    bw: float,
    top_ridge: float,
    x_lo: float,
    x_hi: float,
    y_lo: float,
    peaks: list[float],
) -> None:
    """The roofs: one memory slope up to the highest ridge, a flat compute roof per precision."""
    ax.fill_between(
        [x_lo, top_ridge, x_hi], [x_lo * bw, max(peaks), max(peaks)], y_lo, color="#f3f6fa", zorder=0
    )
    ax.plot(
        [x_lo, top_ridge],
        [x_lo * bw, top_ridge * bw],
        color=_ROOF,
        lw=2.0,
        zorder=1,
        solid_capstyle="round",
    )
    for i, peak in enumerate(data.roofs.values()):
        ridge = peak / bw
        ax.plot(
            [ridge, x_hi],
            [peak, peak],
            color=_ROOF,
            lw=2.0 if i == 0 else 1.4,
            ls="-" if i == 0 else (0, (5, 3)),
            zorder=1,
        )


def _place_labels(
    fig: Figure, ax: Any, data: RooflineData, labelled: list[Point], legend: Any, top_ridge: float | None
) -> None:
    """The memory roof's label along its slope, then id labels next to their points, greedily
    choosing places that overlap nothing already drawn (labels, points, arrows, the legend);
    a leader line when a label sits far from its point."""
    from matplotlib.transforms import Bbox

    renderer = _renderer(fig)
    to_px = fig.dpi / 72.0
    trans = ax.transData
    obstacles: list[Bbox] = [legend.get_window_extent(renderer)]
    # Text already drawn (the roof labels) and id labels placed so far must stay legible: a
    # label may cover part of a point or an arrow sooner than any text.
    texts: list[Bbox] = [t.get_window_extent(renderer) for t in ax.texts if t.get_text()]
    for p in data.points:
        cx, cy = trans.transform(p.at)
        r = _marker_radius_pt(p.candidate.time_share) * to_px
        obstacles.append(Bbox.from_extents(cx - r, cy - r, cx + r, cy + r))
        if _has_arrow(p):
            tx, ty = trans.transform((p.ceiling_intensity, p.ceiling))
            if abs(tx - cx) < 1:
                obstacles.append(Bbox.from_extents(cx - 3, cy + r, cx + 3, ty))
            else:  # a slanting arrow: small boxes along it
                n = max(2, int(math.hypot(tx - cx, ty - cy) / 4))
                obstacles += [
                    Bbox.from_extents(x - 2, y - 2, x + 2, y + 2)
                    for x, y in ((cx + (tx - cx) * i / n, cy + (ty - cy) * i / n) for i in range(n + 1))
                ]
    axbox = ax.get_window_extent(renderer)
    fixed = _extents(obstacles)
    frame = _extents([axbox])

    def cost(box: Bbox | list[Bbox]) -> float:
        """Area covered: of points, arrows and the legend, 100 × of texts, 4 × outside the axes
        (one box or the sum over several, such as the pieces of a leader line)."""
        boxes = _extents(box if isinstance(box, list) else [box])
        if not len(boxes):
            return 0.0
        area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
        outside = area - _overlap_area(boxes, frame).sum(axis=1)
        total = _overlap_area(boxes, fixed).sum() + 4 * outside.sum()
        if texts:
            total += 100 * _overlap_area(boxes, _extents(texts)).sum()
        return float(total)

    if data.bandwidth_tbs is not None and top_ridge is not None:
        texts += _compute_roof_labels(ax, data, data.bandwidth_tbs, renderer, cost)
        texts.append(_memory_roof_label(ax, data.bandwidth_tbs, top_ridge, renderer, cost))
    _place_id_labels(ax, labelled, renderer, cost, texts, to_px)


def _extents(boxes: list[Any]) -> Any:
    """Boxes as an (n, 4) array of x0, y0, x1, y1."""
    import numpy as np

    return np.array([[b.x0, b.y0, b.x1, b.y1] for b in boxes], dtype=float).reshape(-1, 4)


def _overlap_area(a: Any, b: Any) -> Any:
    """(len(a), len(b)) areas of the overlap of every box of ``a`` with every box of ``b``."""
    import numpy as np

    w = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    h = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    return np.clip(w, 0, None) * np.clip(h, 0, None)


def _compute_roof_labels(ax: Any, data: RooflineData, bw: float, renderer: Any, cost: Any) -> list[Any]:
    """Each compute roof's label, along its roof (the right end first, then starting or ending
    at points along it; above the line, else below) where it covers the fewest points, arrows
    and labels placed before it, and stays right of its ridge; returns their boxes."""
    x_lo, x_hi = ax.get_xlim()
    boxes: list[Any] = []
    for precision, peak in data.roofs.items():
        start = max(peak / bw, x_lo) * 1.2
        left_edge = ax.transData.transform((start, peak))[0]
        best = None
        along = [start * (x_hi / start) ** frac for frac in (0.0, 0.15, 0.3, 0.45, 0.6, 0.75, 0.9)]
        places = [(x_hi, -6, "right"), *((x, 4, "left") for x in along), *((x, -4, "right") for x in along)]
        for x, dx, ha in places:
            for dy, va in ((3, "bottom"), (-3, "top")):
                label = ax.annotate(
                    f"{precision} ceiling {peak:,.4g} TFLOP/s",
                    (x, peak),
                    xytext=(dx, dy),
                    textcoords="offset points",
                    ha=ha,
                    va=va,
                    color=_ROOF,
                    fontsize=9,
                    zorder=6,  # over an arrow that must cross it, on a backdrop that keeps it legible
                    bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.75},
                )
                box = label.get_window_extent(renderer).padded(1.5)
                label.remove()
                score = cost(box) + 4 * max(0.0, left_edge - box.x0) * box.height  # off its roof
                if boxes:  # the roof labels placed before it
                    score += 100 * float(_overlap_area(_extents([box]), _extents(boxes)).sum())
                if best is None or score < best[0] - 1.0:
                    best = (score, label, box)
        assert best is not None
        ax.add_artist(best[1])
        best[1].set_gid(f"kt-roof-label-{precision}")
        boxes.append(best[2])
    return boxes


def _memory_roof_label(ax: Any, bw: float, top_ridge: float, renderer: Any, cost: Any) -> Any:
    """The memory roof's label, rotated along the slope, where it covers the fewest points and
    arrows; returns its box."""
    trans = ax.transData
    x_lo = ax.get_xlim()[0]
    (ax0, ay0), (ax1, ay1) = trans.transform([(x_lo, x_lo * bw), (top_ridge, top_ridge * bw)])
    angle = math.degrees(math.atan2(ay1 - ay0, ax1 - ax0))
    best_label = None
    for frac in (0.04, 0.5, 0.6, 0.4, 0.7, 0.3, 0.2, 0.1):
        x_lab = x_lo * (top_ridge / x_lo) ** frac
        label = ax.annotate(
            f"memory roof {bw:.3g} TB/s",
            (x_lab, x_lab * bw),
            xytext=(2, 5),
            textcoords="offset points",
            rotation=angle,
            rotation_mode="anchor",
            ha="left",
            va="bottom",
            color=_ROOF,
            fontsize=9,
        )
        box = label.get_window_extent(renderer)
        score = cost(box)
        label.remove()
        if best_label is None or score < best_label[0] - 1.0:
            best_label = (score, label, box)
    assert best_label is not None
    ax.add_artist(best_label[1])
    best_label[1].set_gid("kt-memory-roof-label")
    return best_label[2]


def _place_id_labels(
    ax: Any, labelled: list[Point], renderer: Any, cost: Any, texts: list, to_px: float
) -> None:
    """Id labels next to their points, greedily where they overlap nothing drawn; a leader
    line when a label sits far from its point."""
    from matplotlib.transforms import Bbox

    trans = ax.transData

    def annotate(text, p, dx, dy, ha, va, arrowprops):
        return ax.annotate(
            text,
            p.at,
            xytext=(dx, dy),
            textcoords="offset points",
            ha=ha,
            va=va,
            fontsize=9,
            fontweight="bold",
            color=_INK,
            zorder=7,
            arrowprops=arrowprops,
        )

    def leader_boxes(p: Point, box: Bbox, r_px: float) -> list[Bbox]:
        """Small boxes every 3 px along the leader line, from the point's rim to the label."""
        cx, cy = trans.transform(p.at)
        tx, ty = min(max(cx, box.x0), box.x1), min(max(cy, box.y0), box.y1)
        length = math.hypot(tx - cx, ty - cy)
        if length <= r_px:
            return []
        n = max(2, int((length - r_px) / 3))
        steps = (r_px / length + (1 - r_px / length) * i / n for i in range(n + 1))
        return [
            Bbox.from_extents(x - 1, y - 1, x + 1, y + 1)
            for x, y in ((cx + (tx - cx) * t, cy + (ty - cy) * t) for t in steps)
        ]

    for p in labelled:
        c = p.candidate
        r = _marker_radius_pt(c.time_share)
        text = f"{c.id} {times(c.headroom)}" if c.headroom and c.verdict != Verdict.SKIP else c.id
        probe = annotate(text, p, 0, 0, "left", "bottom", None)  # its size, wherever it goes
        size = probe.get_window_extent(renderer)
        probe.remove()
        anchor = trans.transform(p.at)
        best = None
        # Nearest first; the far rings only when nothing nearer stays clear of every text.
        for dist in (r + 2.5, r + 12, r + 24, r + 40, r + 60, r + 85, r + 120, r + 170, r + 240):
            if dist > r + 85 and best is not None and best[7]:
                break
            for deg in (0, 180, 30, -30, 150, -150, 90, -90, 60, -60, 120, -120):
                dx = dist * math.cos(math.radians(deg))
                dy = dist * math.sin(math.radians(deg))
                ha = "left" if dx > 1 else ("right" if dx < -1 else "center")
                va = "bottom" if dy > 1 else ("top" if dy < -1 else "center")
                x0 = anchor[0] + dx * to_px - {"left": 0.0, "center": 0.5, "right": 1.0}[ha] * size.width
                y0 = anchor[1] + dy * to_px - {"bottom": 0.0, "center": 0.5, "top": 1.0}[va] * size.height
                box = Bbox.from_bounds(x0, y0, size.width, size.height).padded(1.5)
                score = cost(box) + dist * 0.5
                if dist > r + 10:  # a far label gets a leader line: it must not cross text either
                    score += cost(leader_boxes(p, box, r * to_px))
                clear = not any(box.overlaps(t) for t in texts)
                if best is None or (clear, -score) > (best[7], -best[0]):
                    best = (score, dx, dy, ha, va, dist, box, clear)
            if best is not None and best[7] and best[0] <= best[5] * 0.5 + 1e-9:
                break
        assert best is not None
        _, dx, dy, ha, va, dist, box, clear = best
        if not clear:  # no place clear of the other texts: the key and the hover text name it
            continue
        ann = annotate(text, p, dx, dy, ha, va, _leader(r) if dist > r + 10 else None)
        ann.set_gid(f"kt-label-{c.id}")
        texts.append(box)


def _leader(r: float) -> dict[str, Any]:
    return {"arrowstyle": "-", "color": "#777777", "lw": 0.6, "shrinkA": 1, "shrinkB": r * 0.8}


def breakdown_figure(report: Report) -> Figure:
    """One step as a stacked horizontal bar by kind (GEMM, attention, norm, …, idle)."""
    from matplotlib.patches import Patch

    items = breakdown_items(report)
    total = sum(v for _, v in items) or 1.0
    with _rc():
        fig = _figure(10.0, 2.1)
        ax = fig.add_axes((0.02, 0.36, 0.96, 0.36))
        left = 0.0
        labels = []
        for kind, value in items:
            color = KIND_COLORS.get(kind, KIND_COLORS["other"])
            bar = ax.barh(
                [0],
                [value],
                left=left,
                height=0.8,
                color=color,
                edgecolor="white",
                linewidth=1.2,
                hatch="///" if kind == "idle" else None,
            )
            bar.patches[0].set_gid(f"kt-kind-{kind}")
            labels.append((left, value, kind))
            left += value
        ax.set_xlim(0, total)
        ax.set_ylim(-0.45, 0.45)
        renderer = _renderer(fig)
        for start, value, kind in labels:  # inside a segment only where the text fits
            share = value / total
            x0, _ = ax.transData.transform((start, 0))
            x1, _ = ax.transData.transform((start + value, 0))
            for text in (
                f"{KIND_LABELS.get(kind, kind)}\n{ms(value)} · {pct(share)}",
                f"{KIND_LABELS.get(kind, kind)}\n{pct(share)}",
                pct(share, 0),
            ):
                label = ax.text(
                    start + value / 2,
                    0,
                    text,
                    ha="center",
                    va="center",
                    fontsize=9,
                    color=_INK if kind in ("idle", "softmax", "memcpy", "embedding") else "white",
                    fontweight="bold",
                )
                if label.get_window_extent(renderer).width <= (x1 - x0) - 8:
                    break
                label.remove()
        ax.axis("off")
        fig.text(
            0.02,
            0.84,
            f"One step: {ms(report.step_time_ms)} — GPU busy {report.gpu_busy_pct:.1f}%, idle {report.idle_pct:.1f}%",
            fontsize=12,
            fontweight="bold",
            color=_INK,
        )
        handles = [
            Patch(
                facecolor=KIND_COLORS.get(k, KIND_COLORS["other"]),
                hatch="///" if k == "idle" else None,
                edgecolor="white",
                label=f"{KIND_LABELS.get(k, k)} {ms(v)} ({pct(v / total)})",
            )
            for k, v in items
        ]
        if handles:
            fig.legend(
                handles=handles,
                loc="lower left",
                bbox_to_anchor=(0.015, 0.0),
                ncol=min(4, len(handles)),
                frameon=False,
                fontsize=8.5,
                handlelength=1.4,
                columnspacing=1.6,
            )
    return fig


def breakdown_items(report: Report) -> list[tuple[str, float]]:
    """(kind, ms per step), largest first, idle last; kinds with no time left out."""
    items = [(k, float(v)) for k, v in report.kind_breakdown.items() if k != "idle" and v > 0]
    items.sort(key=lambda kv: -kv[1])
    idle = float(report.kind_breakdown.get("idle", 0.0))
    if idle > 0:
        items.append(("idle", idle))
    return items


# --- files and inline SVG -------------------------------------------------------------------


def check_plot_path(path: str | Path) -> Path:
    """``path`` if it names a PNG or SVG file; else an ``InputError`` (exit code 2)."""
    path = Path(path)
    if path.suffix.lower() not in PLOT_SUFFIXES:
        suffix = path.suffix or "no suffix"
        raise InputError(
            f"cannot write a plot as {suffix!s}: the file name must end in .png or .svg", path=str(path)
        )
    return path


def save_roofline(report: Report, path: str | Path) -> Path:
    """Write the roofline chart as PNG or SVG, chosen by the file's suffix."""
    path = check_plot_path(path)
    if not path.parent.is_dir():
        raise InputError("cannot write the plot: no such directory", path=str(path))
    fig = roofline_figure(report)
    fmt = path.suffix.lower().lstrip(".")
    try:
        if fmt == "svg":
            svg = _titled_svg(_svg_text(fig), _titles(report))
            svg = re.sub(r"</?a\b[^>]*>\n?", "", svg)  # links to #C1 lead nowhere outside the HTML
            path.write_text(svg, encoding="utf-8")
        else:
            with _rc():
                fig.savefig(path, format="png", dpi=150, metadata={"Software": "kerneltriage"})
    except OSError as exc:
        raise InputError(f"cannot write the plot ({exc.strerror or exc})", path=str(path)) from None
    return path


def _svg_text(fig: Figure) -> str:
    buf = io.StringIO()
    with _rc():
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "kerneltriage"})
    return buf.getvalue()


def _titles(report: Report, candidates: list[Candidate] | None = None) -> dict[str, str]:
    data = roofline_data(report, candidates)
    return {f"kt-point-{p.id}": point_title(p) for p in data.points}


def _titled_svg(svg: str, titles: dict[str, str]) -> str:
    """Insert ``<title>`` (hover text) as the first child of the groups with those ids."""

    def add(match: re.Match[str]) -> str:
        title = titles.get(match.group(1))
        return (
            match.group(0) if title is None else f"{match.group(0)}\n   <title>{_html.escape(title)}</title>"
        )

    return re.sub(r'<g id="([^"]+)"[^>]*>', add, svg)


def _inline(svg: str, prefix: str, label: str) -> str:
    """SVG text for inlining in HTML: no XML prolog, metadata or namespace URLs, ids prefixed
    (two charts on one page must not share ids), responsive width."""
    svg = re.sub(r"<\?xml[^>]*\?>\s*", "", svg)
    svg = re.sub(r"<!DOCTYPE[^>]*>\s*", "", svg)
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    svg = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", svg)
    svg = re.sub(r'(<a xlink:href="#[^"]*")\s+target="_blank"', r"\1", svg)  # in-page links
    ids = set(re.findall(r'\sid="([^"]+)"', svg))

    def pre(match: re.Match[str]) -> str:
        head, ident = match.group(1), match.group(2)
        if ident in ids and not ident.startswith("kt-"):
            return f"{head}{prefix}-{ident}"
        return match.group(0)

    svg = re.sub(r'(\sid="|href="#|url\(#)([^")]+)', pre, svg)
    svg = re.sub(
        r'<svg\s+width="[^"]*"\s+height="[^"]*"',
        f'<svg class="chart" role="img" aria-label="{_html.escape(label)}" width="100%"',
        svg,
        count=1,
    )
    return svg.strip()


def roofline_svg(report: Report, *, candidates: list[Candidate] | None = None) -> str:
    """The roofline chart as inline SVG: a ``<g id="kt-point-C1">`` per placed candidate, with a
    ``<title>`` for hover and a link to ``#C1``."""
    fig = roofline_figure(report, candidates=candidates, key=False)
    svg = _titled_svg(_svg_text(fig), _titles(report, candidates))
    name = report.gpu.name if report.gpu is not None else "an unknown GPU (no ceilings)"
    return _inline(svg, "roofline", f"Roofline chart of {name}")


def breakdown_svg(report: Report) -> str:
    """The step breakdown as inline SVG, a ``<g id="kt-kind-…">`` with a ``<title>`` per kind."""
    items = breakdown_items(report)
    total = sum(v for _, v in items) or 1.0
    titles = {
        f"kt-kind-{k}": f"{KIND_LABELS.get(k, k)}: {ms(v)} per step ({pct(v / total)} of step)"
        for k, v in items
    }
    svg = _titled_svg(_svg_text(breakdown_figure(report)), titles)
    return _inline(svg, "breakdown", "Time breakdown of one step by kind")
