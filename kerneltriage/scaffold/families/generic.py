"""The generic starting point (map + row reduction): for every op class without a template of
its own, and for candidates a family's template cannot model."""

from __future__ import annotations

from typing import Any

from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.scaffold.common import (
    Observed,
    Origin,
    base_context,
    dtype_configs,
    dtypes_literal,
    shape_literal,
    shapes_context,
    signatures,
    tol_context,
)
from kerneltriage.scaffold.families.base import TemplateClass
from kerneltriage.scaffold.families.helpers import (
    float_dtype,
    has_backward,
    key_note,
    kind_observed,
    scale_rows,
    the_candidate,
)
from kerneltriage.scaffold.identifiers import FLOAT_DTYPES, class_name, comment_text, identifier, trace_dtype


def generic_from_candidate(origin: Origin, gpu: GPUSpec) -> dict[str, Any]:
    cand = the_candidate(origin)
    first = cand.example[0] if cand.example else {}
    op_name = first.get("name") or (cand.ops[0] if cand.ops else cand.name)
    types = [
        t
        for d, t in zip(first.get("dims") or [], first.get("types") or [])
        if isinstance(d, list)
        and d
        and all(isinstance(x, int) for x in d)
        and t not in ("Scalar", "ScalarList", "")
    ]
    observed = []
    x_dtype = None
    for o in signatures(cand):
        args = [(k, v) for k, v in o.dims.items() if v]
        pick = None
        for i, (_k, v) in enumerate(args):
            dt = trace_dtype(types[i]) if i < len(types) else None
            if dt in FLOAT_DTYPES or (dt is None and i == 0):
                pick = (v, dt)
                break
        if pick:
            observed.append(Observed({"x": pick[0]}, o.share, o.count, o.text))
            x_dtype = x_dtype or pick[1]
    if not observed:
        observed = [Observed({"x": [1024, 1024]}, 1.0, 0, "no tensor input recorded: 1024x1024 assumed")]
        origin.notes.append(
            "the trace records no floating-point tensor input for this op: the scaffold assumes x of 1024x1024"
        )
    return generic_context(
        origin,
        gpu,
        op_name=op_name,
        observed=observed,
        dtype=float_dtype(x_dtype),
        differentiable=has_backward(cand),
    )


def generic_context(
    origin: Origin, gpu: GPUSpec, *, op_name: str, observed: list[Observed], dtype: str, differentiable: bool
) -> dict[str, Any]:
    ctx = base_context(origin, gpu)
    ident = identifier(op_name, "op")
    name = f"{ident}_map_reduce"[:60]
    dtypes = {"x": dtype}
    why = origin.fallback or "A generic starting point (map + row reduction) to turn into the op you need."
    ctx.update(
        op_class="generic",
        name=name,
        class_name=class_name(name),
        why_generic=[why],
        differentiable=differentiable,
        summary=f"Starting point for {comment_text(op_name, 60)}: y = map(x) (identity) and s = row sums, one pass.",
        shapes=shapes_context(observed, dtypes),
        test_shapes=[shape_literal({"x": scale_rows(o.dims["x"], 6, 2048)}) for o in observed[:2]],
        odd_shapes=[shape_literal({"x": d}) for d in ((7, 1000), (3, 2500), (5,))],
        scale_note="at most 6 rows of at most 2048 elements",
        dtype_configs=[dtypes_literal(c) for c in dtype_configs(dtypes, ["x"])],
        tol=tol_context(),
        autotune_key=["N"],
        key_note=key_note(ctx["varying"]),
        test_import_line=name,
        bench_import_line=name,
    )
    return ctx


def generic_from_kind(
    origin: Origin, gpu: GPUSpec, kind: str, shapes: list[list[int]], dtype: str
) -> dict[str, Any]:
    observed = kind_observed(shapes)
    return generic_context(
        origin, gpu, op_name="generic", observed=observed, dtype=dtype, differentiable=True
    )


FAMILY = TemplateClass(
    name="generic",
    from_candidate=generic_from_candidate,
    from_kind=generic_from_kind,
    kinds=("generic",),
)
