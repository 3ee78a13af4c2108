"""Depthwise 2-D convolution (groups = input channels, one filter per channel): forward, input
and weight gradients, for NCHW and channels-last activations alike."""

from __future__ import annotations

import re
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
from kerneltriage.scaffold.identifiers import dims_text, int_list, number, trace_dtype

# Argument positions (stride, padding, dilation, groups, transposed) of the convolution ops.
_CONV_ARGS: dict[str, tuple[int, int, int, int, int | None]] = {
    "conv2d": (3, 4, 5, 6, None),  # (input, weight, bias, stride, padding, dilation, groups)
    "convolution": (3, 4, 5, 8, 6),  # (…, dilation, transposed, output_padding, groups)
    "_convolution": (3, 4, 5, 8, 6),
    "cudnn_convolution": (3, 2, 4, 5, None),  # (input, weight, padding, stride, dilation, groups, …)
}
# --kind depthwise_conv (7×7, ConvNeXt's), depthwise_conv3x3, depthwise_conv5x5_stride2, …
_KIND = re.compile(r"depthwise_conv(?:(\d{1,2})x(\d{1,2}))?(?:_stride(\d{1,2}))?")
DEFAULT_KERNEL = (7, 7)
LAYOUTS = ("nchw", "channels_last")
# Every output channel reads KH·KW taps of its one input channel: few FLOPs per byte, so the
# sums stay short and fp32 accumulation keeps bf16/fp16 outputs within one rounding.
TOL = {"float32": (2e-5, 2e-4), "bfloat16": (1e-2, 2e-2), "float16": (2e-3, 5e-3)}


def _pair(text: Any) -> tuple[int, int] | None:
    """``[1, 1]`` or ``[3]`` (a recorded IntArrayRef) as two ints."""
    values = int_list(text)
    if values is None:
        value = number(text)
        values = [int(value)] if value is not None and value == int(value) else None
    if not values or len(values) > 2:
        return None
    return (values[0], values[-1])


def _out_size(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def conv_params(op: dict) -> dict[str, Any] | None:
    """x, weight, stride, padding and bias of a recorded depthwise convolution op, or None when
    the op is not one (not a 2-D convolution, groups ≠ channels, a channel multiplier, a
    dilation, a transposed convolution). ``recorded`` says whether stride and padding were."""
    positions = _CONV_ARGS.get(short_name(op))
    tensors = trace_tensors(op)
    if positions is None or len(tensors) < 2:
        return None
    (x, xt), (w, _wt) = tensors[:2]
    if len(x) != 4 or len(w) != 4 or w[0] != x[1] or w[1] != 1:
        return None  # depthwise: weight (C, 1, KH, KW), so groups = C and C_out = C
    at_stride, at_padding, at_dilation, at_groups, at_transposed = positions
    concrete = [str(c or "") for c in (op.get("concrete") or [])] + [""] * 10
    groups = number(concrete[at_groups])
    if groups is not None and int(groups) != x[1]:
        return None
    dilation = _pair(concrete[at_dilation])
    if dilation is not None and dilation != (1, 1):
        return None
    if at_transposed is not None and concrete[at_transposed].strip().lower() in ("true", "1"):
        return None
    kernel = (w[2], w[3])
    stride = _pair(concrete[at_stride])
    pad_text = concrete[at_padding].strip().strip("'\"").lower()
    if pad_text == "valid":
        padding: tuple[int, int] | None = (0, 0)
    elif pad_text == "same":
        padding = (kernel[0] // 2, kernel[1] // 2)
    else:
        padding = _pair(concrete[at_padding])
    recorded = stride is not None and padding is not None
    stride = stride or (1, 1)
    padding = padding or (kernel[0] // 2, kernel[1] // 2)
    if min(stride) < 1 or min(padding) < 0:
        return None
    if (
        min(
            _out_size(x[2], kernel[0], stride[0], padding[0]),
            _out_size(x[3], kernel[1], stride[1], padding[1]),
        )
        < 1
    ):
        return None
    dims = op.get("dims") or []
    has_bias = short_name(op) != "cudnn_convolution" and len(dims) > 2 and dims[2] == [x[1]]
    dtype = float_dtype(trace_dtype(op.get("compute_type") or xt))
    return {
        "x": x,
        "weight": w,
        "kernel": kernel,
        "stride": stride,
        "padding": padding,
        "recorded": recorded,
        "has_bias": has_bias,
        "dtype": dtype,
        "trace_dtype": trace_dtype(xt),
    }


def depthwise_from_candidate(origin: Origin, gpu: GPUSpec) -> dict[str, Any] | None:
    cand = the_candidate(origin)
    found = next((p for p in map(conv_params, cand.example) if p is not None), None)
    if found is None:
        return None  # not a depthwise convolution: the generic starting point says so
    kernel, stride, padding = found["kernel"], found["stride"], found["padding"]
    notes = []
    if not found["recorded"]:
        notes.append(
            f"stride and padding are not in the trace: the scaffold assumes stride 1 and padding "
            f"{padding[0]}x{padding[1]} (KH//2, KW//2); set STRIDE and PADDING in kernel.py and reference.py"
        )
    if found["trace_dtype"] and found["trace_dtype"] != found["dtype"]:
        notes.append(
            f"the trace runs this convolution under autocast ({found['trace_dtype']} inputs computed in "
            f"{found['dtype']}); the tests take {found['dtype']} inputs, and depthwise_conv2d casts as autocast does"
        )
    observed: list[Observed] = []
    skipped = 0
    for sig in signatures(cand):
        x, w = sig.dims.get("arg0") or [], sig.dims.get("arg1") or []
        if (
            len(x) == 4
            and w == [x[1], 1, *kernel]
            and _out_size(x[2], kernel[0], stride[0], padding[0]) >= 1
            and _out_size(x[3], kernel[1], stride[1], padding[1]) >= 1
        ):
            observed.append(Observed({"x": x, "weight": w}, sig.share, sig.count, sig.text))
        else:
            skipped += 1
    if skipped:
        notes.append(
            f"{skipped} shape signature(s) of another kernel size or rank than the example's "
            f"{kernel[0]}x{kernel[1]} are left out of the tests and bench.py"
        )
    if not observed:
        observed = [Observed({"x": found["x"], "weight": found["weight"]}, 1.0, 0)]
    origin.notes.extend(notes)
    return depthwise_context(
        origin,
        gpu,
        observed=observed,
        kernel=kernel,
        stride=stride,
        padding=padding,
        has_bias=found["has_bias"],
        dtype=found["dtype"],
        source="from the trace" if found["recorded"] else "assumed: not in the trace",
        differentiable=has_backward(cand),
    )


def _case(x, kernel, stride, padding, layout: str, bias: bool) -> dict[str, Any]:
    """One test or bench case: the shape dict ``make_inputs`` of the package reads."""
    x = tuple(int(d) for d in x)
    return {
        "x": x,
        "weight": (x[1], 1, *kernel),
        "stride": tuple(stride),
        "padding": tuple(padding),
        "layout": layout,
        "bias": bias,
    }


def _case_text(case: dict[str, Any]) -> str:
    return (
        f"x={dims_text(case['x'])} weight={dims_text(case['weight'])} stride={dims_text(case['stride'])} "
        f"padding={dims_text(case['padding'])} {case['layout']}"
    )


def _scaled(x: list[int], kernel: tuple[int, int]) -> tuple[int, ...]:
    """Batch ≤ 2, ≤ 40 channels, ≤ 14 rows and columns (at least the kernel's): interpreter-sized."""
    n, c, h, w = x
    return (min(n, 2), min(c, 40), min(h, max(14, kernel[0])), min(w, max(14, kernel[1])))


def _odd_cases(kernel, stride, padding, has_bias: bool) -> list[dict[str, Any]]:
    """Channels off every block size, 13×13 images, batch 1 and 3, both layouts, 3×3 and 7×7,
    a non-square kernel with unequal strides, with and without bias."""
    side = (max(13, kernel[0]), max(13, kernel[1]))
    cases = [
        _case((3, 37, *side), kernel, stride, padding, "nchw", has_bias),
        _case((1, 19, 13, 13), (3, 3), (1, 1), (1, 1), "channels_last", not has_bias),
        _case((3, 21, 13, 11), (5, 3), (2, 1), (2, 0), "channels_last", True),
    ]
    if tuple(kernel) != (7, 7):
        cases.append(_case((1, 37, 13, 13), (7, 7), (1, 1), (3, 3), "channels_last", has_bias))
    return cases


def depthwise_context(
    origin: Origin,
    gpu: GPUSpec,
    *,
    observed: list[Observed],
    kernel: tuple[int, int],
    stride: tuple[int, int],
    padding: tuple[int, int],
    has_bias: bool,
    dtype: str,
    source: str,
    differentiable: bool,
) -> dict[str, Any]:
    ctx = base_context(origin, gpu)
    dtypes = {"x": dtype}
    cases: list[Observed] = []
    for o in observed:  # each observed shape in both layouts: the trace does not record strides
        for layout in LAYOUTS:
            case = _case(o.dims["x"], kernel, stride, padding, layout, has_bias)
            cases.append(Observed(case, o.share, o.count, _case_text(case)))
    scaled: list[dict[str, Any]] = []
    for o in observed[:2]:
        for layout in LAYOUTS if not scaled else LAYOUTS[:1]:
            case = _case(_scaled(o.dims["x"], kernel), kernel, stride, padding, layout, has_bias)
            if case not in scaled:
                scaled.append(case)
    label = f"depthwise {kernel[0]}x{kernel[1]} convolution"
    ctx.update(
        op_class="depthwise_conv",
        name="depthwise_conv2d",
        class_name="DepthwiseConv2d",
        kernel_size=tuple(kernel),
        stride=tuple(stride),
        padding=tuple(padding),
        has_bias=has_bias,
        conv_note=source,
        differentiable=differentiable,
        summary=(
            f"A {label} (groups = C), stride {dims_text(stride)}, padding {dims_text(padding)}"
            + (", with bias" if has_bias else "")
            + "; fp32 accumulation."
        ),
        shapes=shapes_context(cases, dtypes),
        test_shapes=[shape_literal(c) for c in scaled],
        odd_shapes=[shape_literal(c) for c in _odd_cases(kernel, stride, padding, has_bias)],
        scale_note="batch at most 2, at most 40 channels, images of at most 14x14",
        dtype_configs=[
            dtypes_literal(c) for c in dtype_configs(dtypes, ["x"], ("float32", "bfloat16", "float16"))
        ],
        dtype_configs_note="as observed, then fp32, bf16 and fp16 (weight and bias in x's dtype)",
        tol=tol_context(TOL),
        autotune_key=["P", "C", "H", "W", "OH", "OW", "KH", "KW", "CHANNELS_LAST"],
        key_note=key_note(ctx["varying"]),
        test_import_line=kernel_imports("depthwise_conv2d", ["DepthwiseConv2d", "swap_depthwise_convs"]),
        bench_import_line="depthwise_conv2d",
        builtin_label=None,
    )
    ctx["constants"] += [
        f"kernel size = {kernel[0]}x{kernel[1]} (the weight's shape)",
        f"stride = {tuple(stride)}, padding = {tuple(padding)}, dilation = 1 ({source})",
        f"bias = {has_bias}",
    ]
    return ctx


def kind_params(kind: str) -> tuple[tuple[int, int], int] | None:
    """(kernel size, stride) of a ``--kind depthwise_conv…`` value, else None."""
    m = _KIND.fullmatch(kind)
    if m is None:
        return None
    kernel = (int(m.group(1)), int(m.group(2))) if m.group(1) else DEFAULT_KERNEL
    return kernel, int(m.group(3) or 1)


def depthwise_from_kind(
    origin: Origin, gpu: GPUSpec, kind: str, shapes: list[list[int]], dtype: str
) -> dict[str, Any]:
    params = kind_params(kind)
    if params is None:  # for_kind only hands this family its own kinds
        raise InputError(f"unknown --kind {kind!r} for depthwise_conv")
    kernel, stride = params
    if min(kernel) < 1 or stride < 1:
        raise InputError(f"--kind {kind}: the kernel size and the stride must be at least 1")
    padding = (kernel[0] // 2, kernel[1] // 2)  # at least one output pixel for any image
    observed = []
    for s in shapes:
        if len(s) != 4:
            raise InputError(
                "--kind depthwise_conv takes --shape NxCxHxW (batch, channels, height, width); "
                "the kernel size and stride go in the kind: depthwise_conv3x3, depthwise_conv7x7_stride2"
            )
        observed.append(Observed({"x": s, "weight": [s[1], 1, *kernel]}, 1.0 / len(shapes), 0))
    return depthwise_context(
        origin,
        gpu,
        observed=observed,
        kernel=kernel,
        stride=(stride, stride),
        padding=padding,
        has_bias=True,
        dtype=dtype,
        source=f"from --kind {kind}",
        differentiable=True,
    )


def _takes_kind(ops: list[str]) -> bool:
    return len(ops) == 1 and kind_params(ops[0]) is not None


FAMILY = TemplateClass(
    name="depthwise_conv",
    from_candidate=depthwise_from_candidate,
    from_kind=depthwise_from_kind,
    report_kinds=("convolution",),
    kinds=("depthwise_conv",),
    kind_chain=_takes_kind,
    chain_text=(
        "depthwise_conv<KH>x<KW>[_stride<S>] (--shape NxCxHxW, padding KH//2 and KW//2, "
        "depthwise_conv alone is 7x7 stride 1)"
    ),
)
