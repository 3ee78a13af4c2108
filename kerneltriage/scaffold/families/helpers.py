"""Readers of a trace's op records and the small context pieces every family shares."""

from __future__ import annotations

import math

from kerneltriage.analysis.model import Candidate
from kerneltriage.scaffold.common import Observed, Origin
from kerneltriage.scaffold.identifiers import FLOAT_DTYPES


def the_candidate(origin: Origin) -> Candidate:
    """The candidate a ``from_candidate`` builder reads (a report's origin always has one)."""
    if origin.candidate is None:
        raise ValueError(f"{origin.short}: a candidate's template context needs the candidate")
    return origin.candidate


def float_dtype(dtype: str | None, default: str = "float32") -> str:
    return dtype if dtype in FLOAT_DTYPES else default


def has_backward(cand: Candidate | None) -> bool:
    if cand is None:
        return True
    return (cand.bwd_ms_per_step or 0.0) > 0 and (cand.fwd_ms_per_step or 0.0) > 0


def trace_tensors(op: dict) -> list[tuple[list[int], str]]:
    out = []
    for d, t in zip(op.get("dims") or [], op.get("types") or []):
        if (
            isinstance(d, list)
            and d
            and all(isinstance(x, int) for x in d)
            and t not in ("Scalar", "ScalarList", "")
        ):
            out.append((list(d), t))
    return out


def short_name(op: dict) -> str:
    return str(op.get("name", "")).rsplit("::", 1)[-1]


def kind_observed(shapes: list[list[int]], role: str = "x") -> list[Observed]:
    """``--shape`` values as observed shapes of equal share."""
    return [Observed({role: s}, 1.0 / len(shapes), 0) for s in shapes]


def scale_rows(dims: list[int], max_rows: int, max_last: int) -> tuple[int, ...]:
    """Fewer rows (same rank) and a bounded last dim, for the interpreter."""
    *lead, last = [int(d) for d in dims] or [1]
    lead = [min(d, 3) for d in lead]
    while lead and math.prod(lead) > max_rows:
        i = max(range(len(lead)), key=lambda j: lead[j])
        lead[i] = max(1, lead[i] // 2)
    return (*lead, min(last, max_last))


def key_note(varying: list[str]) -> str:
    return (
        "observed shapes vary in " + ", ".join(varying) if varying else "one observed shape: fixed key dims"
    )


def kernel_imports(name: str, extra: list[str]) -> str:
    """``from kernel import …`` names sorted as ruff's isort does (constants, classes, functions)."""
    names = sorted(set([name, *extra]), key=lambda n: (0 if n.isupper() else 1 if n[:1].isupper() else 2, n))
    return ", ".join(names)
