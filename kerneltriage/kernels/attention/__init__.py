"""Flash attention in Triton: forward and backward, causal, GQA/MQA, sliding window, softcap.

Layout is SDPA's, ``(batch, heads, seq, head_dim)``; ``k``/``v`` may have fewer heads than
``q`` (GQA/MQA: q head ``h`` reads kv head ``h // group``). Causal masks and windows are
aligned bottom-right as in FlashAttention: with ``off = Sk - Sq``, query row ``i`` sees key
``j`` when ``i + off - left <= j <= i + off + right`` (causal: ``right = 0``). A query row that
sees no key gets output 0 and LSE ``-inf``.

Forward (FlashAttention-2): one program per (q block of BLOCK_M rows, batch·head). Q stays
on chip; K/V blocks of BLOCK_N rows stream through an online softmax in base 2::

    s = (q·kᵀ)·scale·log2(e)              (softcap: s = c·log2(e)·tanh(q·kᵀ·scale/c))
    m' = max(m, rowmax(s));  p = 2^(s - m');  l = l·2^(m - m') + rowsum(p)
    acc = acc·2^(m - m') + p·v;           out = acc / l;  lse = (m + log2 l)·ln 2

With a softcap the logits are bounded by ``|s| <= c·log2(e)``, so for bf16 (fp32 exponent
range) and ``c <= 50`` the running max is dropped: ``p = 2^s`` needs no rescaling at all.
Each program visits only the KV blocks its rows can see (causal/window loop bounds), in up
to three stages of one inner loop: masked blocks below the band, unmasked blocks, masked
blocks above it; only the boundary blocks pay for the mask, and no block that every row
masks out is visited (a sliding window costs its band, not the causal triangle).

Backward (FlashAttention-2, no atomics): a preprocess kernel computes
``delta = rowsum(dO·O)``; the dK/dV kernel holds one KV block and iterates over the q blocks
that see it, for every q head of its GQA group (so group gradients are summed on chip); the
dQ kernel holds one q block and iterates over the KV blocks it sees. With
``p = exp(s - lse)``: ``dV += pᵀ·dO``, ``dp = dO·vᵀ``, ``ds = p·(dp - delta)``
(softcap: ``ds·(1 - t²)`` with ``t = tanh``), ``dK += dsᵀ·q·scale``, ``dQ += ds·k·scale``.

Cost (dense, per batch·head, S = Sq = Sk, D = head_dim, 2-byte inputs): the forward does
4·S²·D FLOP and must move Q, K, V in and O out, 8·S·D bytes: S/2 FLOP per byte (2048 at
S = 4096), far above an H100/H200's ~200-300 FLOP/byte ridge, so it is compute bound; causal
halves the FLOPs. The backward counts as 2.5× the forward (5 matmuls); this two-kernel scheme
recomputes q·kᵀ and dO·vᵀ in both kernels, so it executes 7 matmuls (3.5× the forward) and
moves Q, K, V, O, dO in and dQ, dK, dV out (16·S·D bytes).

Tiles are loaded with masked pointer loads (cp.async pipelines, wgmma on Hopper). Each kernel
also has a tensor-descriptor (TMA) path, with descriptors made per program for one head so
that ragged sequence ends are zero-filled by the copy engine; on an H200 it measured within
±5% of the pointer path, so it is opt-in (KERNELTRIAGE_ATTN_TMA=on, or
``config.override(attention_tma="on")``). Measured rates against SDPA and FlexAttention:
kerneltriage/data/attention_perf.yaml.

Layout, by role:
    triton_kernels.py  the @triton.jit kernels; each calls its inner loop once per stage
                       (1: masked tiles before the band, 2: unmasked, 3: masked after it)
    launch.py          input checks, tile candidates, cached launch plans, flash_fwd / flash_bwd
    autograd.py        the eager autograd.Function and the kerneltriage:: custom ops
                       (register_fake, register_autograd) that torch.compile sees
    functional.py      flash_attention
    reference.py       pure-torch reference (tests and benchmarks)
"""

from __future__ import annotations

from kerneltriage.kernels.attention.functional import flash_attention

__all__ = ["flash_attention"]
