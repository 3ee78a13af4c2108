"""Fused RMSNorm, LayerNorm and residual-add + RMSNorm (Triton), forward and backward.

A row is the last dim (N elements); there are M rows. Statistics and arithmetic are fp32
whatever the storage dtype (bf16, fp16, fp32).

Forward, one pass over the data: load a row (for the fused add also the residual, and write
new_residual = x + residual in the same pass), then
    RMSNorm:   rstd = 1/sqrt(mean(x²) + eps),                       x̂ = x·rstd
    LayerNorm: mean = mean(x), rstd = 1/sqrt(mean((x−mean)²) + eps), x̂ = (x−mean)·rstd
    y = x̂·w (+ b)
and save only rstd (and mean) per row for backward. Rows longer than one block (or than the
registers allow: the tuning decides) use the looped variant: each row is read in chunks twice,
for the statistics and then for the output, the second pass in reverse chunk order on a
persistent grid that keeps few rows in flight, so that it re-reads from L2, not HBM.

Backward, with x̂ rebuilt from x and the saved statistics, and g = w·dy:
    RMSNorm:   dx = rstd·(g − x̂·c1),        c1 = mean(x̂·g)
    LayerNorm: dx = rstd·(g − x̂·c1 − c2),   c2 = mean(g)
    fused add: dx = dresidual = dnew_residual + (RMSNorm dx of dnormed, at x + residual)
    dw = Σ_rows dy·x̂,  db = Σ_rows dy
Rows up to 16384 elements: a persistent grid (about k programs per SM) in which each program
computes dx row block by row block (single block, or looped in two passes over L2) and sums its
rows' dw/db in fp32 into one partial row; a second small kernel sums the partial rows: no
atomics. Longer rows: c1 (and c2) must see the whole row before any dx, and a row no longer fits
on chip, so a first kernel computes c1/c2 per row and a second, tiled over (column block, row
group), computes dx and the dw/db partials from them: 5·M·N·s bytes instead of 3, but streamed
at full bandwidth, where a row-major pass thrashes L2 with its re-reads and partials.

Cost (s = bytes per element): forward moves 2·M·N·s bytes (fused add 4·M·N·s), backward 3·M·N·s
(fused add 4·M·N·s; long rows 2·M·N·s more), plus the weights and O(M) statistics; 5-10 FLOPs
per element, so all of these kernels are memory-bound (an H200 does ~67 fp32 TFLOP/s against
~4.8 TB/s).

On a GPU the block shape, warps and grid size are autotuned per N (and per op and dtype) on
first use; under Triton's interpreter (CPU tests) one fixed configuration is used instead.
Either way the choice is kept in a launch plan per (kernel, N, dtypes, flags, device), so
later calls skip the autotuner.

Hugging Face variants, same kernels: ``weight_offset`` scales by ``offset + w`` (Gemma: 1,
in fp32 before the one cast), ``cast_before_weight`` rounds x̂ to the input dtype before the
weight multiplies it (Llama, Qwen2/3, Mistral: ``weight * hidden.to(input_dtype)``).

Layout, by role:
    triton_kernels.py  the @triton.jit kernels (device code)
    launch.py          input checks, tile candidates, cached launch plans, norm_fwd / norm_bwd
    fast.py            launches bound to an input signature: a repeated eager call's host path,
                       in Python, and in C++ once ../native.py has built csrc/norm_node.cpp
    autograd.py        the eager autograd.Function and the kerneltriage:: custom ops
                       (register_fake, register_autograd) that torch.compile sees
    functional.py      rms_norm, layer_norm, fused_add_rms_norm
    modules.py         RMSNorm, LayerNorm, FusedAddRMSNorm; LlamaRMSNorm, GemmaRMSNorm, Olmo2RMSNorm
    reference.py       pure-torch references (tests and benchmarks)
"""

from __future__ import annotations

from kerneltriage.kernels.norms.functional import fused_add_rms_norm, layer_norm, rms_norm
from kerneltriage.kernels.norms.modules import (
    FusedAddRMSNorm,
    GemmaRMSNorm,
    LayerNorm,
    LlamaRMSNorm,
    Olmo2RMSNorm,
    RMSNorm,
)

__all__ = [
    "FusedAddRMSNorm",
    "GemmaRMSNorm",
    "LayerNorm",
    "LlamaRMSNorm",
    "Olmo2RMSNorm",
    "RMSNorm",
    "fused_add_rms_norm",
    "layer_norm",
    "rms_norm",
]
