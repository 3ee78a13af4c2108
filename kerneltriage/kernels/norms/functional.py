"""The norms' functional API: ``rms_norm``, ``layer_norm``, ``fused_add_rms_norm``.

Each runs the custom op while ``torch.compile`` traces (no graph break), the eager
``autograd.Function`` when a gradient is needed, and the host function directly otherwise. In
eager mode a call whose input signature was seen before takes its bound launch (``fast.py``);
any other call checks its input and takes the generic host code, then binds its signature.
Once the C++ extension is built (``native.py``), a bound signature's call is one C++ call,
autograd node included.
"""

from __future__ import annotations

import torch

from kerneltriage.kernels.norms import fast
from kerneltriage.kernels.norms.autograd import NormFunction, needs_grad
from kerneltriage.kernels.norms.launch import as_rows, check_inputs, like, norm_fwd


def _native(kind: int, x, residual, weight, bias, eps, w_offset, cast_x):
    """The call's output through the C++ signature table when its signature is bound there
    (allocation, launch and autograd node in one C++ call), else None."""
    table = fast.TABLE
    if table is None or not fast.usable():
        return None
    try:
        return table.call(kind, x, residual, weight, bias, eps, w_offset, cast_x)
    except TypeError:  # not tensors or floats: the generic path checks and rejects them
        return None


def _lookup(kind: str, x, residual, weight, bias, eps, w_offset, cast_x):
    """(signature, its bound forward or None) of an eager call; (None, None) when the bound
    path is off or the inputs are not tensors (the generic path checks and rejects them)."""
    if not fast.usable():
        return None, None
    try:
        grad = needs_grad(x, residual, weight, bias)
        key = fast.fwd_key(kind, x, residual, weight, bias, eps, w_offset, cast_x, grad)
        return key, fast.fwd(key)
    except Exception:  # e.g. an unhashable eps
        return None, None


def _grad(key: tuple | None, *tensors) -> bool:
    return key[-2] if key is not None else needs_grad(*tensors)


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
    out = _native(0, x, None, weight, None, eps, weight_offset, cast_before_weight)
    if out is not None:
        return out
    key, run = _lookup("rms", x, None, weight, None, eps, weight_offset, cast_before_weight)
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
        fast.bind_fwd(key, x, None, weight, None, eps, True, weight_offset, cast_before_weight, False)
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
    out = _native(1, x, None, weight, bias, eps, 0.0, False)
    if out is not None:
        return out
    key, run = _lookup("ln", x, None, weight, bias, eps, 0.0, False)
    if run is None:
        check_inputs("layer_norm", x, weight, bias)
    grad = _grad(key, x, weight, bias)
    if grad:
        return NormFunction.apply(x, None, weight, bias, eps, False, 0.0, False, key, run)
    if run is not None:
        return run(x, None, weight, bias)[0]
    y, _, _, _ = norm_fwd(as_rows(x), weight, bias, None, eps, False)
    if key is not None:
        fast.bind_fwd(key, x, None, weight, bias, eps, False, 0.0, False, False)
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
    out = _native(2, x, residual, weight, None, eps, weight_offset, cast_before_weight)
    if out is not None:
        return out
    key, run = _lookup("add", x, residual, weight, None, eps, weight_offset, cast_before_weight)
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
        fast.bind_fwd(key, x, residual, weight, None, eps, True, weight_offset, cast_before_weight, False)
    return like(y, x.shape), like(h, x.shape)
