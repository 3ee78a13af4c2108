"""The roofline chart of a ``Report``: a matplotlib figure (``--plot roofline.png|.svg``) and
inline SVG for the HTML report. Log-log axes, the memory roof and a compute roof per precision,
a point per candidate with an arrow up to its ceiling (``roofline_layout`` says where), labels
placed by ``chart_labels``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kerneltriage.analysis.model import Candidate, Report
from kerneltriage.analysis.vocabulary import Verdict
from kerneltriage.errors import InputError
from kerneltriage.render.canvas import (
    INK,
    ROOF,
    VERDICT_COLORS,
    VERDICT_LABELS,
    chart_style,
    inline_svg,
    new_figure,
    svg_text,
    text_renderer,
    titled_svg,
)
from kerneltriage.render.chart_labels import place_labels
from kerneltriage.render.roofline_layout import (
    Point,
    RooflineData,
    axis_limits,
    chart_key,
    clamp,
    has_arrow,
    labelled_points,
    marker_area,
    marker_radius_pt,
    point_title,
    roofline_data,
)
from kerneltriage.render.text import ms

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure


PLOT_SUFFIXES = (".png", ".svg")
_OFF_MARKERS = {"below": "v", "above": "^", "left": "<", "right": ">"}


def roofline_figure(report: Report, *, candidates: list[Candidate] | None = None, key: bool = True) -> Figure:
    """The roofline chart: log-log intensity vs achieved TFLOP/s, the memory roof and a compute
    roof per precision used, a point per candidate (area ∝ time share, colour = verdict, diamond =
    fused region at its fused intensity) with an arrow up to its ceiling. ``key`` adds the
    labelled candidates' names under the chart (for a standalone image). Without a GPU there
    are no roofs: the points that can be placed, and a note saying why there is no roof."""
    data = roofline_data(report, candidates)
    labelled = labelled_points(data.points)
    x_lo, x_hi, y_lo, y_hi = axis_limits(data)
    clamp(data.points, x_lo, x_hi, y_lo, y_hi)
    key_lines = chart_key(data, labelled) if key else []
    top_in, axes_in, bottom_in = 0.75, 5.4, 0.65
    key_in = 0.2 * len(key_lines) + (0.15 if key_lines else 0.0)
    width = 10.0
    height = top_in + axes_in + bottom_in + key_in
    with chart_style():
        fig = new_figure(width, height)
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
        place_labels(fig, ax, data, labelled, legend, top_ridge)
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
        if has_arrow(p):
            _draw_arrow(ax, p, color)
        assert p.at is not None  # placed by clamp
        sc = ax.scatter(
            [p.at[0]],
            [p.at[1]],
            s=max(marker_area(c.time_share) * (0.8 if p.fused else 1.0), 60.0 if p.off_chart else 0.0),
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
    assert ceiling is not None  # has_arrow
    radius = marker_radius_pt(c.time_share)
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


def _fmt_tick(value: float, _pos: Any = None) -> str:
    if value <= 0:
        return ""
    if value >= 1:
        return f"{value:,.0f}"
    return f"{value:g}"


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
        color=INK,
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
        if sub.get_window_extent(text_renderer(fig)).x1 <= fig.bbox.width * 0.98:
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
        Line2D([], [], ls="", marker="o", ms=8, mfc="none", mec=ROOF, label="op or kernel"),
        Line2D(
            [],
            [],
            ls="",
            marker="D",
            ms=7,
            mfc="none",
            mec=ROOF,
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
        fig.text(0.075, y0 - i * step, line, fontsize=8.5, color=INK if i < n_labelled else "#666666")


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
        color=ROOF,
        lw=2.0,
        zorder=1,
        solid_capstyle="round",
    )
    for i, peak in enumerate(data.roofs.values()):
        ridge = peak / bw
        ax.plot(
            [ridge, x_hi],
            [peak, peak],
            color=ROOF,
            lw=2.0 if i == 0 else 1.4,
            ls="-" if i == 0 else (0, (5, 3)),
            zorder=1,
        )


def roofline_svg(report: Report, *, candidates: list[Candidate] | None = None) -> str:
    """The roofline chart as inline SVG: a ``<g id="kt-point-C1">`` per placed candidate, with a
    ``<title>`` for hover and a link to ``#C1``."""
    fig = roofline_figure(report, candidates=candidates, key=False)
    svg = titled_svg(svg_text(fig), _titles(report, candidates))
    name = report.gpu.name if report.gpu is not None else "an unknown GPU (no ceilings)"
    return inline_svg(svg, "roofline", f"Roofline chart of {name}")


def _titles(report: Report, candidates: list[Candidate] | None = None) -> dict[str, str]:
    data = roofline_data(report, candidates)
    return {f"kt-point-{p.id}": point_title(p) for p in data.points}


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
            svg = titled_svg(svg_text(fig), _titles(report))
            svg = re.sub(r"</?a\b[^>]*>\n?", "", svg)  # links to #C1 lead nowhere outside the HTML
            path.write_text(svg, encoding="utf-8")
        else:
            with chart_style():
                fig.savefig(path, format="png", dpi=150, metadata={"Software": "kerneltriage"})
    except OSError as exc:
        raise InputError(f"cannot write the plot ({exc.strerror or exc})", path=str(path)) from None
    return path
