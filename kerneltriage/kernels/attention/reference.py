"""Pure-torch reference for ``attention.flash_attention`` (the math path).

Materialises the (Sq, Sk) score matrix, so it is for tests and small benchmarks only. It
computes in any dtype: float64 for ground truth, or the inputs' own bf16/fp16 to reproduce
PyTorch's same-dtype math path, whose error is the yardstick the kernel's error is held to.
Semantics match the kernel: causal and window aligned bottom-right, GQA by head groups,
Gemma-2 softcap, rows that see no key give output 0 and LSE -inf.
"""

from __future__ import annotations

import math

import torch


def visible_mask(
    sq: int,
    sk: int,
    causal: bool = False,
    window: tuple[int | None, int | None] | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Bool (sq, sk): True where query row i may attend key j.

    Row i sees key j when ``i + off - left <= j <= i + off + right`` with ``off = sk - sq``;
    a window side of -1/None is unbounded and ``causal`` caps ``right`` at 0.
    """
    left, right = (None, None) if window is None else window
    left = None if left is None or left < 0 else left
    right = None if right is None or right < 0 else right
    if causal:
        right = 0 if right is None else min(right, 0)
    i = torch.arange(sq, device=device)[:, None]
    j = torch.arange(sk, device=device)[None, :]
    rel = j - i - (sk - sq)
    mask = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right is not None:
        mask &= rel <= right
    if left is not None:
        mask &= rel >= -left
    return mask


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
    window: tuple[int | None, int | None] | None = None,
    softcap: float | None = None,
    *,
    compute_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(out, lse)``: out (B, H, Sq, D) in ``compute_dtype``, lse (B, H, Sq) natural log.

    ``compute_dtype`` defaults to q's dtype; autograd flows through to q, k and v (GQA
    gradients sum over the group through ``repeat_interleave``).
    """
    dtype = compute_dtype or q.dtype
    _, n_heads, Sq, D = q.shape
    n_kv_heads, Sk = k.shape[1], k.shape[2]
    qc, kc, vc = q.to(dtype), k.to(dtype), v.to(dtype)
    if n_kv_heads != n_heads:
        kc = kc.repeat_interleave(n_heads // n_kv_heads, dim=1)
        vc = vc.repeat_interleave(n_heads // n_kv_heads, dim=1)
    scale = 1.0 / math.sqrt(D) if sm_scale is None else sm_scale
    s = torch.matmul(qc, kc.transpose(-1, -2)) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    mask = visible_mask(Sq, Sk, causal, window, device=q.device)
    empty = ~mask.any(dim=-1)  # rows with no key: kept finite here, zeroed below
    s = s.masked_fill(~mask, float("-inf")).masked_fill(empty[:, None], 0.0)
    p = torch.softmax(s, dim=-1).masked_fill(empty[:, None], 0.0)
    out = torch.matmul(p, vc)
    lse = torch.logsumexp(s.float() if dtype != torch.float64 else s, dim=-1)
    lse = lse.masked_fill(empty, float("-inf"))
    return out, lse
