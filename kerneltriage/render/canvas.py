"""What every chart of the reports draws on: a matplotlib figure on an Agg canvas (no pyplot),
the charts' font and palette, and the SVG text a figure becomes (hover titles, inlined in HTML).

matplotlib is imported inside the functions so that importing ``kerneltriage.render`` stays
light.
"""

from __future__ import annotations

import html as _html
import io
import re
from typing import TYPE_CHECKING, Any

from kerneltriage.analysis.vocabulary import Verdict

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure


INK = "#222222"  # titles and labels
ROOF = "#3b3b3b"  # the roofs and their labels
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
# Paths, not fonts, in SVG (the same on every machine); a fixed hash salt keeps the ids of an
# SVG the same from run to run.
_FONT: dict[Any, Any] = {
    "font.family": "DejaVu Sans",
    "font.size": 9.5,
    "svg.fonttype": "path",
    "svg.hashsalt": "kerneltriage",
}


def new_figure(width: float, height: float) -> Figure:
    """A white figure of ``width`` × ``height`` inches at 100 dpi, on its own Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, facecolor="white")
    FigureCanvasAgg(fig)
    return fig


def chart_style() -> Any:
    """The charts' font settings, as a context: draw and save inside it."""
    import matplotlib

    return matplotlib.rc_context(_FONT)


def text_renderer(fig: Figure) -> Any:
    """The renderer of a figure made by ``new_figure`` (an Agg canvas), for measuring text."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = fig.canvas
    assert isinstance(canvas, FigureCanvasAgg)
    return canvas.get_renderer()


def svg_text(fig: Figure) -> str:
    """The figure as SVG text, with no date in it (the same chart gives the same bytes)."""
    buf = io.StringIO()
    with chart_style():
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": "kerneltriage"})
    return buf.getvalue()


def titled_svg(svg: str, titles: dict[str, str]) -> str:
    """Insert ``<title>`` (hover text) as the first child of the groups with those ids."""

    def add(match: re.Match[str]) -> str:
        title = titles.get(match.group(1))
        return (
            match.group(0) if title is None else f"{match.group(0)}\n   <title>{_html.escape(title)}</title>"
        )

    return re.sub(r'<g id="([^"]+)"[^>]*>', add, svg)


def inline_svg(svg: str, prefix: str, label: str) -> str:
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
