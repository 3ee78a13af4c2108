"""Where the roofline chart's labels go: the roof labels along their roofs, then each id label
next to its point, greedily in the place that covers the least already drawn (points, arrows,
the legend, and above all other text), with a leader line when it sits far from its point.

Overlaps are measured in display pixels on the figure's own renderer, so the places chosen
are the ones the saved PNG or SVG shows.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from kerneltriage.analysis.vocabulary import Verdict
from kerneltriage.render.canvas import INK, ROOF, text_renderer
from kerneltriage.render.roofline_layout import Point, RooflineData, has_arrow, marker_radius_pt
from kerneltriage.render.text import times

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure


def place_labels(
    fig: Figure, ax: Any, data: RooflineData, labelled: list[Point], legend: Any, top_ridge: float | None
) -> None:
    """The memory roof's label along its slope, then id labels next to their points, greedily
    choosing places that overlap nothing already drawn (labels, points, arrows, the legend);
    a leader line when a label sits far from its point."""
    from matplotlib.transforms import Bbox

    renderer = text_renderer(fig)
    to_px = fig.dpi / 72.0
    trans = ax.transData
    obstacles: list[Bbox] = [legend.get_window_extent(renderer)]
    # Text already drawn (the roof labels) and id labels placed so far must stay legible: a
    # label may cover part of a point or an arrow sooner than any text.
    texts: list[Bbox] = [t.get_window_extent(renderer) for t in ax.texts if t.get_text()]
    for p in data.points:
        cx, cy = trans.transform(p.at)
        r = marker_radius_pt(p.candidate.time_share) * to_px
        obstacles.append(Bbox.from_extents(cx - r, cy - r, cx + r, cy + r))
        if has_arrow(p):
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
                    color=ROOF,
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
            color=ROOF,
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
            color=INK,
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
        r = marker_radius_pt(c.time_share)
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
