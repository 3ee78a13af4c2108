"""Autograd for the norms, two ways over the same host functions (``launch.norm_fwd`` / ``norm_bwd``).

- ``NormFunction`` (a ``torch.autograd.Function``): the eager path's Python autograd, for calls
  the C++ bound path (``kernels/native.py``: its own node, ``kerneltriage::NormBackward``) does
  not take: first calls of a signature, no GPU, no compiler, ``KERNELTRIAGE_NATIVE=0``. It costs
  12-24 µs more per call than the C++ node, less than a custom op's dispatcher round trip.
- Custom ops in the ``kerneltriage`` namespace, with ``register_fake`` (shapes and dtypes for
  tracing) and ``register_autograd``: what ``torch.compile`` sees, as one opaque node per call,
  so a compiled model has no graph break and no recompilation per shape::

      kerneltriage::rms_norm(x, weight?, eps, weight_offset, cast_before_weight) -> (y, rstd)
      kerneltriage::layer_norm(x, weight?, bias?, eps) -> (y, mean, rstd)
      kerneltriage::fused_add_rms_norm(x, residual, weight?, eps, weight_offset,
                                       cast_before_weight) -> (y, new_residual, rstd)
      kerneltriage::norm_backward(dy, x, weight?, mean?, rstd, dresidual?, weight_offset,
                                  cast_before_weight, need_dw, need_db) -> (dx, dw, db)

  rstd/mean have x's leading shape (fp32); dw/db are empty (0,) tensors when not asked for
  (a custom op returns tensors, not None). The functional API picks the custom ops while
  ``torch.compiler.is_compiling()``, the ``autograd.Function`` otherwise.
"""

from __future__ import annotations

import torch
from torch.library import custom_op

from kerneltriage.kernels import host_path
from kerneltriage.kernels.norms.launch import as_rows, like, norm_bwd, norm_fwd, out_dtype


def needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


# --------------------------------------------------------------------------------------------
# Eager: one autograd.Function for the three norms
# --------------------------------------------------------------------------------------------


class NormFunction(torch.autograd.Function):
    """RMSNorm (``is_rms``, optionally with a residual add) or LayerNorm. Returns y, or
    (y, new_residual) when a residual is given."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps, is_rms, w_offset, cast_x, key=None, run=None):
        """``key``/``run``: the call's signature and its bound forward (``host_path``), if any."""
        shape = x.shape
        if run is not None:  # outputs already in x's shape
            y, h, mean, rstd = run(x, residual, weight, bias)
            xs = x if h is None else h
        else:
            x2 = as_rows(x)
            r2 = None if residual is None else as_rows(residual)
            y, h, mean, rstd = norm_fwd(x2, weight, bias, r2, eps, is_rms, w_offset=w_offset, cast_x=cast_x)
            xs = x2 if h is None else h
            y = like(y, shape)
            h = None if h is None else like(h, shape)
            if key is not None:
                host_path.select().norm_bind(key, x, residual, weight, bias, eps, is_rms, w_offset, cast_x)
        # Backward needs the normalized input: x, or x + residual, which new_residual holds.
        ctx.save_for_backward(xs, weight, mean, rstd)
        ctx.meta = (shape, h is not None, bias is not None, w_offset, cast_x, key)
        ctx.set_materialize_grads(False)  # an unused output's gradient stays None, not zeros
        if h is None:
            return y
        return y, h

    @staticmethod
    def backward(ctx, dy, dnew_residual=None):
        xs, weight, mean, rstd = ctx.saved_tensors
        shape, has_res, has_bias, w_offset, cast_x, key = ctx.meta
        if dy is None:
            dy = torch.zeros(shape, dtype=xs.dtype, device=xs.device)
        needs = ctx.needs_input_grad
        need_dw, need_db = needs[2], has_bias and needs[3]
        host, bkey = None, None
        if key is not None:
            host = host_path.select()
            bkey, run = host.norm_lookup_bwd(key, dy, dnew_residual, need_dw, need_db)
            if run is not None:
                dx, dw, db = run(dy, xs, weight, mean, rstd, dnew_residual)
                return dx, (dx if has_res else None), dw, db, None, None, None, None, None, None
        dres = None if dnew_residual is None else as_rows(dnew_residual)
        dx, dw, db = norm_bwd(
            as_rows(dy),
            as_rows(xs),
            weight,
            mean,
            rstd,
            dresidual=dres,
            need_dw=need_dw,
            need_db=need_db,
            w_offset=w_offset,
            cast_x=cast_x,
        )
        if host is not None and bkey is not None:
            host.norm_bind_bwd(
                bkey, dy, xs, weight, mean, rstd, dnew_residual, need_dw, need_db, w_offset, cast_x
            )
        dx = like(dx, shape)
        return dx, (dx if has_res else None), dw, db, None, None, None, None, None, None


# --------------------------------------------------------------------------------------------
# torch.compile: custom ops
# --------------------------------------------------------------------------------------------


def _stat(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)


def _nothing(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=x.dtype, device=x.device)


def _stat_view(t: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    assert t is not None  # norm_fwd returns rstd always, mean for LayerNorm
    return t.view(x.shape[:-1])


@custom_op("kerneltriage::rms_norm", mutates_args=())
def rms_norm_op(
    x: torch.Tensor, weight: torch.Tensor | None, eps: float, weight_offset: float, cast_before_weight: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    y, _, _, rstd = norm_fwd(
        as_rows(x), weight, None, None, eps, True, w_offset=weight_offset, cast_x=cast_before_weight
    )
    return like(y, x.shape), _stat_view(rstd, x)


@rms_norm_op.register_fake
def _(x, weight, eps, weight_offset, cast_before_weight):
    y = torch.empty(x.shape, dtype=out_dtype(x, weight, cast_before_weight), device=x.device)
    return y, _stat(x)


@custom_op("kerneltriage::layer_norm", mutates_args=())
def layer_norm_op(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, _, mean, rstd = norm_fwd(as_rows(x), weight, bias, None, eps, False)
    return like(y, x.shape), _stat_view(mean, x), _stat_view(rstd, x)


@layer_norm_op.register_fake
def _(x, weight, bias, eps):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device), _stat(x), _stat(x)


@custom_op("kerneltriage::fused_add_rms_norm", mutates_args=())
def fused_add_rms_norm_op(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float,
    weight_offset: float,
    cast_before_weight: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, h, _, rstd = norm_fwd(
        as_rows(x),
        weight,
        None,
        as_rows(residual),
        eps,
        True,
        w_offset=weight_offset,
        cast_x=cast_before_weight,
    )
    assert h is not None  # norm_fwd returns new_residual whenever a residual is given
    return like(y, x.shape), like(h, x.shape), _stat_view(rstd, x)


@fused_add_rms_norm_op.register_fake
def _(x, residual, weight, eps, weight_offset, cast_before_weight):
    y = torch.empty(x.shape, dtype=out_dtype(x, weight, cast_before_weight), device=x.device)
    return y, torch.empty(x.shape, dtype=x.dtype, device=x.device), _stat(x)


@custom_op("kerneltriage::norm_backward", mutates_args=())
def norm_backward_op(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    mean: torch.Tensor | None,
    rstd: torch.Tensor,
    dresidual: torch.Tensor | None,
    weight_offset: float,
    cast_before_weight: bool,
    need_dw: bool,
    need_db: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dx, dw, db = norm_bwd(
        as_rows(dy),
        as_rows(x),
        weight,
        None if mean is None else mean.reshape(-1),
        rstd.reshape(-1),
        dresidual=None if dresidual is None else as_rows(dresidual),
        need_dw=need_dw,
        need_db=need_db,
        w_offset=weight_offset,
        cast_x=cast_before_weight,
    )
    return like(dx, x.shape), _nothing(x) if dw is None else dw, _nothing(x) if db is None else db


@norm_backward_op.register_fake
def _(dy, x, weight, mean, rstd, dresidual, weight_offset, cast_before_weight, need_dw, need_db):
    wdtype = weight.dtype if weight is not None else x.dtype
    n = x.shape[-1]

    def vec(needed: bool) -> torch.Tensor:
        return torch.empty(n if needed else 0, dtype=wdtype if needed else x.dtype, device=x.device)

    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    return dx, vec(need_dw and weight is not None), vec(need_db)


def _grad_or_none(t: torch.Tensor, wanted: bool) -> torch.Tensor | None:
    return t if wanted and t.numel() else None


def _rms_setup(ctx, inputs, output):
    x, weight, _, weight_offset, cast = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.meta = (weight_offset, cast)
    ctx.mark_non_differentiable(output[1])


def _rms_backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    weight_offset, cast = ctx.meta
    need_dw = weight is not None and ctx.needs_input_grad[1]
    dx, dw, _ = torch.ops.kerneltriage.norm_backward(
        dy, x, weight, None, rstd, None, weight_offset, cast, need_dw, False
    )
    return dx, _grad_or_none(dw, need_dw), None, None, None


rms_norm_op.register_autograd(_rms_backward, setup_context=_rms_setup)


def _ln_setup(ctx, inputs, output):
    x, weight, bias, _ = inputs
    ctx.save_for_backward(x, weight, output[1], output[2])
    ctx.has_bias = bias is not None
    ctx.mark_non_differentiable(output[1], output[2])


def _ln_backward(ctx, dy, _dmean, _drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    need_dw = weight is not None and ctx.needs_input_grad[1]
    need_db = ctx.has_bias and ctx.needs_input_grad[2]
    dx, dw, db = torch.ops.kerneltriage.norm_backward(
        dy, x, weight, mean, rstd, None, 0.0, False, need_dw, need_db
    )
    return dx, _grad_or_none(dw, need_dw), _grad_or_none(db, need_db), None


layer_norm_op.register_autograd(_ln_backward, setup_context=_ln_setup)


def _add_setup(ctx, inputs, output):
    _, _, weight, _, weight_offset, cast = inputs
    # Backward needs x + residual, which new_residual already holds.
    ctx.save_for_backward(output[1], weight, output[2])
    ctx.meta = (weight_offset, cast)
    ctx.mark_non_differentiable(output[2])


def _add_backward(ctx, dy, dnew_residual, _drstd):
    h, weight, rstd = ctx.saved_tensors
    weight_offset, cast = ctx.meta
    need_dw = weight is not None and ctx.needs_input_grad[2]
    dh, dw, _ = torch.ops.kerneltriage.norm_backward(
        dy, h, weight, None, rstd, dnew_residual, weight_offset, cast, need_dw, False
    )
    return dh, dh, _grad_or_none(dw, need_dw), None, None, None


fused_add_rms_norm_op.register_autograd(_add_backward, setup_context=_add_setup)
