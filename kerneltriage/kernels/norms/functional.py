"""The norms' functional API: ``rms_norm``, ``layer_norm``, ``fused_add_rms_norm``.

Each runs the custom op while ``torch.compile`` traces (no graph break), the eager
``autograd.Function`` when a gradient is needed, and the host function directly otherwise. In
eager mode the host path (``kernels/host_path.py``: ``select()``, fast or plain) is asked for
the call's bound launch first: on the fast path a call whose input signature was seen before
takes it (one C++ call, autograd node included, once the extension is built); any other call
checks its input and takes the generic host code, then the host path binds its signature. On
the plain path there is no binding: every call takes the generic host code.
"""

from __future__ import annotations

import torch

from kerneltriage.kernels import host_path
from kerneltriage.kernels.norms.autograd import NormFunction, needs_grad
from kerneltriage.kernels.norms.launch import as_rows, check_inputs, like, norm_fwd


def _grad(key: tuple | None, *tensors) -> bool:
    """Whether the call needs a gradient (a bound call's signature says so in ``key[-2]``)."""
    return bool(key[-2]) if key is not None else needs_grad(*tensors)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float = 1e-6,
    *,
    weight_offset: float = 0.0,
    cast_before_weight: bool = False,
) -> torch.Tensor:
    """RMSNorm over the last dim of ``x``: ``x / sqrt(mean(x²) + eps) * weight``.

    Any leading shape; bf16, fp16 or fp32 (statistics in fp32); ``weight`` of shape (N,) or None.
    Differentiable in ``x`` and ``weight``. Raises KernelInputError for unsupported input.

    Hugging Face variants: ``cast_before_weight=True`` rounds the normalized x to x's dtype
    before the weight multiplies it, ``weight * normed.to(x.dtype)`` as LlamaRMSNorm (Qwen2,
    Qwen3, Mistral, ...), the output then in the promotion of x's and the weight's dtypes;
    ``weight_offset=1.0`` scales by ``1 + weight`` in fp32 as GemmaRMSNorm."""
    if torch.compiler.is_compiling():
        check_inputs("rms_norm", x, weight)
        return torch.ops.kerneltriage.rms_norm(x, weight, eps, weight_offset, cast_before_weight)[0]
    host = host_path.select()
    out = host.norm_call("rms", x, None, weight, None, eps, weight_offset, cast_before_weight)
    if out is not None:
        return out
    key, run = host.norm_lookup("rms", x, None, weight, None, eps, weight_offset, cast_before_weight)
    if run is None:
        check_inputs("rms_norm", x, weight)
    grad = _grad(key, x, weight)
    if grad:
        return NormFunction.apply(
            x, None, weight, None, eps, True, weight_offset, cast_before_weight, key, run
        )
    if run is not None:
        return run(x, None, weight, None)[0]
    y, _, _, _ = norm_fwd(
        as_rows(x), weight, None, None, eps, True, w_offset=weight_offset, cast_x=cast_before_weight
    )
    if key is not None:
        host.norm_bind(key, x, None, weight, None, eps, True, weight_offset, cast_before_weight)
    return like(y, x.shape)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """LayerNorm over the last dim: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    ``weight`` and ``bias`` of shape (N,), each optional. Differentiable in all three."""
    if torch.compiler.is_compiling():
        check_inputs("layer_norm", x, weight, bias)
        return torch.ops.kerneltriage.layer_norm(x, weight, bias, float(eps))[0]
    host = host_path.select()
    out = host.norm_call("ln", x, None, weight, bias, eps, 0.0, False)
    if out is not None:
        return out
    key, run = host.norm_lookup("ln", x, None, weight, bias, eps, 0.0, False)
    if run is None:
        check_inputs("layer_norm", x, weight, bias)
    grad = _grad(key, x, weight, bias)
    if grad:
        return NormFunction.apply(x, None, weight, bias, eps, False, 0.0, False, key, run)
    if run is not None:
        return run(x, None, weight, bias)[0]
    y, _, _, _ = norm_fwd(as_rows(x), weight, bias, None, eps, False)
    if key is not None:
        host.norm_bind(key, x, None, weight, bias, eps, False, 0.0, False)
    return like(y, x.shape)


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float = 1e-6,
    *,
    weight_offset: float = 0.0,
    cast_before_weight: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual, weight, eps), x + residual)`` in one pass.

    ``residual`` has the shape and dtype of ``x``; the sum is rounded to that dtype before it is
    normalized, as an unfused ``h = x + residual; rms_norm(h)`` would. ``weight_offset`` and
    ``cast_before_weight`` as in ``rms_norm``."""
    if torch.compiler.is_compiling():
        check_inputs("fused_add_rms_norm", x, weight, residual=residual)
        y, h, _ = torch.ops.kerneltriage.fused_add_rms_norm(
            x, residual, weight, eps, weight_offset, cast_before_weight
        )
        return y, h
    host = host_path.select()
    out = host.norm_call("add", x, residual, weight, None, eps, weight_offset, cast_before_weight)
    if out is not None:
        return out
    key, run = host.norm_lookup("add", x, residual, weight, None, eps, weight_offset, cast_before_weight)
    if run is None:
        check_inputs("fused_add_rms_norm", x, weight, residual=residual)
    grad = _grad(key, x, residual, weight)
    if grad:
        return NormFunction.apply(
            x, residual, weight, None, eps, True, weight_offset, cast_before_weight, key, run
        )
    if run is not None:
        y, h, _, _ = run(x, residual, weight, None)
        return y, h
    y, h, _, _ = norm_fwd(
        as_rows(x),
        weight,
        None,
        as_rows(residual),
        eps,
        True,
        w_offset=weight_offset,
        cast_x=cast_before_weight,
    )
    if key is not None:
        host.norm_bind(key, x, residual, weight, None, eps, True, weight_offset, cast_before_weight)
    assert h is not None  # norm_fwd returns new_residual whenever a residual is given
    return like(y, x.shape), like(h, x.shape)
