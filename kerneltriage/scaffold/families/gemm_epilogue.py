"""A GEMM (linear, mm, addmm, matmul) with its bias and activation fused into the epilogue."""

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
    key_note,
    scale_rows,
    short_name,
    the_candidate,
    trace_tensors,
)
from kerneltriage.scaffold.identifiers import class_name, trace_dtype
from kerneltriage.scaffold.op_chains import UNARY, op_label

_GEMM_OPS = {"linear": "nk", "mm": "kn", "addmm": "kn", "matmul": "kn", "_addmm_activation": "kn"}
_ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu", "sigmoid", "tanh")
# The first op of a --kind GEMM with an epilogue (gemm+bias+gelu).
_KIND_HEADS = ("gemm", "linear", "matmul")


def gemm_from_candidate(origin: Origin, gpu: GPUSpec) -> dict[str, Any] | None:
    cand = the_candidate(origin)
    example = cand.example
    if not example:
        return None
    gemm = next((op for op in example if short_name(op) in _GEMM_OPS), None)
    if gemm is None:
        return None
    op = short_name(gemm)
    tensors = trace_tensors(gemm)
    if op == "addmm":
        if len(tensors) < 3:
            return None
        (_, _), (x, xt), (w, _) = tensors[:3]
        has_bias = True
    else:
        if len(tensors) < 2:
            return None
        (x, xt), (w, _) = tensors[:2]
        has_bias = op == "linear" and len(tensors) > 2
    if len(w) != 2 or len(x) < 1:
        return None  # batched matmuls (bmm, 3-D weights): not what the template models
    layout = _GEMM_OPS[op]
    k = w[1] if layout == "nk" else w[0]
    if x[-1] != k:
        return None
    activation, act_label = None, None
    for o in example[example.index(gemm) + 1 :]:
        short = short_name(o).rstrip("_")
        if short == "gelu" and str((o.get("concrete") or ["", ""])[1:2] or "").find("tanh") >= 0:
            short = "gelu_tanh"
        if short in _ACTIVATIONS:
            activation, act_label = short, op_label(o)
            break
    if op == "_addmm_activation":
        activation, act_label = "gelu" if "True" in str(gemm.get("concrete")) else "relu", op_label(gemm)
    dtype = float_dtype(trace_dtype(gemm.get("compute_type") or xt), "float32")
    notes = []
    if gemm.get("compute_type") and trace_dtype(xt) != dtype:
        notes.append(
            f"the trace runs this GEMM under autocast ({trace_dtype(xt)} inputs computed in {dtype}); "
            f"the scaffold takes {dtype} inputs"
        )
    origin.notes.extend(notes)
    arg_names = ["bias", "x", "weight"] if op == "addmm" else ["x", "weight", "bias"]
    observed = []
    for sig in signatures(cand):
        named = {arg_names[i]: sig.dims[f"arg{i}"] for i in range(3) if sig.dims.get(f"arg{i}")}
        if "x" in named and "weight" in named and len(named["weight"]) == 2:
            observed.append(
                Observed({"x": named["x"], "weight": named["weight"]}, sig.share, sig.count, sig.text)
            )
    if not observed:
        observed = [Observed({"x": x, "weight": w}, 1.0, 0)]
    return gemm_context(
        origin,
        gpu,
        op=op,
        layout=layout,
        has_bias=has_bias,
        activation=activation,
        act_op_label=act_label or "",
        observed=observed,
        dtype=dtype,
        differentiable=has_backward(cand),
    )


def gemm_context(
    origin: Origin,
    gpu: GPUSpec,
    *,
    op: str,
    layout: str,
    has_bias: bool,
    activation: str | None,
    act_op_label: str,
    observed: list[Observed],
    dtype: str,
    differentiable: bool,
) -> dict[str, Any]:
    ctx = base_context(origin, gpu)
    varying = ctx["varying"]
    key = ["N", "K"] + (
        ["M"] if any(v.startswith("arg0") and not v.endswith("[-1]") for v in varying) else []
    )
    name = (
        ("linear" if layout == "nk" else "matmul")
        + ("_bias" if has_bias else "")
        + (f"_{activation}" if activation else "")
    )
    act_fwd = act_grad = act_torch = ""
    needs_tanh = False
    if activation:
        fwd, dv, torch_expr, needs_tanh = UNARY[activation]
        act_fwd = fwd.format(v="z", y="y", e="", c="")
        act_grad = dv.format(v="z", y="y", e="", c="")
        act_torch = torch_expr.format(v="y")
    dtypes = {"x": dtype, "weight": dtype} | ({"bias": dtype} if has_bias else {})

    def scaled(o: Observed) -> str:
        x = scale_rows(o.dims["x"], 64, 96)
        w = list(o.dims["weight"])
        n = min(w[0] if layout == "nk" else w[1], 80)
        weight = (n, x[-1]) if layout == "nk" else (x[-1], n)
        return shape_literal({"x": x, "weight": weight})

    def odd(x: tuple[int, ...], n: int) -> str:
        return shape_literal({"x": x, "weight": (n, x[-1]) if layout == "nk" else (x[-1], n)})

    act_label = {"gelu_tanh": "gelu(tanh)"}.get(activation or "", activation or "")
    ctx.update(
        op_class="gemm_epilogue",
        name=name,
        class_name=class_name(name),
        gemm_op=op,
        weight_layout=layout,
        has_bias=has_bias,
        activation=activation,
        act_label=act_label,
        act_fwd=act_fwd,
        act_grad=act_grad,
        act_grad_uses_y="y" in act_grad.replace("sigmoid", ""),
        act_torch=act_torch,
        act_op_label=act_op_label or (f"aten::{activation}" if activation else ""),
        activation_uses_f=bool(activation) and act_torch.startswith("F."),
        needs_tanh=needs_tanh,
        differentiable=differentiable,
        summary=("y = x @ weightᵀ" if layout == "nk" else "y = x @ weight")
        + (" + bias" if has_bias else "")
        + (f", then {act_label}" if activation else "")
        + ": one kernel, the epilogue applied to the fp32 accumulator before the store.",
        shapes=shapes_context(observed, dtypes),
        test_shapes=[scaled(o) for o in observed[:2]],
        odd_shapes=[odd((37, 50), 45), odd((2, 5, 24), 33)],
        scale_note="at most 64 rows, K at most 96, N at most 80",
        dtype_configs=[dtypes_literal(c) for c in dtype_configs(dtypes, list(dtypes))],
        tol=tol_context({"float32": (2e-3, 2e-3)}),  # tf32 dots on GPUs: ~1e-4 of max|y|
        autotune_key=key,
        key_note=key_note(varying),
        test_import_line=name,
        bench_import_line=name,
    )
    if activation:
        ctx["constants"].append(
            f"activation: {act_label} ({'from the trace' if origin.candidate else 'given'})"
        )
    return ctx


def gemm_from_kind(
    origin: Origin, gpu: GPUSpec, kind: str, shapes: list[list[int]], dtype: str
) -> dict[str, Any]:
    parts = kind.split("+")
    has_bias = "bias" in parts[1:]
    acts = [p for p in parts[1:] if p != "bias"]
    if len(acts) > 1 or (acts and acts[0] not in _ACTIVATIONS):
        raise InputError(f"--kind {kind}: the epilogue takes bias and one of {', '.join(_ACTIVATIONS)}")
    observed = []
    for s in shapes:
        if len(s) != 3:
            raise InputError("--kind gemm takes --shape MxNxK (rows x output features x reduction dim)")
        m, n, k = s
        observed.append(Observed({"x": [m, k], "weight": [n, k]}, 1.0 / len(shapes), 0))
    return gemm_context(
        origin,
        gpu,
        op="linear",
        layout="nk",
        has_bias=has_bias,
        activation=acts[0] if acts else None,
        act_op_label="",
        observed=observed,
        dtype=dtype,
        differentiable=True,
    )


FAMILY = TemplateClass(
    name="gemm_epilogue",
    from_candidate=gemm_from_candidate,
    from_kind=gemm_from_kind,
    report_kinds=("gemm",),
    kinds=("gemm", "linear"),
    kind_chain=lambda ops: ops[0] in _KIND_HEADS,
    chain_text=(
        f"{'/'.join(_KIND_HEADS)} with +bias and one of {', '.join('+' + a for a in _ACTIVATIONS)} "
        "(e.g. gemm+bias+gelu)"
    ),
)
