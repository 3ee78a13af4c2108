"""The breakdown chart: one step as a stacked horizontal bar of the time of each kind of op
(GEMM, attention, norm, …, idle), as a matplotlib figure and as inline SVG for the HTML report."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kerneltriage.analysis.model import Report
from kerneltriage.render.canvas import (
    INK,
    chart_style,
    inline_svg,
    new_figure,
    svg_text,
    text_renderer,
    titled_svg,
)
from kerneltriage.render.text import ms, pct

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure


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


def breakdown_items(report: Report) -> list[tuple[str, float]]:
    """(kind, ms per step), largest first, idle last; kinds with no time left out."""
    items = [(k, float(v)) for k, v in report.kind_breakdown.items() if k != "idle" and v > 0]
    items.sort(key=lambda kv: -kv[1])
    idle = float(report.kind_breakdown.get("idle", 0.0))
    if idle > 0:
        items.append(("idle", idle))
    return items


def breakdown_figure(report: Report) -> Figure:
    """One step as a stacked horizontal bar by kind (GEMM, attention, norm, …, idle)."""
    from matplotlib.patches import Patch

    items = breakdown_items(report)
    total = sum(v for _, v in items) or 1.0
    with chart_style():
        fig = new_figure(10.0, 2.1)
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
        renderer = text_renderer(fig)
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
                    color=INK if kind in ("idle", "softmax", "memcpy", "embedding") else "white",
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
            color=INK,
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


def breakdown_svg(report: Report) -> str:
    """The step breakdown as inline SVG, a ``<g id="kt-kind-…">`` with a ``<title>`` per kind."""
    items = breakdown_items(report)
    total = sum(v for _, v in items) or 1.0
    titles = {
        f"kt-kind-{k}": f"{KIND_LABELS.get(k, k)}: {ms(v)} per step ({pct(v / total)} of step)"
        for k, v in items
    }
    svg = titled_svg(svg_text(breakdown_figure(report)), titles)
    return inline_svg(svg, "breakdown", "Time breakdown of one step by kind")
