"""Fused regions: the parts of one step's forward pass that a single kernel could replace.

The forward top-level ops of a step, in order, are cut into segments:

- the **attention pattern**: matmul → (scale, mask, softcap) → softmax → (dropout) → matmul,
  with its S×S intermediates, however it was written;
- **runs** of non-boundary ops between boundary ops (GEMMs, attention, embeddings …): an
  eager RMSNorm with the residual add before it, a GELU, the cast + cross-entropy after the
  LM head. A run of several ops is a region; a run of one op is just that op;
- every boundary op on its own.

A region's ceiling counts only the bytes of its external inputs, outputs and parameters
(``ideal``): what a fused kernel must move. That is where a fusion shows up: naive attention
moves the S×S score matrix several times, its fused ceiling does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kerneltriage.analysis.candidates import estimate
from kerneltriage.analysis.candidates.estimate import Work, dtype_bytes, numel, tensor_inputs
from kerneltriage.analysis.rules import Rules


@dataclass
class OpInfo:
    """A forward top-level op as the segmenter sees it."""

    row: int
    name: str
    kind: str
    dims: Any
    types: Any
    concrete: Any
    compute_type: str | None = None
    boundary: bool = False  # ends a region whatever its kind (an extension op, an op of GEMM kernels)
    module: str | None = None  # innermost module annotation ("path:Class"), when recorded
    strides: Any = None  # the inputs' strides, when recorded (a permuted mask refuses fused SDPA)


@dataclass
class Segment:
    level: str  # "region" or "op"
    kind: str
    variant: str | None
    ops: list[OpInfo]
    attrs: dict[str, Any] = field(default_factory=dict)
    ideal: Work | None = None  # forward work of a fused kernel (regions only)
    # Its name in a report, once made (``grouping``): instances of one shape share it.
    label: str | None = field(default=None, compare=False, repr=False)
    # Bytes of the inputs of its batch-statistics norms (``_stats_bytes``): read once more
    # forward, and with the gradient once more backward, by any kernel (``roofline.py``).
    stats_bytes: float = 0.0

    @property
    def rows(self) -> list[int]:
        return [op.row for op in self.ops]

    @property
    def signature_ops(self) -> tuple[str, ...]:
        return tuple(op.name for op in self.ops)


def segment(ops: list[OpInfo], rules: Rules) -> list[Segment]:
    """Cut one step's forward op sequence into regions and single ops."""
    boundary = rules.regions.boundary_kinds
    segments: list[Segment] = []
    run: list[OpInfo] = []

    def flush() -> None:
        if run:
            segments.append(_run_segment(list(run), rules))
            run.clear()

    i = 0
    while i < len(ops):
        end = _attention_end(ops, i, rules)
        if end is not None:
            flush()
            segments.append(_attention_segment(ops[i : end + 1], rules))
            i = end + 1
            continue
        op = ops[i]
        if op.kind in boundary or op.boundary:
            flush()
            segments.append(_op_segment([op], rules))
        else:
            if run and not _same_branch(run, op):
                flush()
            run.append(op)
        i += 1
    flush()
    return segments


def _module_path(op: OpInfo) -> str | None:
    return op.module.partition(":")[0] if op.module else None


def _nested(a: str, b: str) -> bool:
    """One module path holds the other (``model.layers.0`` and ``model.layers.0.norm``)."""
    return a == b or b.startswith(a + ".") or a.startswith(b + ".") or not a or not b


def _same_branch(run: list[OpInfo], op: OpInfo) -> bool:
    """``op`` may join ``run``: its module and every module of the run lie on one branch of the
    module tree. Sibling modules (the rotary embedding's cos/sin and the first layer's norm, a
    mask built in the model and a norm in a layer) are separate work a kernel of one module
    would not fuse: they are never one region."""
    path = _module_path(op)
    if path is None:
        return True
    return all(_nested(path, p) for p in {_module_path(o) for o in run} if p is not None)


def enclosing_module(ops: list[OpInfo]) -> str | None:
    """The innermost module (``path:Class``) that holds every op of ``ops``: the module a
    compile must cover for a fused kernel of the whole region. None when unknown."""
    modules = [o.module for o in ops if o.module]
    if not modules or len(modules) < len(ops):
        return None
    paths = [m.partition(":")[0] for m in modules]
    common = paths[0].split(".")
    for p in paths[1:]:
        parts = p.split(".")
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        common = common[:n]
    path = ".".join(common)
    return next((m for m, p in zip(modules, paths) if p == path), None)


def _is_activation_matmul(op: OpInfo) -> bool:
    """A batched matmul of two activations (q @ kᵀ), not an activation times a weight."""
    tensors = tensor_inputs(op.dims, op.types)
    return len(tensors) >= 2 and len(tensors[0][0]) >= 3 and len(tensors[1][0]) >= 3


def _attention_end(ops: list[OpInfo], i: int, rules: Rules) -> int | None:
    """Index of the closing matmul when an attention pattern starts at ``ops[i]``."""
    limit = rules.regions.attention.max_ops_between
    boundary = rules.regions.boundary_kinds
    if not (rules.match(ops[i].name, "attention", "matmul_ops") and _is_activation_matmul(ops[i])):
        return None
    seen_softmax = False
    for j in range(i + 1, min(len(ops), i + 2 + limit)):
        op = ops[j]
        if rules.match(op.name, "attention", "softmax_ops"):
            seen_softmax = True
        elif rules.match(op.name, "attention", "matmul_ops") and _is_activation_matmul(op):
            return j if seen_softmax else None
        elif op.kind in boundary or op.boundary:
            return None
    return None


def _attention_segment(ops: list[OpInfo], rules: Rules) -> Segment:
    names = [op.name for op in ops]
    causal = any(rules.match(n, "attention", "causal_ops") for n in names)
    masked = any(rules.match(n, "attention", "mask_ops") for n in names)
    softcap = any(rules.match(n, "attention", "softcap_ops") for n in names)
    dropout = any(rules.match(n, "attention", "dropout_ops") for n in names)
    first, last = ops[0], ops[-1]
    (q, qt), (kt, _) = tensor_inputs(first.dims, first.types)[:2]
    v = tensor_inputs(last.dims, last.types)[1][0]
    k = [*kt[:-2], kt[-1], kt[-2]]  # q @ kᵀ: the second operand is k transposed
    type_name = first.compute_type or qt
    mask = "causal" if causal else ("custom-mask" if masked else "none")
    attrs = {
        "mask": mask,
        "softcap": softcap,
        "dropout": dropout,
        "q": q,
        "k": k,
        "v": v,
        "dtype": type_name,
        "head_dim": q[-1],
        "heads": q[-3] if len(q) >= 4 else None,
        "written": "naive",
    }
    variant = "softcap" if softcap else mask
    ideal = estimate.attention_work(q, k, v, type_name, causal)
    return Segment("region", "attention", variant, ops, attrs, ideal)


def _norm_variant(ops: list[OpInfo], rules: Rules) -> str | None:
    names = [op.name for op in ops]
    for norm in rules.norms:
        if norm.any_of and any(p.search(n) for p in norm.any_of for n in names):
            return norm.variant
        if norm.all_of and all(any(p.search(n) for n in names) for p in norm.all_of):
            return norm.variant
    return None


def _is_residual_add(op: OpInfo, rules: Rules) -> bool:
    if not rules.match(op.name, "residual_add_ops"):
        return False
    tensors = tensor_inputs(op.dims, op.types)
    return len(tensors) >= 2 and tensors[0][0] == tensors[1][0] and len(tensors[0][0]) >= 2


def _op_segment(ops: list[OpInfo], rules: Rules) -> Segment:
    """One op alone. A norm op names its norm (``aten::layer_norm`` is a LayerNorm), so that the
    rules recommend for that norm rather than for norms in general."""
    variant = _norm_variant(ops, rules) if ops[0].kind == "norm" else None
    return _with_stats(Segment("op", ops[0].kind, variant, ops), rules)


def _run_segment(ops: list[OpInfo], rules: Rules) -> Segment:
    if len(ops) == 1:
        return _op_segment(ops, rules)
    variant = _norm_variant(ops, rules)
    if variant is not None:
        fused_add = _is_residual_add(ops[0], rules) or variant.startswith("fused_add_")
        if fused_add and not variant.startswith("fused_add_"):
            variant = f"fused_add_{variant}"
        return _with_stats(
            Segment("region", "norm", variant, ops, {"residual_add": fused_add}, _norm_ideal(ops, fused_add)),
            rules,
        )
    kinds = {op.kind for op in ops}
    kind = next((k for k in rules.regions.kind_priority if k in kinds), "elementwise")
    return _with_stats(Segment("region", kind, None, ops, {}, _generic_ideal(ops, kind)), rules)


def _with_stats(seg: Segment, rules: Rules) -> Segment:
    """``seg`` with the bytes of its batch-statistics norms' inputs (``_stats_bytes``), and
    ``attrs["batch_statistics"]`` saying so where it has any."""
    seg.stats_bytes = _stats_bytes(seg.ops, rules)
    if seg.stats_bytes:
        seg.attrs["batch_statistics"] = True
    return seg


def _stats_bytes(ops: list[OpInfo], rules: Rules) -> float:
    """The input bytes of each op in ``ops`` that is a norm whose statistics span the batch,
    run in training (its ``training`` argument recorded as True; ``regions.batch_statistics``):
    a second pass over them is part of any kernel's work. 0 where none is, or where the trace
    did not record the flag."""
    spec = rules.regions.batch_statistics
    total = 0.0
    for op in ops:
        if not any(p.search(op.name) for p in spec.ops):
            continue
        concrete = op.concrete if isinstance(op.concrete, list | tuple) else ()
        if len(concrete) <= spec.training_arg or str(concrete[spec.training_arg]) != "True":
            continue
        tensors = tensor_inputs(op.dims, op.types)
        if tensors:
            x, x_type = tensors[0]
            total += numel(x) * dtype_bytes(x_type)
    return total


def _norm_ideal(ops: list[OpInfo], fused_add: bool) -> Work | None:
    """Read x (and the residual), the weight; write y (and the new residual)."""
    tensors = tensor_inputs(ops[0].dims, ops[0].types)
    if not tensors:
        return None
    x, x_type = tensors[0]
    n = numel(x)
    es = dtype_bytes(x_type)
    weight = 0
    for op in ops:
        for d, t in tensor_inputs(op.dims, op.types):
            if len(d) == 1 and d[0] == x[-1]:
                weight = d[0] * dtype_bytes(t)
    streams = 4 if fused_add else 2
    return Work(5.0 * n, streams * n * es + weight, "fp32")


def _generic_ideal(ops: list[OpInfo], kind: str) -> Work | None:
    """External inputs (first op's tensors, and tensors of new shapes later on) + one output."""
    first = tensor_inputs(ops[0].dims, ops[0].types)
    if not first:
        return None
    seen = {(tuple(d), t) for d, t in first}
    total = sum(numel(d) * dtype_bytes(t) for d, t in first)
    flops = 0.0
    for op in ops:
        tensors = tensor_inputs(op.dims, op.types)
        flops += max((numel(d) for d, _ in tensors), default=0)
        for d, t in tensors:
            key = (tuple(d), t)
            if key not in seen and not any(tuple(d) == s[0] for s in seen):
                seen.add(key)
                total += numel(d) * dtype_bytes(t)
    last = tensor_inputs(ops[-1].dims, ops[-1].types)
    big, big_t = max(last, key=lambda x: numel(x[0])) if last else first[0]
    out = numel(big) * dtype_bytes(big_t)
    if kind in ("cross-entropy", "reduction"):
        out = 4 * numel(big[:-1]) if big else 4
    precision = "fp32" if big_t in ("float", "double") else "fp16"
    return Work(flops, total + out, precision)
