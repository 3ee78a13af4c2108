"""Row-wise normalization: RMSNorm and LayerNorm, with or without the residual add before it."""

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
    short_dtypes,
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


def rownorm_from_candidate(origin: Origin, gpu: GPUSpec) -> dict[str, Any] | None:
    cand = the_candidate(origin)
    variant = (cand.variant or "").lower()
    if "rms" in variant:
        norm = "rms"
    elif "layer" in variant:
        norm = "layer"
    else:
        return None
    residual = bool(cand.attrs.get("residual_add")) or variant.startswith("fused_add")
    example = cand.example
    dtypes: dict[str, str] = {}
    x_dims = None
    n = None
    if example:
        first = trace_tensors(example[0])
        if first:
            x_dims, x_type = first[0]
            dtypes["x"] = float_dtype(trace_dtype(x_type))
            if residual and len(first) > 1:
                dtypes["residual"] = float_dtype(trace_dtype(first[1][1]))
        n = x_dims[-1] if x_dims else None
    observed = [Observed({"x": o.dims.get("arg0", [])}, o.share, o.count, o.text) for o in signatures(cand)]
    observed = [o for o in observed if o.dims["x"]]
    if not observed and x_dims:
        observed = [Observed({"x": x_dims}, 1.0, 0)]
    if not observed:
        return None
    n = n or observed[0].dims["x"][-1]
    # weight / bias: 1-D tensors of the row length (the eager mul by the weight, or the op's args)
    params = []
    for op in example:
        for d, t in trace_tensors(op)[1:]:
            if d == [n]:
                params.append(float_dtype(trace_dtype(t)))
    has_weight = bool(params)
    has_bias = norm == "layer" and len(params) >= 2
    if has_weight:
        dtypes["weight"] = params[0]
    if has_bias:
        dtypes["bias"] = params[1]
    dtypes.setdefault("x", "float32")
    if residual:
        dtypes.setdefault("residual", dtypes["x"])
    eps, recorded = _find_eps(example)
    return rownorm_context(
        origin,
        gpu,
        norm=norm,
        residual=residual,
        has_weight=has_weight,
        has_bias=has_bias,
        eps=eps,
        eps_recorded=recorded,
        observed=observed,
        dtypes=dtypes,
        differentiable=has_backward(cand),
    )


def _find_eps(example: list[dict]) -> tuple[float | None, bool]:
    """eps from the Concrete Inputs: the scalar added to the mean of squares (eager), or the
    norm op's eps argument. The profiler records Python floats passed as ``double`` without
    their value, so it is often missing."""
    for op in example:
        short = short_name(op)
        concrete = op.get("concrete") or []
        if short in ("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm"):
            for c in concrete[2:]:
                v = number(c)
                if v is not None and 0 < v < 0.1:
                    return v, True
        if short in ("add", "add_"):
            tensors = trace_tensors(op)
            if len(tensors) == 1 and tensors[0][0] and tensors[0][0][-1] == 1:
                v = number(concrete[1] if len(concrete) > 1 else "")
                if v is not None and 0 < v < 0.1:
                    return v, True
    return None, False


def rownorm_context(
    origin: Origin,
    gpu: GPUSpec,
    *,
    norm: str,
    residual: bool,
    has_weight: bool,
    has_bias: bool,
    eps: float | None,
    eps_recorded: bool,
    observed: list[Observed],
    dtypes: dict[str, str],
    differentiable: bool,
) -> dict[str, Any]:
    label = "RMSNorm" if norm == "rms" else "LayerNorm"
    name = ("add_" if residual else "") + ("rms_norm" if norm == "rms" else "layer_norm")
    ctx = base_context(origin, gpu)
    roles = (
        ["x"]
        + (["residual"] if residual else [])
        + (["weight"] if has_weight else [])
        + (["bias"] if has_bias else [])
    )
    dtypes = {r: dtypes.get(r, dtypes.get("x", "float32")) for r in roles}
    eps, eps_note = _eps(ctx, origin, eps, 1e-6 if norm == "rms" else 1e-5, label)
    varying = ctx["varying"]
    key = ["N"] + (["M"] if any(not v.endswith("[-1]") for v in varying) else [])
    builtin_fn = {
        ("rms", True): "fused_add_rms_norm",
        ("rms", False): "rms_norm",
        ("layer", False): "layer_norm",
    }.get((norm, residual))
    if not has_weight and builtin_fn and norm == "layer":
        builtin_fn = None
    ctx.update(
        op_class="rownorm",
        name=name,
        class_name=("Add" if residual else "") + label,
        norm=norm,
        residual=residual,
        has_weight=has_weight,
        has_bias=has_bias,
        eps=float(eps),
        eps_note=eps_note,
        differentiable=differentiable,
        summary=(f"({label}(x + residual), x + residual)" if residual else f"{label} over the last dim")
        + f", statistics in fp32, eps = {eps!r}.",
        returns_doc=(
            "Returns (y, h): y = norm(h){} and h = x + residual, the next residual stream.".format(
                " · weight" if has_weight else ""
            )
            if residual
            else "Returns y, of x's shape."
        ),
        shapes=shapes_context(observed, dtypes),
        test_shapes=[shape_literal({"x": scale_rows(o.dims["x"], 6, 4096)}) for o in observed[:3]],
        odd_shapes=[shape_literal({"x": d}) for d in ((7, 1000), (3, 2500), (1, 17))],
        scale_note="at most 6 rows, rows of at most 4096",
        dtype_configs=[dtypes_literal(c) for c in dtype_configs(dtypes, roles)],
        tol=tol_context(),
        autotune_key=key,
        key_note=key_note(varying),
        builtin_fn=builtin_fn,
        builtin_label=f"kerneltriage.kernels.{builtin_fn}" if builtin_fn else None,
        test_import_line=name,
        bench_import_line=kernel_imports(name, ["EPS"]),
        dtypes_text=short_dtypes(dtypes),
    )
    return ctx


def _eps(
    ctx: dict[str, Any], origin: Origin, eps: float | None, default: float, label: str
) -> tuple[float, str]:
    """(eps, where it comes from); a note and a constant line in ``ctx`` say which."""
    if eps is None and origin.candidate is None:
        eps, eps_note = default, f"{label}'s usual default"
    elif eps is None:
        eps = default
        eps_note = (
            f"not recorded in the trace (the profiler keeps no Python float values): {label}'s usual default"
        )
        ctx["notes"].append(
            f"eps is not in the trace; the scaffold uses {eps!r}: set EPS in kernel.py and reference.py"
        )
    else:
        eps_note = "from the trace's Concrete Inputs"
    ctx["constants"].append(f"eps = {eps!r} ({eps_note})")
    return eps, eps_note


def rownorm_from_kind(
    origin: Origin, gpu: GPUSpec, kind: str, shapes: list[list[int]], dtype: str
) -> dict[str, Any]:
    norm = "rms" if "rms" in kind else "layer"
    residual = kind.startswith(("add", "fused_add"))
    return rownorm_context(
        origin,
        gpu,
        norm=norm,
        residual=residual,
        has_weight=True,
        has_bias=norm == "layer",
        eps=None,
        eps_recorded=False,
        observed=kind_observed(shapes),
        dtypes={"x": dtype},
        differentiable=True,
    )


FAMILY = TemplateClass(
    name="rownorm",
    from_candidate=rownorm_from_candidate,
    from_kind=rownorm_from_kind,
    report_kinds=("norm",),
    kinds=("rmsnorm", "layernorm", "add_rmsnorm", "add_layernorm", "fused_add_rmsnorm"),
)
