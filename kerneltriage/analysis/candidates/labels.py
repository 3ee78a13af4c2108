"""A candidate's name in a report: a kernel's readable name (what a generic template
instantiates), an Inductor kernel's fused ops, a segment's name from its region, op, shapes or
pattern."""

from __future__ import annotations

import hashlib
import re

from kerneltriage.analysis.candidates.estimate import tensor_inputs
from kerneltriage.analysis.timeline.compiled import FLAVOURS, decode_inductor
from kerneltriage.analysis.timeline.hot_kernels import short_name
from kerneltriage.analysis.timeline.regions import Segment
from kerneltriage.ingest.kernel_names import base_name

_GENERIC_KERNELS = {
    "Kernel",
    "Kernel2",
    "kernel",
    "device_kernel",
    "elementwise_kernel",
    "vectorized_elementwise_kernel",
    "unrolled_elementwise_kernel",
    "reduce_kernel",
    "elementwise_kernel_manual_unroll",
    "index_elementwise_kernel",
}
_TEMPLATE_WHAT = re.compile(r"\b(cutlass_\w+|\w+Functor\w*|\w+_kernel_cuda|\w+Ops|\w+_functor)\b")
# A mangled symbol's label: its demangled head within this many characters, then " #" and
# the digest (six hex digits), within the report's 80-character names (measure.NAME_LIMIT).
_MANGLED_HEAD = 72
_DIGEST_BYTES = 3


def kernel_label(name: str) -> str:
    """A kernel's readable name: its identifier, and for generic templates (``cutlass::Kernel``,
    ATen's ``vectorized_elementwise_kernel``, ``reduce_kernel``) what it instantiates:
    ``vectorized_elementwise_kernel<AddFunctor>``, ``Kernel<cutlass_80_tensorop_s1688gemm_…>``.

    A symbol the profiler left mangled (CUTLASS 3 and Composable Kernel templates run to 2,000
    characters) reads as its demangled head, as warnings print it, and a digest of the whole
    symbol: ``cutlass::device_kernel<at::cuda::detail::enable_3x_kernel_for_sm9x…> #3dee71``.
    Instantiations of one template share the head; the digest tells them apart, the same in
    every run, so the label still names one kernel when reports are compared."""
    text = name.strip()
    if text.startswith("_Z"):
        digest = hashlib.blake2b(text.encode(), digest_size=_DIGEST_BYTES).hexdigest()
        return f"{short_name(text, _MANGLED_HEAD)} #{digest}"
    base = base_name(name)
    if base not in _GENERIC_KERNELS or "<" not in name:
        return base
    m = _TEMPLATE_WHAT.search(name, name.find("<"))
    return f"{base}<{m[1]}>" if m else base


def compiled_kernel_label(name: str, vocabulary: tuple[str, ...] = ()) -> str:
    """``triton_poi_fused_add_mul_0`` → ``triton_poi_fused_add_mul_0 (Inductor pointwise: add, mul)``.

    Inductor names a kernel after the ops it fuses, sorted by name and joined by ``_``; the
    rules' ``inductor_op_names`` tell the op names that hold ``_`` themselves."""
    decoded = decode_inductor(name, vocabulary)
    if decoded is None:
        return name
    return f"{name} (Inductor {FLAVOURS[decoded[0]]}: {', '.join(decoded[1])})"


def segment_name(seg: Segment) -> str:
    """A segment's name in a report (its region, its op and shapes, its pattern), made once
    per segment: instances of one shape share it (``Segment.label``)."""
    if seg.label is None:
        seg.label = _name_of(seg)
    return seg.label


def _name_of(seg: Segment) -> str:
    if "region" in seg.attrs:
        return f"region '{seg.attrs['region']}'"
    if seg.level == "op":
        shapes = ", ".join(
            "x".join(map(str, d)) for d, _ in tensor_inputs(seg.ops[0].dims, seg.ops[0].types)[:3]
        )
        return f"{seg.ops[0].name}({shapes})" if shapes else seg.ops[0].name
    if seg.kind == "attention":
        a = seg.attrs
        mask = {"causal": "causal", "custom-mask": "masked", "none": "unmasked"}[a["mask"]]
        extra = ", softcap" if a.get("softcap") else ""
        return f"attention ({a['written']}, {mask}{extra}) " + "x".join(map(str, a["q"]))
    if seg.kind == "norm":
        base = (seg.variant or "").replace("fused_add_", "")
        prefix = "residual add + " if seg.variant and seg.variant.startswith("fused_add_") else ""
        x = tensor_inputs(seg.ops[0].dims, seg.ops[0].types)
        shape = "x".join(map(str, x[0][0])) if x else ""
        fused = next((op.name for op in seg.ops if op.kind == "norm"), None)
        how = f"via {fused}" if fused else f"eager, {len(seg.ops)} ops"
        return f"{prefix}{_norm_label(base, fused)} ({how}) {shape}".rstrip()
    short = " → ".join(dict.fromkeys(op.name.replace("aten::", "") for op in seg.ops))
    x = tensor_inputs(seg.ops[0].dims, seg.ops[0].types)
    shape = " " + "x".join(map(str, x[0][0])) if x and x[0][0] else ""
    return f"{seg.kind} region [{short}]{shape}"


def _norm_label(variant: str, op: str | None) -> str:
    """RMSNorm, LayerNorm, or the kind of norm its op names (BatchNorm, GroupNorm, …)."""
    known = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}
    if variant in known:
        return known[variant]
    text = (op or "").lower()
    for key, label in (
        ("batch", "BatchNorm"),
        ("group", "GroupNorm"),
        ("instance", "InstanceNorm"),
        ("rms", "RMSNorm"),
        ("layer", "LayerNorm"),
    ):
        if key in text:
            return label
    return "norm"
