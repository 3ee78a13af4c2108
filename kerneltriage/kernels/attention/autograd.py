"""Autograd for flash attention, two ways over the same host functions (``launch.flash_fwd`` /
``flash_bwd``), as for the norms:

- ``FlashAttentionFunction`` (``torch.autograd.Function``): the eager path, the cheapest per call.
- Custom ops that ``torch.compile`` sees as one node (``register_fake``, ``register_autograd``)::

      kerneltriage::flash_attention(q, k, v, causal, sm_scale?, win_left, win_right,
                                    softcap?) -> (out, lse)
      kerneltriage::flash_attention_backward(do, q, k, v, out, lse, causal, sm_scale?,
                                             win_left, win_right, softcap?) -> (dq, dk, dv)

  ``sm_scale`` None means 1/sqrt(head_dim), taken inside the op so that a symbolic head dim
  never reaches a float argument; window sides are already resolved (``launch.UNBOUNDED``
  for an open side, causal folded into the right side). ``lse`` is not differentiable.
"""

from __future__ import annotations

import torch
from torch.library import custom_op

from kerneltriage.kernels.attention.launch import (
    Params,
    flash_bwd,
    flash_fwd,
    lastdim_contiguous,
    make_params,
)


class FlashAttentionFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, params: Params):
        q, k, v = (lastdim_contiguous(t) for t in (q, k, v))
        o, lse = flash_fwd(q, k, v, params)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.params = params
        ctx.mark_non_differentiable(lse)
        ctx.set_materialize_grads(False)  # no zeros tensor for the lse's (never used) gradient
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        if do is None:
            return None, None, None, None
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_bwd(lastdim_contiguous(do), q, k, v, o, lse, ctx.params)
        return dq, dk, dv, None


@custom_op("kerneltriage::flash_attention", mutates_args=())
def flash_attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool,
    sm_scale: float | None,
    win_left: int,
    win_right: int,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = (lastdim_contiguous(t) for t in (q, k, v))
    return flash_fwd(q, k, v, make_params(q, k, causal, sm_scale, win_left, win_right, softcap))


@flash_attention_op.register_fake
def _(q, k, v, causal, sm_scale, win_left, win_right, softcap):
    B, H, Sq, D = q.shape
    out = torch.empty((B, H, Sq, D), dtype=q.dtype, device=q.device)
    return out, torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)


@custom_op("kerneltriage::flash_attention_backward", mutates_args=())
def flash_attention_backward_op(
    do: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: bool,
    sm_scale: float | None,
    win_left: int,
    win_right: int,
    softcap: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v, out, do = (lastdim_contiguous(t) for t in (q, k, v, out, do))
    return flash_bwd(do, q, k, v, out, lse, make_params(q, k, causal, sm_scale, win_left, win_right, softcap))


@flash_attention_backward_op.register_fake
def _(do, q, k, v, out, lse, causal, sm_scale, win_left, win_right, softcap):
    def like(t):
        return torch.empty(t.shape, dtype=t.dtype, device=t.device)

    return like(q), like(k), like(v)


def _setup(ctx, inputs, output):
    q, k, v, *options = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.options = options
    ctx.mark_non_differentiable(output[1])


def _backward(ctx, do, _dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.kerneltriage.flash_attention_backward(do, q, k, v, out, lse, *ctx.options)
    return dq, dk, dv, None, None, None, None, None


flash_attention_op.register_autograd(_backward, setup_context=_setup)
