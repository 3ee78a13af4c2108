"""Elementwise ops the scaffolds can generate: Triton and torch expressions with derivatives.

A chain is a list of ``ChainStep``s applied to a running fp32 value. Expressions are format strings
with ``{v}`` (the step's input), ``{y}`` (its output), ``{e}`` (a second tensor operand) and
``{c}`` (a scalar argument's name). Only names from this table reach generated code: trace
strings never do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kerneltriage.scaffold.identifiers import comment_text, number, trace_dtype

_ERF = "tl.math.erf({v} * 0.7071067811865476)"
_U = "0.7978845608028654 * ({v} + 0.044715 * {v} * {v} * {v})"

# name → (triton forward, triton d/dv, torch forward, needs _tanh)
UNARY: dict[str, tuple[str, str, str, bool]] = {
    "relu": ("tl.maximum({v}, 0.0)", "tl.where({v} > 0.0, 1.0, 0.0)", "torch.relu({v})", False),
    "gelu": (
        f"0.5 * {{v}} * (1.0 + {_ERF})",
        f"0.5 * (1.0 + {_ERF}) + {{v}} * 0.3989422804014327 * tl.exp(-0.5 * {{v}} * {{v}})",
        "F.gelu({v})",
        False,
    ),
    "gelu_tanh": (
        f"0.5 * {{v}} * (1.0 + _tanh({_U}))",
        f"0.5 * (1.0 + _tanh({_U})) + 0.5 * {{v}} * (1.0 - _tanh({_U}) * _tanh({_U}))"
        " * 0.7978845608028654 * (1.0 + 0.134145 * {v} * {v})",
        'F.gelu({v}, approximate="tanh")',
        True,
    ),
    "silu": (
        "{v} * tl.sigmoid({v})",
        "tl.sigmoid({v}) * (1.0 + {v} * (1.0 - tl.sigmoid({v})))",
        "F.silu({v})",
        False,
    ),
    "sigmoid": ("tl.sigmoid({v})", "{y} * (1.0 - {y})", "torch.sigmoid({v})", False),
    "tanh": ("_tanh({v})", "1.0 - {y} * {y}", "torch.tanh({v})", True),
    "exp": ("tl.exp({v})", "{y}", "torch.exp({v})", False),
    "neg": ("-{v}", "-1.0", "torch.neg({v})", False),
    "abs": (
        "tl.abs({v})",
        "tl.where({v} > 0.0, 1.0, tl.where({v} < 0.0, -1.0, 0.0))",
        "torch.abs({v})",
        False,
    ),
    "sqrt": ("tl.sqrt({v})", "0.5 / {y}", "torch.sqrt({v})", False),
    "rsqrt": ("tl.math.rsqrt({v})", "-0.5 * {y} / {v}", "torch.rsqrt({v})", False),
    "reciprocal": ("1.0 / {v}", "-{y} * {y}", "torch.reciprocal({v})", False),
    "square": ("{v} * {v}", "2.0 * {v}", "torch.square({v})", False),
    "cube": ("{v} * {v} * {v}", "3.0 * {v} * {v}", "torch.pow({v}, 3)", False),
}
# name → (triton forward, d/dv, torch forward) with a scalar {c}
SCALAR: dict[str, tuple[str, str, str]] = {
    "add": ("{v} + {c}", "1.0", "{v} + {c}"),
    "sub": ("{v} - {c}", "1.0", "{v} - {c}"),
    "mul": ("{v} * {c}", "{c}", "{v} * {c}"),
    "div": ("{v} / {c}", "1.0 / {c}", "{v} / {c}"),
    "pow": ("tl.exp({c} * tl.log({v}))", "{c} * {y} / {v}", "torch.pow({v}, {c})"),
}
# name → (triton forward, d/dv, d/de, torch forward) with a tensor {e}
TENSOR: dict[str, tuple[str, str, str, str]] = {
    "add": ("{v} + {e}", "1.0", "1.0", "{v} + {e}"),
    "sub": ("{v} - {e}", "1.0", "-1.0", "{v} - {e}"),
    "mul": ("{v} * {e}", "{e}", "{v}", "{v} * {e}"),
    "div": ("{v} / {e}", "1.0 / {e}", "-{y} / {e}", "{v} / {e}"),
}
# Ops that only change a view or a dtype: identity in the chain's arithmetic.
LAYOUT = {
    "view",
    "reshape",
    "_reshape_alias",
    "_unsafe_view",
    "unbind",
    "to",
    "_to_copy",
    "contiguous",
    "clone",
    "copy_",
    "expand",
    "permute",
    "transpose",
    "t",
    "flatten",
    "unsqueeze",
    "squeeze",
    "select",
    "slice",
    "split",
    "chunk",
    "detach",
    "alias",
    "as_strided",
    "type_as",
    "float",
}
ALIASES = {
    "gelu_": "gelu",
    "relu_": "relu",
    "silu_": "silu",
    "sigmoid_": "sigmoid",
    "tanh_": "tanh",
    "exp_": "exp",
    "neg_": "neg",
    "add_": "add",
    "sub_": "sub",
    "mul_": "mul",
    "div_": "div",
    "pow_": "pow",
    "true_divide": "div",
    "multiply": "mul",
    "subtract": "sub",
    "negative": "neg",
}
# ``--kind`` chain ops: unary ops, and add/sub/mul/div (a second input of the same shape).
KIND_OPS = sorted({*UNARY, *TENSOR} - {"square", "cube"})


@dataclass
class ChainStep:
    """One op of a chain, with its generated expressions (already formatted except {v}/{y}/{e})."""

    op: str  # aten short name, e.g. "gelu"
    label: str  # how the trace shows it (comment text)
    kind: str  # "unary", "scalar", "tensor" or "layout"
    fwd: str = ""  # triton forward expression
    dv: str = ""  # triton d(out)/d(in)
    de: str = ""  # triton d(out)/d(operand) (tensor steps)
    torch: str = ""  # torch forward expression
    tanh: bool = False
    scalar: str | None = None  # keyword argument name of the scalar (c1, c2, …)
    value: float | None = None  # the scalar's default value
    recorded: bool = True  # the scalar's value came from the trace's Concrete Inputs
    operand: str | None = None  # tensor operand argument name (y1, y2, …)
    operand_dims: list[int] | None = None
    operand_dtype: str | None = None
    note: str = ""

    def render(self, expr: str, v: str, y: str = "", e: str = "") -> str:
        return expr.format(v=v, y=y, e=e, c=self.scalar or "")


@dataclass
class Chain:
    steps: list[ChainStep]
    x_dims: list[int]
    x_dtype: str
    notes: list[str] = field(default_factory=list)

    @property
    def compute(self) -> list[ChainStep]:
        return [s for s in self.steps if s.kind != "layout"]

    @property
    def operands(self) -> list[ChainStep]:
        return [s for s in self.steps if s.kind == "tensor"]

    @property
    def scalars(self) -> list[ChainStep]:
        return [s for s in self.steps if s.scalar]

    @property
    def needs_tanh(self) -> bool:
        return any(s.tanh for s in self.steps)

    @property
    def name(self) -> str:
        ops = [s.op for s in self.compute]
        return "_".join(ops[:4]) if ops else "copy"


def unary_step(op: str, label: str | None = None) -> ChainStep:
    fwd, dv, torch_expr, tanh = UNARY[op]
    return ChainStep(op, label or f"aten::{op}", "unary", fwd, dv, "", torch_expr, tanh)


def _tensor_args(op: dict) -> list[tuple[int, list[int], str]]:
    out = []
    for i, (d, t) in enumerate(zip(op.get("dims") or [], op.get("types") or [])):
        if (
            isinstance(d, list)
            and d
            and all(isinstance(x, int) for x in d)
            and t not in ("Scalar", "ScalarList", "")
        ):
            out.append((i, list(d), t))
    return out


def _concrete(op: dict, i: int) -> str:
    values = op.get("concrete") or []
    return values[i] if i < len(values) else ""


def op_label(op: dict) -> str:
    parts = []
    for d, t, c in zip(op.get("dims") or [], op.get("types") or [], op.get("concrete") or []):
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            parts.append(f"{trace_dtype(t, t) or '?'}[{'x'.join(map(str, d))}]")
        elif c not in ("", None):
            parts.append(str(c))
        elif t:
            parts.append(str(t))
    return comment_text(f"{op.get('name', '?')}({', '.join(parts)})", 120)


def _tensor_step(
    short: str, label: str, op: dict, operand: tuple[int, list[int], str], name: str, default_dtype: str
) -> ChainStep:
    """add/sub/mul/div of a second tensor (``operand``: its argument index, dims and type)."""
    fwd, dv, de, torch_expr = TENSOR[short]
    alpha = number(_concrete(op, 2)) if short in ("add", "sub") else None
    if alpha not in (None, 1.0):
        fwd = fwd.replace("{e}", f"{alpha!r} * {{e}}")
        torch_expr = torch_expr.replace("{e}", f"{alpha!r} * {{e}}")
        de = f"{-alpha if short == 'sub' else alpha!r}"
    _, dims, t = operand
    return ChainStep(
        short,
        label,
        "tensor",
        fwd,
        dv,
        de,
        torch_expr,
        operand=name,
        operand_dims=dims,
        operand_dtype=trace_dtype(t, default_dtype),
    )


def _scalar_step(short: str, label: str, op: dict, name: str, notes: list[str]) -> ChainStep | None:
    """add/sub/mul/div/pow of a scalar (named ``name`` in the kernel); pow by 2, 3, 0.5, -1 or 1
    as the unary op (or identity) it is; None, with a note, for a pow the chain cannot model."""
    value = number(_concrete(op, 1))
    if short == "pow" and value in (2.0, 3.0, 0.5, -1.0, 1.0):
        mapped = {2.0: "square", 3.0: "cube", 0.5: "sqrt", -1.0: "reciprocal"}.get(value)
        if mapped is None:
            return ChainStep(short, label, "layout", note="pow 1: identity")
        return unary_step(mapped, label)
    if short == "pow" and (value is None or float(value).is_integer()):
        notes.append(f"{label}: pow with this exponent is not modelled; left out of the chain")
        return None
    alpha = number(_concrete(op, 2)) if short in ("add", "sub") else None
    recorded = value is not None
    if value is None:
        value = {"add": 0.0, "sub": 0.0, "mul": 1.0, "div": 1.0, "pow": 1.0}[short]
        notes.append(
            f"{label}: the scalar's value is not in the trace (the profiler records only "
            f"Scalar arguments); the scaffold uses {value!r}: set it in kernel.py and reference.py"
        )
    elif alpha not in (None, 1.0):
        value *= alpha
    fwd, dv, torch_expr = SCALAR[short]
    return ChainStep(
        short, label, "scalar", fwd, dv, "", torch_expr, scalar=name, value=float(value), recorded=recorded
    )


def chain_from_example(example: list[dict], default_dims: list[int], default_dtype: str) -> Chain:
    """The elementwise chain of a region/op as recorded. Unknown ops are left out and noted."""
    steps: list[ChainStep] = []
    notes: list[str] = []
    x_dims, x_dtype = None, None
    n_scalars = 0
    n_operands = 0
    for op in example:
        name = str(op.get("name", ""))
        short = name.rsplit("::", 1)[-1]
        short = ALIASES.get(short, short)
        label = op_label(op)
        tensors = _tensor_args(op)
        if x_dims is None and tensors:
            x_dims, x_dtype = tensors[0][1], trace_dtype(tensors[0][2], default_dtype)
        if short in LAYOUT:
            steps.append(ChainStep(short, label, "layout", note="layout or dtype only: identity here"))
            continue
        if short == "gelu":
            approx = _concrete(op, 1).strip().strip("'\"")
            if approx == "tanh":
                steps.append(unary_step("gelu_tanh", label))
                continue
        if short in UNARY:
            steps.append(unary_step(short, label))
            continue
        if len(tensors) >= 2 and short in TENSOR:
            n_operands += 1
            steps.append(_tensor_step(short, label, op, tensors[1], f"y{n_operands}", default_dtype))
            continue
        if short in SCALAR and len(tensors) == 1:
            step = _scalar_step(short, label, op, f"c{n_scalars + 1}", notes)
            if step is not None:
                n_scalars += 1 if step.kind == "scalar" else 0
                steps.append(step)
            continue
        if name:
            notes.append(f"{label}: not an elementwise op the scaffold models; left out of the chain")
    if x_dims is None:
        x_dims, x_dtype = list(default_dims), default_dtype
    return Chain(steps, list(x_dims), x_dtype or default_dtype, notes)


def chain_from_kind(ops: list[str], dims: list[int], dtype: str) -> Chain:
    """``--kind gelu`` / ``--kind mul+silu``: unary ops, and add/sub/mul/div with a second input of
    the same shape, in order (``families.for_kind`` has checked that every op is in ``KIND_OPS``)."""
    steps: list[ChainStep] = []
    for op in ops:
        op = ALIASES.get(op, op)
        if op in UNARY:
            steps.append(unary_step(op, op))
            continue
        fwd, dv, de, torch_expr = TENSOR[op]
        operand = f"y{sum(s.kind == 'tensor' for s in steps) + 1}"
        steps.append(
            ChainStep(
                op,
                op,
                "tensor",
                fwd,
                dv,
                de,
                torch_expr,
                operand=operand,
                operand_dims=list(dims),
                operand_dtype=dtype,
            )
        )
    return Chain(steps, list(dims), dtype, [])
