"""The norms' functional API: ``rms_norm``, ``layer_norm``, ``fused_add_rms_norm``.

Each checks its input, then runs the custom op while ``torch.compile`` traces (no graph break),
the eager ``autograd.Function`` when a gradient is needed, and the host function directly
otherwise.
"""

from __future__ import annotations

import torch

from kerneltriage.kernels.norms.autograd import NormFunction, needs_grad
from kerneltriage.kernels.norms.launch import as_rows, check_inputs, like, norm_fwd


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
    check_inputs("rms_norm", x, weight)
    if torch.compiler.is_compiling():
        return torch.ops.kerneltriage.rms_norm(x, weight, eps, weight_offset, cast_before_weight)[0]
    if needs_grad(x, weight):
        return NormFunction.apply(x, None, weight, None, eps, True, weight_offset, cast_before_weight)
    y, _, _, _ = norm_fwd(
        as_rows(x), weight, None, None, eps, True, w_offset=weight_offset, cast_x=cast_before_weight
    )
    return like(y, x.shape)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """LayerNorm over the last dim: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    ``weight`` and ``bias`` of shape (N,), each optional. Differentiable in all three."""
    check_inputs("layer_norm", x, weight, bias)
    if torch.compiler.is_compiling():
        return torch.ops.kerneltriage.layer_norm(x, weight, bias, float(eps))[0]
    if needs_grad(x, weight, bias):
        return NormFunction.apply(x, None, weight, bias, eps, False, 0.0, False)
    y, _, _, _ = norm_fwd(as_rows(x), weight, bias, None, eps, False)
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
    check_inputs("fused_add_rms_norm", x, weight, residual=residual)
    if torch.compiler.is_compiling():
        y, h, _ = torch.ops.kerneltriage.fused_add_rms_norm(
            x, residual, weight, eps, weight_offset, cast_before_weight
        )
        return y, h
    if needs_grad(x, residual, weight):
        return NormFunction.apply(x, residual, weight, None, eps, True, weight_offset, cast_before_weight)
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
    return like(y, x.shape), like(h, x.shape)
