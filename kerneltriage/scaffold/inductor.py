"""Scaffolds for kernels Inductor generated (torch.compile): the eager ops a kernel fuses are the
reference, and the template is the one of their class, at the kernel's observed shapes.

Inductor names a kernel after the ATen ops it fuses (``triton_per_fused_native_layer_norm_0``);
the report decodes that list (``Candidate.fused_ops``) and records the kernel's arguments
(its launch record: inputs and outputs). From them:

- a norm (``native_layer_norm``, or ``mean`` + ``rsqrt`` as an RMSNorm decomposes) →
  ``rownorm``, with the residual add when ``add`` is fused too;
- ``_softmax`` / ``_log_softmax`` → ``softmax``;
- a pointwise kernel of ops the elementwise chains model → ``elementwise``;
- anything else (backward kernels, reductions of other kinds, templates) → ``generic``.

x is the kernel's largest argument (the activations the fused ops stream).
"""

from __future__ import annotations

from kerneltriage.analysis.candidates.estimate import tensor_inputs
from kerneltriage.analysis.model import Candidate
from kerneltriage.analysis.timeline.compiled import compute_ops
from kerneltriage.scaffold.identifiers import FLOAT_DTYPES, comment_text, trace_dtype
from kerneltriage.scaffold.op_chains import ALIASES, KIND_OPS, UNARY

# Ops that only the backward pass fuses: the eager reference would be an autograd graph.
_BACKWARD = ("_backward", "backward_")


def plan(cand: Candidate) -> tuple[str, str, list[int], str, list[str]] | None:
    """(template, --kind value, x dims, dtype, notes) for an Inductor candidate, or None when
    the report holds no decoded name or no recorded arguments for it. notes[0] is the kernel's
    provenance (the context's ``inductor``), the rest what the scaffold could not reproduce."""
    ops = list(cand.fused_ops or [])
    if not ops or not cand.example:
        return None
    first = cand.example[0]
    tensors = tensor_inputs(first.get("dims"), first.get("types"))
    floats = [(d, t) for d, t in tensors if trace_dtype(t) in FLOAT_DTYPES and d]
    if not floats:
        return None
    # x: the activations, the size most arguments share (inputs and outputs of the fused ops;
    # an embedding table or a weight is bigger or smaller but alone), the larger on a tie.
    sizes = [_numel(d) for d, _ in floats]
    dims, type_name = max(floats, key=lambda dt: (sizes.count(_numel(dt[0])), _numel(dt[0])))
    same_size = sizes.count(_numel(dims))
    dtype = trace_dtype(type_name) or "float32"
    compute = compute_ops(ops)
    kernel = cand.kernels[0].name if cand.kernels else cand.name
    flavour = str(cand.attrs.get("inductor_flavour") or "")
    listed = ", ".join(ops)
    notes = [
        comment_text(
            f"Inductor's {kernel} fuses {listed} (from its name; Inductor sorts the names, so the order "
            "is not the order of computation): the reference below is those eager ops at the kernel's "
            "observed shape. Compare it with Inductor's source (TORCH_LOGS=output_code) before tuning.",
            400,
        )
    ]
    backward = any(any(b in op for b in _BACKWARD) for op in ops)
    kind = _norm_kind(compute, same_size) if not backward else None
    if kind:
        return "rownorm", kind, dims, dtype, notes
    if not backward and any(op in ("_softmax", "softmax") for op in compute):
        return "softmax", "softmax", dims, dtype, notes
    if not backward and any(op in ("_log_softmax", "log_softmax") for op in compute):
        return "softmax", "log_softmax", dims, dtype, notes
    chain = [ALIASES.get(op, op) for op in compute]
    if flavour == "pointwise" and not backward and all(op in KIND_OPS for op in chain):
        # Activations first, then the binary ops that combine them (silu(a) * b, SwiGLU's
        # order); Inductor's name does not say, so the note asks to check it.
        ordered = [op for op in chain if op in UNARY] + [op for op in chain if op not in UNARY]
        if not ordered:
            notes.append("the kernel only moves or casts data: the reference is a copy")
        return "elementwise", "+".join(dict.fromkeys(ordered)), dims, dtype, notes
    why = (
        "a backward kernel (its eager reference is an autograd graph)"
        if backward
        else f"{listed}: no template models this combination"
    )
    notes.append(comment_text(f"generic template: {why}", 200))
    return "generic", "generic", dims, dtype, notes


def _norm_kind(compute: list[str], same_size: int) -> str | None:
    """rmsnorm / layernorm, ``add_`` when a residual add is fused. Every decomposed norm adds
    eps, so ``add`` alone says nothing: a residual add shows as a third activation-sized
    argument (x, the residual, and the output)."""
    ops = set(compute)
    residual = same_size >= 3
    if ops & {"native_layer_norm", "layer_norm"} or {"var_mean", "rsqrt"} <= ops:
        return "add_layernorm" if residual else "layernorm"
    if ops & {"rms_norm", "_fused_rms_norm"} or {"mean", "rsqrt"} <= ops:
        return "add_rmsnorm" if residual else "rmsnorm"
    return None


def _numel(dims: list[int]) -> int:
    out = 1
    for d in dims:
        out *= int(d)
    return out
