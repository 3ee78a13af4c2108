"""``flash_attention``: the public function (checks, then the eager autograd.Function, or the
custom op while ``torch.compile`` traces)."""

from __future__ import annotations

import torch

from kerneltriage.kernels.attention.autograd import FlashAttentionFunction
from kerneltriage.kernels.attention.launch import check_options, check_tensors, make_params


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    softcap: float | None = None,
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Fused attention with SDPA's layout; differentiable in q, k and v.

    Args:
        q: (B, H, Sq, D) fp16 or bf16; D a multiple of 16 up to 256 (tuned for 64 and 128).
        k, v: (B, Hkv, Sk, D), Hkv dividing H (GQA/MQA; gradients are summed over the group).
        causal: mask aligned bottom-right (row i sees keys j <= i + Sk - Sq), as FlashAttention.
        sm_scale: logit scale, default 1/sqrt(D).
        window: (left, right) sliding window, same alignment: row i sees keys
            i + Sk - Sq - left <= j <= i + Sk - Sq + right; -1 or None leaves a side open.
            With ``causal`` the right side is capped at 0.
        softcap: Gemma-2 logit soft-capping, scores become softcap·tanh(scores/softcap).
        return_lse: also return the natural-log logsumexp of the scaled logits, (B, H, Sq)
            fp32 (not differentiable). Rows that see no key get output 0 and LSE -inf.

    ``flash_attention(q, k, v, causal=True)`` is a drop-in for
    ``F.scaled_dot_product_attention(q, k, v, is_causal=True)``, backward included, when
    Sq == Sk (for Sq != Sk SDPA aligns its causal mask top-left, this function bottom-right).
    To swap it into a model, replace that call in the attention module's forward::

        from kerneltriage.kernels import flash_attention

        # y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = flash_attention(q, k, v, causal=True)  # q, k, v: (B, H, S, D) bf16/fp16 on CUDA

    Out-of-spec input raises ``KernelInputError``.
    """
    check_tensors(q, k, v)
    scale, left, right, cap = check_options(causal, sm_scale, window, softcap)
    if torch.compiler.is_compiling():
        o, lse = torch.ops.kerneltriage.flash_attention(q, k, v, bool(causal), scale, left, right, cap)
    else:
        o, lse = FlashAttentionFunction.apply(q, k, v, make_params(q, k, causal, scale, left, right, cap))
    return (o, lse) if return_lse else o
