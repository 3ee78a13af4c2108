"""Per op class: read what the trace shows (or the ``--kind`` options) into the template context.

Each ``*_from_candidate`` / ``*_from_kind`` pair calls one ``*_context`` that knows the class's
template variables. Values that reach generated code are numbers, bools, dtype names from a
fixed table, identifiers from ``identifiers.identifier`` or comment-safe text.
"""

from __future__ import annotations

import math
import re
from typing import Any

from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.model import Candidate
from kerneltriage.errors import InputError
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
from kerneltriage.scaffold.identifiers import (
    FLOAT_DTYPES,
    class_name,
    comment_text,
    identifier,
    number,
    trace_dtype,
)
from kerneltriage.scaffold.op_chains import (
    KIND_OPS,
    UNARY,
    Chain,
    chain_from_example,
    chain_from_kind,
    op_label,
)


def _float(dtype: str | None, default: str = "float32") -> str:
    return dtype if dtype in FLOAT_DTYPES else default


def _differentiable(cand: Candidate | None) -> bool:
    if cand is None:
        return True
    return (cand.bwd_ms_per_step or 0.0) > 0 and (cand.fwd_ms_per_step or 0.0) > 0


def _tensors(op: dict) -> list[tuple[list[int], str]]:
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


def _short(op: dict) -> str:
    return str(op.get("name", "")).rsplit("::", 1)[-1]


def _scale_rows(dims: list[int], max_rows: int, max_last: int) -> tuple[int, ...]:
    """Fewer rows (same rank) and a bounded last dim, for the interpreter."""
    *lead, last = [int(d) for d in dims] or [1]
    lead = [min(d, 3) for d in lead]
    while lead and math.prod(lead) > max_rows:
        i = max(range(len(lead)), key=lambda j: lead[j])
        lead[i] = max(1, lead[i] // 2)
    return (*lead, min(last, max_last))


def _key_note(varying: list[str]) -> str:
    return (
        "observed shapes vary in " + ", ".join(varying) if varying else "one observed shape: fixed key dims"
    )


def _kernel_imports(name: str, extra: list[str]) -> str:
    """``from kernel import …`` names sorted as ruff's isort does (constants, classes, functions)."""
    names = sorted(set([name, *extra]), key=lambda n: (0 if n.isupper() else 1 if n[:1].isupper() else 2, n))
    return ", ".join(names)


# --------------------------------------------------------------------------------------------
# Row-wise normalization
# --------------------------------------------------------------------------------------------


def rownorm_from_candidate(origin: Origin, gpu: GPUSpec) -> dict[str, Any] | None:
    cand = origin.candidate
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
        first = _tensors(example[0])
        if first:
            x_dims, x_type = first[0]
            dtypes["x"] = _float(trace_dtype(x_type))
            if residual and len(first) > 1:
                dtypes["residual"] = _float(trace_dtype(first[1][1]))
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
        for d, t in _tensors(op)[1:]:
            if d == [n]:
                params.append(_float(trace_dtype(t)))
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
        differentiable=_differentiable(cand),
    )


def _find_eps(example: list[dict]) -> tuple[float | None, bool]:
    """eps from the Concrete Inputs: the scalar added to the mean of squares (eager), or the
    norm op's eps argument. The profiler records Python floats passed as ``double`` without
    their value, so it is often missing."""
    for op in example:
        short = _short(op)
        concrete = op.get("concrete") or []
        if short in ("layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm"):
            for c in concrete[2:]:
                v = number(c)
                if v is not None and 0 < v < 0.1:
                    return v, True
        if short in ("add", "add_"):
            tensors = _tensors(op)
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
    default_eps = 1e-6 if norm == "rms" else 1e-5
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
    if eps is None and origin.candidate is None:
        eps, eps_note = default_eps, f"{label}'s usual default"
    elif eps is None:
        eps = default_eps
        eps_note = (
            f"not recorded in the trace (the profiler keeps no Python float values): {label}'s usual default"
        )
        ctx["notes"].append(
            f"eps is not in the trace; the scaffold uses {eps!r}: set EPS in kernel.py and reference.py"
        )
    else:
        eps_note = "from the trace's Concrete Inputs"
    ctx["constants"].append(f"eps = {eps!r} ({eps_note})")
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
        test_shapes=[shape_literal({"x": _scale_rows(o.dims["x"], 6, 4096)}) for o in observed[:3]],
        odd_shapes=[shape_literal({"x": d}) for d in ((7, 1000), (3, 2500), (1, 17))],
        scale_note="at most 6 rows, rows of at most 4096",
        dtype_configs=[dtypes_literal(c) for c in dtype_configs(dtypes, roles)],
        tol=tol_context(),
        autotune_key=key,
        key_note=_key_note(varying),
        builtin_fn=builtin_fn,
        builtin_label=f"kerneltriage.kernels.{builtin_fn}" if builtin_fn else None,
        test_import_line=name,
        bench_import_line=_kernel_imports(name, ["EPS"]),
        dtypes_text=short_dtypes(dtypes),
    )
    return ctx


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
        observed=[Observed({"x": s}, 1.0 / len(shapes), 0) for s in shapes],
        dtypes={"x": dtype},
        differentiable=True,
    )


# --------------------------------------------------------------------------------------------
# Softmax, log-softmax, cross-entropy
# --------------------------------------------------------------------------------------------

_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def softmax_from_candidate(origin: Origin, gpu: GPUSpec) -> dict[str, Any] | None:
    cand = origin.candidate
    example = cand.example
    names = [_short(op) for op in example]
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
        tensors = _tensors(o)
        if tensors:
            x_dims, x_type = tensors[0]
            break
    observed = [Observed({"x": o.dims.get("arg0", [])}, o.share, o.count, o.text) for o in signatures(cand)]
    observed = [o for o in observed if o.dims["x"]] or ([Observed({"x": x_dims}, 1.0, 0)] if x_dims else [])
    if not observed:
        return None
    dtype = _float(trace_dtype(x_type), "float32")
    notes = []
    if op != "cross_entropy":
        dim, dim_recorded = -1, False
        for o in example:
            if "softmax" in _short(o):
                v = number((o.get("concrete") or ["", ""])[1] if len(o.get("concrete") or []) > 1 else "")
                if v is not None:
                    dim, dim_recorded = int(v), True
                break
        return softmax_context(
            origin,
            gpu,
            op=op,
            observed=observed,
            dtype=dtype,
            dim=dim,
            dim_recorded=dim_recorded,
            differentiable=_differentiable(cand),
        )
    if any(len(o.dims["x"]) != 2 for o in observed):
        return None  # (N, C, d1, …) losses: not what the template models
    reduction, ignore_index, smoothing, recorded = "mean", -100, 0.0, set()
    upcast = False
    for o in example:
        short = _short(o)
        concrete = list(o.get("concrete") or [])
        if short in ("to", "_to_copy") and _tensors(o) and trace_dtype(_tensors(o)[0][1]) != "float32":
            upcast = upcast or any(str(c).strip() == "6" for c in concrete)  # ScalarType 6 = float32
        if short in ("cross_entropy_loss", "nll_loss", "nll_loss_nd"):
            tensors = _tensors(o)
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
    origin.notes.extend(notes)
    return cross_entropy_context(
        origin,
        gpu,
        observed=[Observed({"logits": o.dims["x"]}, o.share, o.count, o.text) for o in observed],
        dtype=dtype,
        reduction=reduction,
        ignore_index=ignore_index,
        label_smoothing=smoothing,
        recorded=recorded,
        upcast=upcast,
        differentiable=_differentiable(cand),
    )


def _softmax_common(ctx: dict, name: str, varying: list[str]) -> None:
    ctx.update(
        op_class="softmax",
        name=name,
        tol=tol_context(),
        autotune_key=["N"] + (["M"] if any(not v.endswith("[-1]") for v in varying) else []),
        key_note=_key_note(varying),
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
        test_shapes=[shape_literal({"x": _scale_rows(o.dims["x"], 8, 8192)}) for o in observed[:3]],
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
        test_shapes=[shape_literal({"logits": _scale_rows(o.dims["logits"], 8, 8192)}) for o in observed[:3]],
        odd_shapes=[shape_literal({"logits": d}) for d in ((7, 1000), (3, 2500), (2, 5))],
        dtype_configs=[dtypes_literal(c) for c in dtype_configs(dtypes, ["logits"])],
        test_import_line=_kernel_imports("cross_entropy", ["IGNORE_INDEX"]),
        bench_import_line=_kernel_imports("cross_entropy", ["IGNORE_INDEX"]),
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
    observed = [Observed({"x": s}, 1.0 / len(shapes), 0) for s in shapes]
    if kind == "cross_entropy":
        if any(len(s) != 2 for s in shapes):
            raise InputError("--kind cross_entropy takes --shape MxV (rows x classes)")
        return cross_entropy_context(
            origin,
            gpu,
            observed=[Observed({"logits": s}, o.share, 0) for s, o in zip(shapes, observed)],
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


# --------------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------------


def attention_from_candidate(origin: Origin, gpu: GPUSpec) -> dict[str, Any] | None:
    cand = origin.candidate
    attrs = cand.attrs or {}
    example = cand.example
    names = [_short(op) for op in example]
    notes = []
    q = cand.q
    k = attrs.get("k")
    v = attrs.get("v")
    dtype = trace_dtype(attrs.get("dtype"))
    causal = attrs.get("mask") == "causal"
    scale, scale_recorded = None, False
    softcap = None
    sdpa = next((op for op in example if "scaled_dot_product" in _short(op)), None)
    if sdpa is not None:  # the op itself (SDPA): q, k, v, attn_mask, dropout_p, is_causal, scale
        tensors = _tensors(sdpa)
        if len(tensors) >= 3:
            (q, qt), (k, _), (v, _) = tensors[:3]
            dtype = trace_dtype(qt)
        concrete = list(sdpa.get("concrete") or []) + [""] * 8
        causal = str(concrete[5]).strip().lower() in ("true", "1")
        value = number(concrete[6])
        if value is not None and value > 0:
            scale, scale_recorded = value, True
        if len(tensors) >= 4:
            notes.append("the attention mask argument (attn_mask) is not modelled")
    else:
        for i, name in enumerate(names):
            concrete = [*(example[i].get("concrete") or []), "", ""]
            value = number(concrete[1])
            near_tanh = "tanh" in names[max(0, i - 1) : i + 2]
            if name in ("div", "div_", "mul", "mul_") and value and value > 0:
                if near_tanh:
                    softcap = value
                elif scale is None:
                    scale, scale_recorded = (1.0 / value if name.startswith("div") else value), True
        if attrs.get("softcap"):
            if softcap is None:
                softcap = 50.0
                notes.append("softcap value not recorded in the trace: 50.0 assumed (set SOFTCAP)")
        else:
            softcap = None
        if attrs.get("mask") == "custom-mask":
            notes.append(
                "the trace applies a custom mask (masked_fill/where/add of a tensor) that the scaffold does not "
                "reproduce: kernel and reference run without it; add it to both"
            )
        if attrs.get("dropout"):
            notes.append(
                "attention dropout in the trace is not modelled (kernel and reference run without it)"
            )
        if not any(n in ("div", "div_", "mul", "mul_") for n in names):
            scale, scale_recorded = 1.0, True
            notes.append("no scaling op between the matmuls in the trace: sm_scale = 1.0")
    if not (q and k and v) or len(q) != 4 or len(k) != 4 or len(v) != 4 or k[-1] != q[-1] or v[-1] != q[-1]:
        return None  # not (B, H, S, D) with one head dim: the template does not model it
    if q[1] % max(1, k[1]) or k != v:
        return None
    observed = []
    for o in signatures(cand):
        if {"q", "k", "v"} <= set(o.dims):
            observed.append(Observed({n: o.dims[n] for n in ("q", "k", "v")}, o.share, o.count, o.text))
    if not observed:
        observed = [Observed({"q": q, "k": k, "v": v}, 1.0, 0)]
    origin.notes.extend(notes)
    return attention_context(
        origin,
        gpu,
        observed=observed,
        dtype=_float(dtype, "bfloat16"),
        causal=causal,
        sm_scale=scale,
        scale_recorded=scale_recorded,
        softcap=softcap,
        differentiable=_differentiable(cand),
    )


def attention_context(
    origin, gpu, *, observed, dtype, causal, sm_scale, scale_recorded, softcap, differentiable
):
    ctx = base_context(origin, gpu)
    varying = ctx["varying"]
    key = ["HEAD_DIM"]
    if any(v.startswith("q[2]") or v.startswith("q[-2]") for v in varying):
        key.append("SEQ_Q")
    if any(v.startswith(("k[2]", "k[-2]", "v[2]", "v[-2]")) for v in varying):
        key.append("SEQ_K")
    d = observed[0].dims["q"][-1]
    if sm_scale is None:
        scale_note = (
            "1/sqrt(head_dim): the trace divides by a Python float it does not record"
            if origin.candidate
            else "None: 1/sqrt(head_dim)"
        )
    else:
        scale_note = "from the trace" if scale_recorded else "given"
    dtypes = {"q": dtype, "k": dtype, "v": dtype}

    def scaled(o: Observed) -> str:
        """Batch 1, at most 2 query heads (kv heads in the same ratio), sequences of at most 128."""
        heads = min(o.dims["q"][1], 2)
        kv_heads = max(1, heads * o.dims["k"][1] // max(1, o.dims["q"][1]))
        dims = {}
        for n in ("q", "k", "v"):
            seq, hd = o.dims[n][2], o.dims[n][3]
            dims[n] = (1, heads if n == "q" else kv_heads, min(seq, 128), hd)
        return shape_literal(dims)

    gqa = (2, 1) if observed[0].dims["k"][1] < observed[0].dims["q"][1] else (4, 2)
    odd = [
        {"q": (1, 2, 77, d), "k": (1, 2, 77, d), "v": (1, 2, 77, d)},
        {"q": (2, 1, 40, 48), "k": (2, 1, 65, 48), "v": (2, 1, 65, 48)},
        {"q": (1, gqa[0], 33, 32), "k": (1, gqa[1], 33, 32), "v": (1, gqa[1], 33, 32)},
    ]
    builtin_lines = []
    if softcap is None:
        builtin_lines.append(
            f"    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal={causal})  # PyTorch's fused SDPA"
        )
    if dtype in ("bfloat16", "float16") and d % 16 == 0 and d <= 256:
        builtin_lines.append(
            f"    kerneltriage.kernels.flash_attention(q, k, v, causal={causal}"
            + (f", softcap={softcap!r}" if softcap else "")
            + ")  # kerneltriage's built-in"
        )
    label = ("causal " if causal else "") + "attention" + (" with softcap" if softcap else "")
    ctx.update(
        op_class="attention",
        name="attention",
        class_name="Attention",
        causal=bool(causal),
        causal_note=("from the trace: a tril mask" if causal else "no causal mask in the trace")
        if origin.candidate
        else "given",
        sm_scale=sm_scale,
        sm_scale_note=scale_note,
        softcap=softcap,
        softcap_note=("from the trace" if softcap else "no tanh soft-capping in the trace")
        if origin.candidate
        else "none",
        differentiable=differentiable,
        summary=f"Fused {label}: softmax(q·kᵀ · sm_scale) · v without materializing the scores.",
        shapes=shapes_context(observed, dtypes),
        test_shapes=[scaled(o) for o in observed[:2]],
        odd_shapes=[shape_literal(o) for o in odd],
        scale_note="batch 1, at most 2 query heads, sequences of at most 128",
        dtype_configs=[dtypes_literal(c) for c in dtype_configs(dtypes, ["q", "k", "v"])],
        tol=tol_context({"float32": (5e-3, 1e-2), "bfloat16": (2e-2, 2e-2), "float16": (5e-3, 1e-2)}),
        autotune_key=key,
        key_note=_key_note(varying),
        builtin_lines="\n".join(builtin_lines),
        builtin_label="SDPA / kerneltriage.kernels.flash_attention" if builtin_lines else None,
        test_import_line="attention",
        bench_import_line=_kernel_imports("attention", ["CAUSAL", "SM_SCALE", "SOFTCAP"]),
    )
    ctx["constants"] += [
        f"causal = {bool(causal)} ({ctx['causal_note']})",
        f"sm_scale = {sm_scale!r} ({scale_note})",
        f"softcap = {softcap!r} ({ctx['softcap_note']})",
    ]
    return ctx


def attention_from_kind(
    origin: Origin, gpu: GPUSpec, kind: str, shapes: list[list[int]], dtype: str
) -> dict[str, Any]:
    observed = []
    for s in shapes:
        if len(s) != 4:
            raise InputError("--kind attention takes --shape BxHxSxD (batch, heads, sequence, head dim)")
        observed.append(Observed({"q": s, "k": s, "v": s}, 1.0 / len(shapes), 0))
    return attention_context(
        origin,
        gpu,
        observed=observed,
        dtype=dtype,
        causal=True,
        sm_scale=None,
        scale_recorded=False,
        softcap=None,
        differentiable=True,
    )


# --------------------------------------------------------------------------------------------
# GEMM with a fused epilogue
# --------------------------------------------------------------------------------------------

_GEMM_OPS = {"linear": "nk", "mm": "kn", "addmm": "kn", "matmul": "kn", "_addmm_activation": "kn"}
_ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "silu", "sigmoid", "tanh")


def gemm_from_candidate(origin: Origin, gpu: GPUSpec) -> dict[str, Any] | None:
    cand = origin.candidate
    example = cand.example
    if not example:
        return None
    gemm = next((op for op in example if _short(op) in _GEMM_OPS), None)
    if gemm is None:
        return None
    op = _short(gemm)
    tensors = _tensors(gemm)
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
        short = _short(o).rstrip("_")
        if short == "gelu" and str((o.get("concrete") or ["", ""])[1:2] or "").find("tanh") >= 0:
            short = "gelu_tanh"
        if short in _ACTIVATIONS:
            activation, act_label = short, op_label(o)
            break
    if op == "_addmm_activation":
        activation, act_label = "gelu" if "True" in str(gemm.get("concrete")) else "relu", op_label(gemm)
    dtype = _float(trace_dtype(gemm.get("compute_type") or xt), "float32")
    notes = []
    if gemm.get("compute_type") and trace_dtype(xt) != dtype:
        notes.append(
            f"the trace runs this GEMM under autocast ({trace_dtype(xt)} inputs computed in {dtype}); "
            f"the scaffold takes {dtype} inputs"
        )
    origin.notes.extend(notes)
    arg_names = ["bias", "x", "weight"] if op == "addmm" else ["x", "weight", "bias"]
    observed = []
    for o in signatures(cand):
        named = {arg_names[i]: o.dims.get(f"arg{i}") for i in range(3) if o.dims.get(f"arg{i}")}
        if "x" in named and "weight" in named and len(named["weight"]) == 2:
            observed.append(Observed({"x": named["x"], "weight": named["weight"]}, o.share, o.count, o.text))
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
        differentiable=_differentiable(cand),
    )


def gemm_context(
    origin, gpu, *, op, layout, has_bias, activation, act_op_label, observed, dtype, differentiable
):
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
        x = _scale_rows(o.dims["x"], 64, 96)
        w = list(o.dims["weight"])
        n = min(w[0] if layout == "nk" else w[1], 80)
        weight = (n, x[-1]) if layout == "nk" else (x[-1], n)
        return shape_literal({"x": x, "weight": weight})

    def odd(x, n):
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
        key_note=_key_note(varying),
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


# --------------------------------------------------------------------------------------------
# Elementwise chains
# --------------------------------------------------------------------------------------------

ELEMENTWISE_KIND_OPS = KIND_OPS

_POSITIVE_OPS = {"sqrt", "rsqrt", "reciprocal", "pow"}


def _broadcast_like(
    op_dims: list[int], x_obs: list[int], x_new: tuple[int, ...] | list[int]
) -> tuple[int, ...]:
    """An operand's dims for a new x, with the broadcast pattern it had against the observed x."""
    out = []
    for i in range(1, len(op_dims) + 1):
        d = op_dims[-i]
        xo = x_obs[-i] if i <= len(x_obs) else None
        xn = x_new[-i] if i <= len(x_new) else None
        if d == 1 and xo != 1:
            out.append(1)
        elif xn is None:
            out.append(min(d, 2))
        else:
            out.append(xn)
    return tuple(reversed(out))


def elementwise_from_candidate(origin: Origin, gpu: GPUSpec) -> dict[str, Any] | None:
    cand = origin.candidate
    sigs = signatures(cand)
    default_dims = sigs[0].dims.get("arg0", []) if sigs else []
    chain = chain_from_example(cand.example, default_dims, "float32")
    if not chain.x_dims:
        return None
    chain.x_dtype = _float(chain.x_dtype)
    observed = [Observed({"x": o.dims["arg0"]}, o.share, o.count, o.text) for o in sigs if o.dims.get("arg0")]
    if not observed:
        observed = [Observed({"x": chain.x_dims}, 1.0, 0)]
    return elementwise_context(
        origin, gpu, chain=chain, observed=observed, differentiable=_differentiable(cand)
    )


def elementwise_context(
    origin, gpu, *, chain: Chain, observed: list[Observed], differentiable: bool
) -> dict[str, Any]:
    ctx = base_context(origin, gpu)
    ctx["notes"].extend(chain.notes)
    compute = chain.compute
    operands = [st.operand for st in chain.operands]
    name = identifier(chain.name, "copy")
    # --- forward lines, numbering the values v0 (x) … vn
    fwd = ["v0 = tl.load(X + offs, mask=mask, other=1.0).to(tl.float32)"]
    fwd += [f"{o} = tl.load({o.upper()} + offs, mask=mask, other=1.0).to(tl.float32)" for o in operands]
    exprs = []  # per compute step: (fwd, dv, de) with names substituted
    docs = []
    for i, st in enumerate(compute, start=1):
        names = {"v": f"v{i - 1}", "y": f"v{i}", "e": st.operand or ""}
        f = st.render(st.fwd, names["v"], names["y"], names["e"])
        dv = st.render(st.dv, names["v"], names["y"], names["e"])
        de = st.render(st.de, names["v"], names["y"], names["e"]) if st.operand else ""
        exprs.append((f, dv, de))
        fwd.append(f"v{i} = {f}  # {st.label}")
        docs.append(
            {"doc": f"v{i} = {st.render(st.torch, f'v{i - 1}', '', st.operand or '')}    ({st.label})"}
        )
    out_var = f"v{len(compute)}"
    # --- backward: recompute only what the derivatives use
    used_v = set()
    used_ops = set()
    for _f, dv, de in exprs:
        for text in (dv, de):
            used_v |= {int(m) for m in re.findall(r"\bv(\d+)\b", text)}
            used_ops |= set(re.findall(r"\b(y\d+)\b", text))
    top = max(used_v) if used_v else -1
    for i in range(1, top + 1):
        used_ops |= set(re.findall(r"\b(y\d+)\b", exprs[i - 1][0]))
    bwd = []
    if top >= 0:
        bwd.append("v0 = tl.load(X + offs, mask=mask, other=1.0).to(tl.float32)")
    bwd += [
        f"{o} = tl.load({o.upper()} + offs, mask=mask, other=1.0).to(tl.float32)"
        for o in operands
        if o in used_ops
    ]
    bwd += [f"v{i} = {exprs[i - 1][0]}" for i in range(1, top + 1)]
    bwd.append("g = tl.load(DOUT + offs, mask=mask, other=0.0).to(tl.float32)")
    for i in range(len(compute), 0, -1):
        st = compute[i - 1]
        _f, dv, de = exprs[i - 1]
        if st.operand:
            d = f"D{st.operand.upper()}"
            bwd.append(f"tl.store({d} + offs, (g * {de}).to({d}.dtype.element_ty), mask=mask)")
        if dv != "1.0":
            bwd.append(f"g = g * ({dv})  # d {st.op}")
    # --- reference lines
    ref = []
    if not compute:
        ref.append("v = x.clone()  # the region only moves data: a copy")
    else:
        ref.append("v = x")
    for st in chain.steps:
        if st.kind == "layout":
            ref.append(f"# {st.label}: {st.note}")
        else:
            ref.append(f"v = {st.render(st.torch, 'v', '', st.operand or '')}  # {st.label}")
    scalars = [
        {
            "name": st.scalar,
            "value": st.value,
            "note": ("from the trace" if st.recorded else "not recorded in the trace: set it")
            + f" ({st.label})",
        }
        for st in chain.scalars
    ]
    dtypes = {"x": chain.x_dtype} | {
        st.operand: _float(st.operand_dtype, chain.x_dtype) for st in chain.operands
    }

    def dims_for(x_obs, x_new):
        d = {"x": tuple(x_new)}
        for st in chain.operands:
            d[st.operand] = _broadcast_like(st.operand_dims or x_obs, x_obs, x_new)
        return d

    observed_full = []
    for o in observed:
        full = dims_for(o.dims["x"], o.dims["x"])
        observed_full.append(Observed({k: list(v) for k, v in full.items()}, o.share, o.count, o.text))
    x0 = observed[0].dims["x"]
    out_dtype = "x.dtype"
    for o in operands:
        out_dtype = f"torch.promote_types({out_dtype}, {o}.dtype)"
    kernel_scalars = [c["name"] for c in scalars]
    label = " → ".join(st.op for st in compute) or "copy"
    ctx.update(
        op_class="elementwise",
        name=name,
        class_name=class_name(name),
        operands=operands,
        scalars=scalars,
        steps=docs,
        fwd_lines=fwd,
        bwd_lines=bwd,
        out_var=out_var,
        ref_lines=ref,
        uses_f=any(st.torch.startswith("F.") for st in compute),
        positive_x=any(st.op in _POSITIVE_OPS for st in compute),
        needs_tanh=chain.needs_tanh,
        shape_args=", ".join(f"{t}.shape" for t in ["x", *operands]),
        call_args=", ".join(
            [f"{t}.contiguous()" for t in ["x", *operands]] + [f"float({c})" for c in kernel_scalars]
        ),
        out_dtype_expr=out_dtype,
        flops_per_element=max(1, len(compute)),
        differentiable=differentiable,
        summary=f"The fused chain {label}, computed in fp32.",
        shapes=shapes_context(observed_full, dtypes),
        test_shapes=[
            shape_literal(dims_for(o.dims["x"], _scale_rows(o.dims["x"], 6, 2048))) for o in observed[:2]
        ],
        odd_shapes=[shape_literal(dims_for(x0, d)) for d in ((7, 129), (3, 5, 77))],
        scale_note="at most 6 rows of at most 2048 elements",
        dtype_configs=[dtypes_literal(c) for c in dtype_configs(dtypes, list(dtypes))],
        tol=tol_context(),
        autotune_key=["n_elements"],
        key_note="the element count",
        test_import_line=name,
        bench_import_line=name,
    )
    ctx["constants"] += [f"{c['name']} = {c['value']!r} ({c['note']})" for c in scalars]
    return ctx


def elementwise_from_kind(
    origin: Origin, gpu: GPUSpec, kind: str, shapes: list[list[int]], dtype: str
) -> dict[str, Any]:
    ops = [o for o in kind.split("+") if o]
    chain = chain_from_kind(ops, shapes[0], dtype)
    observed = [Observed({"x": s}, 1.0 / len(shapes), 0) for s in shapes]
    return elementwise_context(origin, gpu, chain=chain, observed=observed, differentiable=True)


# --------------------------------------------------------------------------------------------
# Generic starting point
# --------------------------------------------------------------------------------------------


def generic_from_candidate(origin: Origin, gpu: GPUSpec) -> dict[str, Any]:
    cand = origin.candidate
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
        dtype=_float(x_dtype),
        differentiable=_differentiable(cand),
    )


def generic_context(origin, gpu, *, op_name, observed, dtype, differentiable) -> dict[str, Any]:
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
        test_shapes=[shape_literal({"x": _scale_rows(o.dims["x"], 6, 2048)}) for o in observed[:2]],
        odd_shapes=[shape_literal({"x": d}) for d in ((7, 1000), (3, 2500), (5,))],
        scale_note="at most 6 rows of at most 2048 elements",
        dtype_configs=[dtypes_literal(c) for c in dtype_configs(dtypes, ["x"])],
        tol=tol_context(),
        autotune_key=["N"],
        key_note=_key_note(ctx["varying"]),
        test_import_line=name,
        bench_import_line=name,
    )
    return ctx


def generic_from_kind(
    origin: Origin, gpu: GPUSpec, kind: str, shapes: list[list[int]], dtype: str
) -> dict[str, Any]:
    observed = [Observed({"x": s}, 1.0 / len(shapes), 0) for s in shapes]
    return generic_context(
        origin, gpu, op_name="generic", observed=observed, dtype=dtype, differentiable=True
    )
