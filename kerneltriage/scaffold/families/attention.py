"""Attention: softmax(q·kᵀ · sm_scale) · v in one kernel (causal, soft-capped, grouped heads)."""

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
    short_name,
    the_candidate,
    trace_tensors,
)
from kerneltriage.scaffold.identifiers import number, trace_dtype


def attention_from_candidate(origin: Origin, gpu: GPUSpec) -> dict[str, Any] | None:
    cand = the_candidate(origin)
    attrs = cand.attrs or {}
    example = cand.example
    names = [short_name(op) for op in example]
    notes = []
    q = cand.q
    k = attrs.get("k")
    v = attrs.get("v")
    dtype = trace_dtype(attrs.get("dtype"))
    causal = attrs.get("mask") == "causal"
    scale, scale_recorded = None, False
    softcap = None
    sdpa = next((op for op in example if "scaled_dot_product" in short_name(op)), None)
    if sdpa is not None:  # the op itself (SDPA): q, k, v, attn_mask, dropout_p, is_causal, scale
        tensors = trace_tensors(sdpa)
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
        dtype=float_dtype(dtype, "bfloat16"),
        causal=causal,
        sm_scale=scale,
        scale_recorded=scale_recorded,
        softcap=softcap,
        differentiable=has_backward(cand),
    )


def attention_context(
    origin: Origin,
    gpu: GPUSpec,
    *,
    observed: list[Observed],
    dtype: str,
    causal: bool,
    sm_scale: float | None,
    scale_recorded: bool,
    softcap: float | None,
    differentiable: bool,
) -> dict[str, Any]:
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
    builtin_lines = _builtin_lines(causal, softcap, dtype, d)
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
        test_shapes=[_scaled(o) for o in observed[:2]],
        odd_shapes=_odd_shapes(observed[0], d),
        scale_note="batch 1, at most 2 query heads, sequences of at most 128",
        dtype_configs=[dtypes_literal(c) for c in dtype_configs(dtypes, ["q", "k", "v"])],
        tol=tol_context({"float32": (5e-3, 1e-2), "bfloat16": (2e-2, 2e-2), "float16": (5e-3, 1e-2)}),
        autotune_key=key,
        key_note=key_note(varying),
        builtin_lines="\n".join(builtin_lines),
        builtin_label="SDPA / kerneltriage.kernels.flash_attention" if builtin_lines else None,
        test_import_line="attention",
        bench_import_line=kernel_imports("attention", ["CAUSAL", "SM_SCALE", "SOFTCAP"]),
    )
    ctx["constants"] += [
        f"causal = {bool(causal)} ({ctx['causal_note']})",
        f"sm_scale = {sm_scale!r} ({scale_note})",
        f"softcap = {softcap!r} ({ctx['softcap_note']})",
    ]
    return ctx


def _scaled(o: Observed) -> str:
    """Batch 1, at most 2 query heads (kv heads in the same ratio), sequences of at most 128."""
    heads = min(o.dims["q"][1], 2)
    kv_heads = max(1, heads * o.dims["k"][1] // max(1, o.dims["q"][1]))
    dims = {}
    for n in ("q", "k", "v"):
        seq, hd = o.dims[n][2], o.dims[n][3]
        dims[n] = (1, heads if n == "q" else kv_heads, min(seq, 128), hd)
    return shape_literal(dims)


def _odd_shapes(first: Observed, d: int) -> list[str]:
    """Sequences that fill no block, cross-attention lengths, grouped heads (as observed, or 2:1)."""
    gqa = (2, 1) if first.dims["k"][1] < first.dims["q"][1] else (4, 2)
    odd = [
        {"q": (1, 2, 77, d), "k": (1, 2, 77, d), "v": (1, 2, 77, d)},
        {"q": (2, 1, 40, 48), "k": (2, 1, 65, 48), "v": (2, 1, 65, 48)},
        {"q": (1, gqa[0], 33, 32), "k": (1, gqa[1], 33, 32), "v": (1, gqa[1], 33, 32)},
    ]
    return [shape_literal(o) for o in odd]


def _builtin_lines(causal: bool, softcap: float | None, dtype: str, d: int) -> list[str]:
    """The built-in kernels that compute the same attention, as lines of bench.py."""
    lines = []
    if softcap is None:
        lines.append(
            f"    torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal={causal})  # PyTorch's fused SDPA"
        )
    if dtype in ("bfloat16", "float16") and d % 16 == 0 and d <= 256:
        lines.append(
            f"    kerneltriage.kernels.flash_attention(q, k, v, causal={causal}"
            + (f", softcap={softcap!r}" if softcap else "")
            + ")  # kerneltriage's built-in"
        )
    return lines


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


FAMILY = TemplateClass(
    name="attention",
    from_candidate=attention_from_candidate,
    from_kind=attention_from_kind,
    report_kinds=("attention",),
    kinds=("attention", "causal_attention"),
)
