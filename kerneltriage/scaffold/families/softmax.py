"""Softmax, log-softmax and cross-entropy over the last dim: one pass per row."""

from __future__ import annotations

from typing import Any

from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.errors import InputError
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
    kernel_imports,
    key_note,
    kind_observed,
    scale_rows,
    short_name,
    the_candidate,
    trace_tensors,
)
from kerneltriage.scaffold.identifiers import number, trace_dtype

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def softmax_from_candidate(origin: Origin, gpu: GPUSpec) -> dict[str, Any] | None:
    cand = the_candidate(origin)
    example = cand.example
    names = [short_name(op) for op in example]
    if (
        any(n in ("cross_entropy_loss", "nll_loss", "nll_loss_nd", "nll_loss2d") for n in names)
        or cand.kind == "cross-entropy"
    ):
        op = "cross_entropy"
    elif any("log_softmax" in n for n in names):
        op = "log_softmax"
    else:
        op = "softmax"
    x_dims, x_type = None, None
    for o in example:
        tensors = trace_tensors(o)
        if tensors:
            x_dims, x_type = tensors[0]
            break
    observed = [Observed({"x": o.dims.get("arg0", [])}, o.share, o.count, o.text) for o in signatures(cand)]
    observed = [o for o in observed if o.dims["x"]] or ([Observed({"x": x_dims}, 1.0, 0)] if x_dims else [])
    if not observed:
        return None
    dtype = float_dtype(trace_dtype(x_type), "float32")
    if op != "cross_entropy":
        dim, dim_recorded = _softmax_dim(example)
        return softmax_context(
            origin,
            gpu,
            op=op,
            observed=observed,
            dtype=dtype,
            dim=dim,
            dim_recorded=dim_recorded,
            differentiable=has_backward(cand),
        )
    if any(len(o.dims["x"]) != 2 for o in observed):
        return None  # (N, C, d1, …) losses: not what the template models
    arguments, notes = _loss_arguments(example, dtype)
    origin.notes.extend(notes)
    return cross_entropy_context(
        origin,
        gpu,
        observed=[Observed({"logits": o.dims["x"]}, o.share, o.count, o.text) for o in observed],
        dtype=dtype,
        **arguments,
        differentiable=has_backward(cand),
    )


def _softmax_dim(example: list[dict]) -> tuple[int, bool]:
    """(dim, recorded): the softmax op's dim argument from its Concrete Inputs, else -1."""
    for o in example:
        if "softmax" in short_name(o):
            v = number((o.get("concrete") or ["", ""])[1] if len(o.get("concrete") or []) > 1 else "")
            if v is not None:
                return int(v), True
            break
    return -1, False


def _loss_arguments(example: list[dict], dtype: str) -> tuple[dict[str, Any], list[str]]:
    """The loss's reduction, ignore_index and label smoothing (PyTorch's defaults where the
    trace records none), which of them it records, whether the logits are cast to fp32 first;
    and notes on what the template does not model."""
    reduction, ignore_index, smoothing, recorded = "mean", -100, 0.0, set()
    upcast = False
    notes = []
    for o in example:
        short = short_name(o)
        concrete = list(o.get("concrete") or [])
        if (
            short in ("to", "_to_copy")
            and trace_tensors(o)
            and trace_dtype(trace_tensors(o)[0][1]) != "float32"
        ):
            upcast = upcast or any(str(c).strip() == "6" for c in concrete)  # ScalarType 6 = float32
        if short in ("cross_entropy_loss", "nll_loss", "nll_loss_nd"):
            tensors = trace_tensors(o)
            if len(tensors) > 2 and tensors[2][0] != tensors[1][0]:
                notes.append("class weights (the loss's weight tensor) are not modelled")
            values = concrete + [""] * 6
            r = number(values[3])
            if r is not None and int(r) in _REDUCTIONS:
                reduction = _REDUCTIONS[int(r)]
                recorded.add("reduction")
            ii = number(values[4])
            if ii is not None:
                ignore_index = int(ii)
                recorded.add("ignore_index")
            if short == "cross_entropy_loss":
                ls = number(values[5])
                if ls is not None:
                    smoothing = float(ls)
                    recorded.add("label_smoothing")
            if tensors and trace_dtype(tensors[0][1]) == "float32" and dtype != "float32":
                upcast = True
    arguments = {
        "reduction": reduction,
        "ignore_index": ignore_index,
        "label_smoothing": smoothing,
        "recorded": recorded,
        "upcast": upcast,
    }
    return arguments, notes


def _softmax_common(ctx: dict, name: str, varying: list[str]) -> None:
    ctx.update(
        op_class="softmax",
        name=name,
        tol=tol_context(),
        autotune_key=["N"] + (["M"] if any(not v.endswith("[-1]") for v in varying) else []),
        key_note=key_note(varying),
        scale_note="at most 8 rows, rows of at most 8192",
    )


def softmax_context(origin, gpu, *, op, observed, dtype, dim, dim_recorded, differentiable) -> dict[str, Any]:
    ctx = base_context(origin, gpu)
    _softmax_common(ctx, op, ctx["varying"])
    dtypes = {"x": dtype}
    label = "log-softmax" if op == "log_softmax" else "softmax"
    ctx.update(
        op=op,
        class_name="LogSoftmax" if op == "log_softmax" else "Softmax",
        dim=int(dim),
        dim_note="from the trace"
        if dim_recorded
        else "the last dim (not recorded in the trace)"
        if origin.candidate
        else "the last dim",
        differentiable=differentiable,
        summary=f"{label} over dim, fp32 math, output in x's dtype.",
        shapes=shapes_context(observed, dtypes),
        test_shapes=[shape_literal({"x": scale_rows(o.dims["x"], 8, 8192)}) for o in observed[:3]],
        odd_shapes=[shape_literal({"x": d}) for d in ((7, 1000), (3, 2500), (2, 3, 33))],
        dtype_configs=[dtypes_literal(c) for c in dtype_configs(dtypes, ["x"])],
        test_import_line=op,
        bench_import_line=op,
    )
    ctx["constants"].append(f"dim = {dim} ({ctx['dim_note']})")
    return ctx


def cross_entropy_context(
    origin,
    gpu,
    *,
    observed,
    dtype,
    reduction,
    ignore_index,
    label_smoothing,
    recorded,
    upcast,
    differentiable,
) -> dict[str, Any]:
    ctx = base_context(origin, gpu)
    _softmax_common(ctx, "cross_entropy", ctx["varying"])
    dtypes = {"logits": dtype}

    def note(key: str) -> str:
        if key in recorded:
            return "from the trace's Concrete Inputs"
        return "not recorded in the trace: PyTorch's default" if origin.candidate else "PyTorch's default"

    ctx.update(
        op="cross_entropy",
        class_name="CrossEntropyLoss",
        reduction=reduction,
        ignore_index=int(ignore_index),
        label_smoothing=float(label_smoothing),
        reduction_note=note("reduction"),
        ignore_note=note("ignore_index"),
        smoothing_note=note("label_smoothing"),
        upcast=upcast,
        differentiable=differentiable,
        summary=f"Cross-entropy of logits against class ids, reduction {reduction!r}, one pass per row"
        + (" (bf16/fp16 logits read directly: the cast to fp32 is fused)." if upcast else "."),
        shapes=shapes_context(observed, dtypes),
        test_shapes=[shape_literal({"logits": scale_rows(o.dims["logits"], 8, 8192)}) for o in observed[:3]],
        odd_shapes=[shape_literal({"logits": d}) for d in ((7, 1000), (3, 2500), (2, 5))],
        dtype_configs=[dtypes_literal(c) for c in dtype_configs(dtypes, ["logits"])],
        test_import_line=kernel_imports("cross_entropy", ["IGNORE_INDEX"]),
        bench_import_line=kernel_imports("cross_entropy", ["IGNORE_INDEX"]),
    )
    ctx["constants"] += [
        f"reduction = {reduction!r} ({ctx['reduction_note']})",
        f"ignore_index = {ignore_index} ({ctx['ignore_note']})",
        f"label_smoothing = {label_smoothing!r} ({ctx['smoothing_note']})",
    ]
    if upcast:
        ctx["constants"].append("logits cast to fp32 before the loss (aten::to in the trace): loss in fp32")
    return ctx


def softmax_from_kind(
    origin: Origin, gpu: GPUSpec, kind: str, shapes: list[list[int]], dtype: str
) -> dict[str, Any]:
    observed = kind_observed(shapes)
    if kind == "cross_entropy":
        if any(len(s) != 2 for s in shapes):
            raise InputError("--kind cross_entropy takes --shape MxV (rows x classes)")
        return cross_entropy_context(
            origin,
            gpu,
            observed=kind_observed(shapes, "logits"),
            dtype=dtype,
            reduction="mean",
            ignore_index=-100,
            label_smoothing=0.0,
            recorded=set(),
            upcast=dtype != "float32",
            differentiable=True,
        )
    return softmax_context(
        origin, gpu, op=kind, observed=observed, dtype=dtype, dim=-1, dim_recorded=False, differentiable=True
    )


FAMILY = TemplateClass(
    name="softmax",
    from_candidate=softmax_from_candidate,
    from_kind=softmax_from_kind,
    report_kinds=("softmax", "cross-entropy"),
    kinds=("softmax", "log_softmax", "cross_entropy"),
)
