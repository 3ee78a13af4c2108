"""The scaffold families, registered here and nowhere else: the writer, ``scaffold RUN
CANDIDATE`` and ``scaffold --kind`` all look a family up in ``FAMILIES``.

A family (``TemplateClass``) names its template folder, the report kinds and ``--kind`` values
it takes, and builds its template context from a candidate or from ``--kind`` options.
"""

from __future__ import annotations

from kerneltriage.scaffold.families import (
    attention,
    depthwise_conv,
    elementwise,
    gemm_epilogue,
    generic,
    rownorm,
    softmax,
)
from kerneltriage.scaffold.families.base import FILES, TemplateClass

__all__ = ["FAMILIES", "FILES", "GENERIC", "TemplateClass", "for_kind", "for_report_kind", "kinds_text"]

# In the order --help and errors list them.
FAMILIES: dict[str, TemplateClass] = {
    family.name: family
    for family in (
        rownorm.FAMILY,
        softmax.FAMILY,
        attention.FAMILY,
        gemm_epilogue.FAMILY,
        elementwise.FAMILY,
        depthwise_conv.FAMILY,
        generic.FAMILY,
    )
}
# Every candidate no family models gets this one.
GENERIC = FAMILIES["generic"]


def for_report_kind(kind: str) -> TemplateClass | None:
    """The family of a report candidate's kind, or None (the generic starting point then)."""
    return next((f for f in FAMILIES.values() if kind in f.report_kinds), None)


def for_kind(kind: str) -> TemplateClass | None:
    """The family of a ``--kind`` value (lower case, ``_`` for ``-``): the one that names it,
    else the first whose chains take it (``gemm+bias+gelu``, ``mul+silu``)."""
    named = next((f for f in FAMILIES.values() if kind in f.kinds), None)
    return named or next((f for f in FAMILIES.values() if f.takes_kind(kind)), None)


def kinds_text() -> str:
    """Every family's ``--kind`` values, for ``--help`` and errors."""
    return "; ".join(f"{f.name}: {f.kinds_text}" for f in FAMILIES.values())
