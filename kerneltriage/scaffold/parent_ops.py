"""A candidate replayed without its ops, scaffolded from the run before its fixes.

A run profiled with a CUDA-graph fix applied (``profile --apply RUN:S1``) replays its step as
one graph: the profiler records its kernels but no op launched them, so a `write` verdict on
such a kernel (cuDNN's depthwise backward, say) has no shapes, and no family could model it.
The run before the fixes ran the same kernels inside recorded ops (``aten::conv2d`` with its
input and weight shapes): the candidates of that run whose kernels share a name with this one
hold its ops and shapes. The scaffold is planned from them, heaviest first, their shape
signatures weighted by their time.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from kerneltriage.analysis.model import Candidate, Report


def parent_run(run: str | Path, report: Report) -> Path | None:
    """The run before the fixes that ``report`` (of ``run``) was profiled with, as a folder
    that exists: as recorded, or beside ``run`` where the recorded path was relative to
    another working directory (a run copied elsewhere); None where there is none."""
    recorded = (report.source or {}).get("parent_run")
    if not recorded:
        return None
    here = Path(run).resolve().parent
    for path in (Path(recorded), here / recorded, here / Path(recorded).name):
        if path.is_dir():
            return path
    return None


#: The share of the kernels' time in the run before that candidates of the same kind must hold:
#: a kernel many kinds of op launch (a copy, a fill) belongs to none of them.
OWNED = 0.9


def borrowed(cand: Candidate, parent: Report) -> tuple[Candidate, list[Candidate]] | None:
    """``cand`` with the ops, shapes and phases of the candidates of ``parent`` of its kind that
    ran its kernels (by name) inside recorded ops, and those candidates (heaviest first); None
    where no such candidate ran them, or where they hold less than ``OWNED`` of those kernels'
    time in ``parent`` (ops of other kinds launch them too)."""
    names = {k.name for k in cand.kernels}

    def time_of(c: Candidate) -> float:
        return sum(k.time_ms_per_step for k in c.kernels if k.name in names)

    everywhere = sum(time_of(c) for c in parent.candidates)
    matched = sorted(
        (c for c in parent.candidates if c.example and c.kind == cand.kind and time_of(c) > 0),
        key=lambda c: -c.time_ms_per_step,
    )
    if not matched or sum(time_of(c) for c in matched) < OWNED * everywhere:
        return None
    top = matched[0]
    total = sum(c.time_ms_per_step for c in matched) or 1.0
    by_shape: dict[str, dict] = {}  # candidates of one op in two layouts share shapes
    for c in matched:
        for sig in c.shapes.signatures or []:
            share = float(sig.get("share") or 0.0) * c.time_ms_per_step / total
            text = str(sig.get("shape", ""))
            if text in by_shape:
                kept = by_shape[text]
                kept["share"] += share
                kept["count"] = int(kept.get("count") or 0) + int(sig.get("count") or 0)
            else:
                by_shape[text] = {**sig, "share": share}
    signatures = sorted(by_shape.values(), key=lambda sig: -sig["share"])
    shapes = dataclasses.replace(top.shapes, signatures=signatures, distinct=len(signatures))
    merged = dataclasses.replace(
        cand,
        kind=top.kind,
        ops=top.ops,
        example=top.example,
        shapes=shapes,
        # Both passes of the op: the package then has its backward, which the kernel belongs to.
        fwd_ms_per_step=top.fwd_ms_per_step,
        bwd_ms_per_step=top.bwd_ms_per_step,
    )
    return merged, matched
