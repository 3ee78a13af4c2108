"""Pure-torch references for the norm kernels of this package.

Each function computes in the promotion of the input dtype and float32: bf16/fp16 inputs are
normalized in float32 and returned in their own dtype (the eager baseline of the benchmark), and
float64 inputs stay in float64 end to end (the reference of the tests). Gradients come from
autograd on these functions.
"""

from __future__ import annotations

import torch


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _round_through(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """t rounded to ``dtype`` (and back), with the gradient passed straight through, as a cast
    in the middle of a kernel's fp32 arithmetic rounds it."""
    exact = t.detach()
    return t + (exact.to(dtype).to(exact.dtype) - exact)


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    weight_offset: float = 0.0,
    cast_before_weight: bool = False,
    normed_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """y = x / sqrt(mean(x², last dim) + eps) · (weight_offset + weight).

    ``cast_before_weight``: the normalized x is rounded to x's dtype (``normed_dtype`` if given:
    a float64 reference of a bf16 kernel) before the weight scales it, and the output takes the
    promotion of x's and the weight's dtypes, as Hugging Face's ``weight *
    hidden.to(input_dtype)`` (LlamaRMSNorm); ``weight_offset=1`` is GemmaRMSNorm's
    ``1 + weight``."""
    xf = x.to(_compute_dtype(x))
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    out_dtype = x.dtype
    if cast_before_weight:
        y = _round_through(y, normed_dtype or x.dtype)
        if weight is not None:
            out_dtype = torch.promote_types(x.dtype, weight.dtype)
    if weight is not None:
        y = y * (weight.to(xf.dtype) + weight_offset)
    return y.to(out_dtype)


def layer_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """y = (x − mean) / sqrt(var + eps) · weight + bias, biased variance over the last dim."""
    xf = x.to(_compute_dtype(x))
    mean = xf.mean(-1, keepdim=True)
    xc = xf - mean
    y = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.to(xf.dtype)
    if bias is not None:
        y = y + bias.to(xf.dtype)
    return y.to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    residual_dtype: torch.dtype | None = None,
    weight_offset: float = 0.0,
    cast_before_weight: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual); the sum is taken in the inputs' dtype.

    ``residual_dtype``: round the sum to this dtype before normalizing it, with the gradient
    passed straight through, as a kernel that stores new_residual in bf16 does; this lets a
    float64 reference model such a kernel exactly."""
    new_residual = x + residual
    if residual_dtype is not None and residual_dtype != new_residual.dtype:
        new_residual = _round_through(new_residual, residual_dtype)
    normed = rms_norm_ref(
        new_residual,
        weight,
        eps,
        weight_offset=weight_offset,
        cast_before_weight=cast_before_weight,
        normed_dtype=residual_dtype,
    )
    return normed, new_residual
