"""Elementwise chains: a run of unary, scalar and tensor-operand ops fused into one pass, with
the backward pass derived step by step (``op_chains``)."""

from __future__ import annotations

import re
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
    kind_observed,
    scale_rows,
    the_candidate,
)
from kerneltriage.scaffold.identifiers import class_name, identifier
from kerneltriage.scaffold.op_chains import KIND_OPS, Chain, chain_from_example, chain_from_kind

_POSITIVE_OPS = {"sqrt", "rsqrt", "reciprocal", "pow"}
# Per compute step: its Triton forward, d/dv and d/de expressions, names substituted.
_Exprs = list[tuple[str, str, str]]


def _load(name: str, pointer: str) -> str:
    return f"{name} = tl.load({pointer} + offs, mask=mask, other=1.0).to(tl.float32)"


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
    cand = the_candidate(origin)
    sigs = signatures(cand)
    default_dims = sigs[0].dims.get("arg0", []) if sigs else []
    chain = chain_from_example(cand.example, default_dims, "float32")
    if not chain.x_dims:
        return None
    chain.x_dtype = float_dtype(chain.x_dtype)
    observed = [Observed({"x": o.dims["arg0"]}, o.share, o.count, o.text) for o in sigs if o.dims.get("arg0")]
    if not observed:
        observed = [Observed({"x": chain.x_dims}, 1.0, 0)]
    return elementwise_context(origin, gpu, chain=chain, observed=observed, differentiable=has_backward(cand))


def _operand_names(chain: Chain) -> list[str]:
    """The tensor operands' argument names (y1, y2, …), in the chain's order."""
    return [st.operand for st in chain.operands if st.operand]


def _forward(chain: Chain) -> tuple[list[str], _Exprs, list[dict[str, str]]]:
    """The kernel's forward lines, numbering the values v0 (x) … vn; each compute step's
    expressions; and its line in the docstring (the torch expression)."""
    fwd = [_load("v0", "X")] + [_load(o, o.upper()) for o in _operand_names(chain)]
    exprs: _Exprs = []
    docs = []
    for i, st in enumerate(chain.compute, start=1):
        v, y, e = f"v{i - 1}", f"v{i}", st.operand or ""
        f = st.render(st.fwd, v, y, e)
        dv = st.render(st.dv, v, y, e)
        de = st.render(st.de, v, y, e) if st.operand else ""
        exprs.append((f, dv, de))
        fwd.append(f"v{i} = {f}  # {st.label}")
        docs.append({"doc": f"v{i} = {st.render(st.torch, v, '', e)}    ({st.label})"})
    return fwd, exprs, docs


def _recomputed(exprs: _Exprs) -> tuple[int, set[str]]:
    """What the derivatives use: the last value v_i to recompute (-1: none) and the operands."""
    used_v: set[int] = set()
    used_ops: set[str] = set()
    for _f, dv, de in exprs:
        for text in (dv, de):
            used_v |= {int(m) for m in re.findall(r"\bv(\d+)\b", text)}
            used_ops |= set(re.findall(r"\b(y\d+)\b", text))
    top = max(used_v) if used_v else -1
    for i in range(1, top + 1):
        used_ops |= set(re.findall(r"\b(y\d+)\b", exprs[i - 1][0]))
    return top, used_ops


def _backward(chain: Chain, exprs: _Exprs) -> list[str]:
    """The backward kernel's lines: recompute only what the derivatives use, then the chain
    rule from the last step to the first, storing each tensor operand's gradient on the way."""
    top, used_ops = _recomputed(exprs)
    bwd = [_load("v0", "X")] if top >= 0 else []
    bwd += [_load(o, o.upper()) for o in _operand_names(chain) if o in used_ops]
    bwd += [f"v{i} = {exprs[i - 1][0]}" for i in range(1, top + 1)]
    bwd.append("g = tl.load(DOUT + offs, mask=mask, other=0.0).to(tl.float32)")
    compute = chain.compute
    for i in range(len(compute), 0, -1):
        st = compute[i - 1]
        _f, dv, de = exprs[i - 1]
        if st.operand:
            d = f"D{st.operand.upper()}"
            bwd.append(f"tl.store({d} + offs, (g * {de}).to({d}.dtype.element_ty), mask=mask)")
        if dv != "1.0":
            bwd.append(f"g = g * ({dv})  # d {st.op}")
    return bwd


def _reference(chain: Chain) -> list[str]:
    """reference.py's lines: the chain in torch, layout ops as comments."""
    ref = ["v = x" if chain.compute else "v = x.clone()  # the region only moves data: a copy"]
    for st in chain.steps:
        if st.kind == "layout":
            ref.append(f"# {st.label}: {st.note}")
        else:
            ref.append(f"v = {st.render(st.torch, 'v', '', st.operand or '')}  # {st.label}")
    return ref


def _scalars(chain: Chain) -> list[dict[str, Any]]:
    """The chain's scalar arguments: name, value and where the value comes from."""
    return [
        {
            "name": st.scalar,
            "value": st.value,
            "note": ("from the trace" if st.recorded else "not recorded in the trace: set it")
            + f" ({st.label})",
        }
        for st in chain.scalars
    ]


def _dims_for(
    chain: Chain, x_obs: list[int], x_new: tuple[int, ...] | list[int]
) -> dict[str, tuple[int, ...]]:
    """x's dims and every operand's, broadcast against x as observed."""
    d = {"x": tuple(x_new)}
    for st in chain.operands:
        if st.operand:
            d[st.operand] = _broadcast_like(st.operand_dims or x_obs, x_obs, x_new)
    return d


def _out_dtype(operands: list[str]) -> str:
    """The output dtype as torch promotes x's and the operands'."""
    out_dtype = "x.dtype"
    for o in operands:
        out_dtype = f"torch.promote_types({out_dtype}, {o}.dtype)"
    return out_dtype


def elementwise_context(
    origin: Origin, gpu: GPUSpec, *, chain: Chain, observed: list[Observed], differentiable: bool
) -> dict[str, Any]:
    ctx = base_context(origin, gpu)
    ctx["notes"].extend(chain.notes)
    compute = chain.compute
    operands = _operand_names(chain)
    name = identifier(chain.name, "copy")
    fwd, exprs, docs = _forward(chain)
    scalars = _scalars(chain)
    dtypes = {"x": chain.x_dtype} | {
        st.operand: float_dtype(st.operand_dtype, chain.x_dtype) for st in chain.operands if st.operand
    }
    observed_full = []
    for o in observed:
        full = _dims_for(chain, o.dims["x"], o.dims["x"])
        observed_full.append(Observed({k: list(v) for k, v in full.items()}, o.share, o.count, o.text))
    x0 = observed[0].dims["x"]
    label = " → ".join(st.op for st in compute) or "copy"
    ctx.update(
        op_class="elementwise",
        name=name,
        class_name=class_name(name),
        operands=operands,
        scalars=scalars,
        steps=docs,
        fwd_lines=fwd,
        bwd_lines=_backward(chain, exprs),
        out_var=f"v{len(compute)}",
        ref_lines=_reference(chain),
        uses_f=any(st.torch.startswith("F.") for st in compute),
        positive_x=any(st.op in _POSITIVE_OPS for st in compute),
        needs_tanh=chain.needs_tanh,
        shape_args=", ".join(f"{t}.shape" for t in ["x", *operands]),
        call_args=", ".join(
            [f"{t}.contiguous()" for t in ["x", *operands]] + [f"float({c['name']})" for c in scalars]
        ),
        out_dtype_expr=_out_dtype(operands),
        flops_per_element=max(1, len(compute)),
        differentiable=differentiable,
        summary=f"The fused chain {label}, computed in fp32.",
        shapes=shapes_context(observed_full, dtypes),
        test_shapes=[
            shape_literal(_dims_for(chain, o.dims["x"], scale_rows(o.dims["x"], 6, 2048)))
            for o in observed[:2]
        ],
        odd_shapes=[shape_literal(_dims_for(chain, x0, d)) for d in ((7, 129), (3, 5, 77))],
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
    return elementwise_context(origin, gpu, chain=chain, observed=kind_observed(shapes), differentiable=True)


FAMILY = TemplateClass(
    name="elementwise",
    from_candidate=elementwise_from_candidate,
    from_kind=elementwise_from_kind,
    report_kinds=("elementwise",),
    kind_chain=lambda ops: all(o in KIND_OPS for o in ops),
    chain_text=f"a chain of {', '.join(KIND_OPS)} (e.g. gelu, mul+silu)",
)
