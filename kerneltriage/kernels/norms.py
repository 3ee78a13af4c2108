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
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch import nn

from kerneltriage.errors import KernelInputError
from kerneltriage.kernels._common import check_device, check_dtype, interpreter_mode

__all__ = [
    "FusedAddRMSNorm",
    "LayerNorm",
    "RMSNorm",
    "fused_add_rms_norm",
    "layer_norm",
    "rms_norm",
]

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


# --------------------------------------------------------------------------------------------
# Kernels (unformatted: arguments grouped by role, as Triton kernels are usually written).
# Eviction hints: data read once is "evict_first", data read again soon (the weights, the
# first pass of a looped row) is "evict_last".
# --------------------------------------------------------------------------------------------
# fmt: off


@triton.jit
def _load_x(X, R, H, rows, cols, mask, stride_x, stride_r, stride_h,
            HAS_RES: tl.constexpr, STORE_H: tl.constexpr, EVICT: tl.constexpr):
    """Load a [rows, cols] tile of x as fp32; with a residual, x + residual rounded to the
    storage dtype (so that the norm sees exactly what new_residual holds), stored if STORE_H."""
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                eviction_policy=EVICT).to(tl.float32)
    if HAS_RES:
        r = tl.load(R + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0,
                    eviction_policy=EVICT)
        h = (x + r.to(tl.float32)).to(H.dtype.element_ty)
        if STORE_H:
            tl.store(H + rows[:, None] * stride_h + cols[None, :], h, mask=mask)
        x = h.to(tl.float32)
    return x


@triton.jit
def _scale_shift(y, W, B, cols, col_mask, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    if HAS_W:
        w = tl.load(W + cols, mask=col_mask, other=0.0, eviction_policy="evict_last")
        y = y * w.to(tl.float32)[None, :]
    if HAS_B:
        b = tl.load(B + cols, mask=col_mask, other=0.0, eviction_policy="evict_last")
        y = y + b.to(tl.float32)[None, :]
    return y


@triton.jit
def _fwd_rows_single(X, R, W, B, Y, H, MEAN, RSTD, rows, row_mask, N,
                     stride_x, stride_r, stride_y, stride_h, eps,
                     IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr,
                     HAS_B: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows that fit in one block: one read of x (and of the residual), one write of y."""
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    x = _load_x(X, R, H, rows, cols, mask, stride_x, stride_r, stride_h, HAS_RES, True,
                "evict_first")
    if IS_RMS:
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
        xhat = x * rstd[:, None]
    else:
        mean = tl.sum(x, axis=1) / N
        xc = tl.where(mask, x - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
        xhat = xc * rstd[:, None]
        tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)
    y = _scale_shift(xhat, W, B, cols, col_mask, HAS_W, HAS_B)
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _fwd_rows_looped(X, R, W, B, Y, H, MEAN, RSTD, rows, row_mask, N,
                     stride_x, stride_r, stride_y, stride_h, eps,
                     IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr,
                     HAS_B: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Rows longer than a block: statistics over the chunks, then the output over them again."""
    cols = tl.arange(0, BLOCK_N)
    # Pass 1: statistics, chunk by chunk (new_residual is written here).
    if IS_RMS:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        off = 0
        while off < N:
            c = off + cols
            mask = row_mask[:, None] & (c < N)[None, :]
            x = _load_x(X, R, H, rows, c, mask, stride_x, stride_r, stride_h, HAS_RES, True,
                        "evict_last")
            acc += x * x
            off += BLOCK_N
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)
    else:
        # Sums shifted by the first chunk's mean: E[(x−s)²] − E[x−s]² loses nothing to
        # cancellation when s is already close to the mean, unlike E[x²] − E[x]².
        mask = row_mask[:, None] & (cols < N)[None, :]
        x = _load_x(X, R, H, rows, cols, mask, stride_x, stride_r, stride_h, HAS_RES, True,
                    "evict_last")
        shift = tl.sum(x, axis=1) / tl.minimum(N, BLOCK_N)
        d = tl.where(mask, x - shift[:, None], 0.0)
        s1 = d
        s2 = d * d
        off = BLOCK_N
        while off < N:
            c = off + cols
            mask = row_mask[:, None] & (c < N)[None, :]
            x = _load_x(X, R, H, rows, c, mask, stride_x, stride_r, stride_h, HAS_RES, True,
                        "evict_last")
            d = tl.where(mask, x - shift[:, None], 0.0)
            s1 += d
            s2 += d * d
            off += BLOCK_N
        m1 = tl.sum(s1, axis=1) / N
        var = tl.maximum(tl.sum(s2, axis=1) / N - m1 * m1, 0.0)
        mean = shift + m1
        rstd = tl.rsqrt(var + eps)
        tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)
    # Pass 2: output, last chunk first (the most recently read chunks are still in L2).
    off = (tl.cdiv(N, BLOCK_N) - 1) * BLOCK_N
    while off >= 0:
        c = off + cols
        col_mask = c < N
        mask = row_mask[:, None] & col_mask[None, :]
        x = _load_x(X, R, H, rows, c, mask, stride_x, stride_r, stride_h, HAS_RES, False,
                    "evict_first")
        y = x * rstd[:, None] if IS_RMS else (x - mean[:, None]) * rstd[:, None]
        y = _scale_shift(y, W, B, c, col_mask, HAS_W, HAS_B)
        tl.store(Y + rows[:, None] * stride_y + c[None, :], y.to(Y.dtype.element_ty), mask=mask)
        off -= BLOCK_N


@triton.jit
def _norm_fwd_kernel(
    X, R, W, B, Y, H, MEAN, RSTD,
    M, N, stride_x, stride_r, stride_y, stride_h, eps,
    IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOPED: tl.constexpr,
    PROGS_PER_SM: tl.constexpr,
):
    """Program p normalizes row blocks p, p + P, ... (P = grid size: one program per row block,
    or a persistent grid of PROGS_PER_SM per SM, which bounds how many long rows are in flight
    so that the looped variant's second pass hits L2). R and H (residual in, new_residual out)
    are used only if HAS_RES; PROGS_PER_SM is read by the launch grid."""
    start = tl.program_id(0).to(tl.int64) * BLOCK_M
    step = tl.num_programs(0) * BLOCK_M
    while start < M:
        rows = start + tl.arange(0, BLOCK_M)
        row_mask = rows < M
        if LOOPED:
            _fwd_rows_looped(X, R, W, B, Y, H, MEAN, RSTD, rows, row_mask, N,
                             stride_x, stride_r, stride_y, stride_h, eps,
                             IS_RMS, HAS_RES, HAS_W, HAS_B, BLOCK_M, BLOCK_N)
        else:
            _fwd_rows_single(X, R, W, B, Y, H, MEAN, RSTD, rows, row_mask, N,
                             stride_x, stride_r, stride_y, stride_h, eps,
                             IS_RMS, HAS_RES, HAS_W, HAS_B, BLOCK_N)
        start += step


@triton.jit
def _bwd_tile(DY, X, W, rows, cols, mask, col_mask, mean, rstd, stride_dy, stride_x,
              IS_RMS: tl.constexpr, HAS_W: tl.constexpr, EVICT: tl.constexpr):
    """Load dy and x for a tile; return (dy, x̂, g = w·dy) in fp32."""
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0,
                 eviction_policy=EVICT).to(tl.float32)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                eviction_policy=EVICT).to(tl.float32)
    xhat = x * rstd[:, None] if IS_RMS else tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
    g = _scale_shift(dy, W, W, cols, col_mask, HAS_W, False)
    return dy, xhat, g


@triton.jit
def _store_dx(DX, DRES, rows, cols, mask, g, xhat, c1, c2, rstd, stride_dx, stride_dres,
              IS_RMS: tl.constexpr, HAS_DRES: tl.constexpr):
    """dx = rstd·(g − x̂·c1 (− c2)) (+ dnew_residual), stored in DX's dtype."""
    if IS_RMS:
        dx = (g - xhat * c1[:, None]) * rstd[:, None]
    else:
        dx = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
    if HAS_DRES:
        dres = tl.load(DRES + rows[:, None] * stride_dres + cols[None, :], mask=mask, other=0.0,
                       eviction_policy="evict_first")
        dx += dres.to(tl.float32)
    tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _norm_bwd_kernel(
    DY, X, W, MEAN, RSTD, DRES, DX, DW_PART, DB_PART, NPROG,
    M, N, stride_dy, stride_x, stride_dres, stride_dx,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_DRES: tl.constexpr,
    HAS_DW: tl.constexpr, HAS_DB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOPED: tl.constexpr,
    PROGS_PER_SM: tl.constexpr,
):
    """Rows up to 16384. Persistent: program p handles row blocks p, p + P, ... (P = grid size)
    and writes its dw/db partial to row p of DW_PART/DB_PART. PROGS_PER_SM is read by the
    launch grid."""
    pid = tl.program_id(0).to(tl.int64)
    nprog = tl.num_programs(0)
    if pid == 0:
        # The partial-sum kernel reads how many partial rows exist from here, whatever grid
        # the autotuner picked.
        tl.store(NPROG, nprog)
    cols = tl.arange(0, BLOCK_N)
    first = pid * BLOCK_M

    if not LOOPED:
        col_mask = cols < N
        dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        db_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        start = first
        while start < M:
            rows = start + tl.arange(0, BLOCK_M)
            row_mask = rows < M
            mask = row_mask[:, None] & col_mask[None, :]
            rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
            mean = rstd if IS_RMS else tl.load(MEAN + rows, mask=row_mask, other=0.0)  # RMS: unused
            dy, xhat, g = _bwd_tile(DY, X, W, rows, cols, mask, col_mask, mean, rstd,
                                    stride_dy, stride_x, IS_RMS, HAS_W, "evict_first")
            c1 = tl.sum(xhat * g, axis=1) / N
            c2 = c1 if IS_RMS else tl.sum(g, axis=1) / N  # RMS: unused
            _store_dx(DX, DRES, rows, cols, mask, g, xhat, c1, c2, rstd, stride_dx, stride_dres,
                      IS_RMS, HAS_DRES)
            if HAS_DW:
                dw_acc += dy * xhat
            if HAS_DB:
                db_acc += dy
            start += nprog * BLOCK_M
        if HAS_DW:
            tl.store(DW_PART + pid * N + cols, tl.sum(dw_acc, axis=0), mask=col_mask)
        if HAS_DB:
            tl.store(DB_PART + pid * N + cols, tl.sum(db_acc, axis=0), mask=col_mask)
    else:
        last = (tl.cdiv(N, BLOCK_N) - 1) * BLOCK_N
        start = first
        while start < M:
            rows = start + tl.arange(0, BLOCK_M)
            row_mask = rows < M
            rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
            mean = rstd if IS_RMS else tl.load(MEAN + rows, mask=row_mask, other=0.0)  # RMS: unused
            # Pass 1: the row reductions c1 = mean(x̂·g) (and c2 = mean(g)).
            a1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            a2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            off = 0
            while off < N:
                c = off + cols
                col_mask = c < N
                mask = row_mask[:, None] & col_mask[None, :]
                _, xhat, g = _bwd_tile(DY, X, W, rows, c, mask, col_mask, mean, rstd,
                                       stride_dy, stride_x, IS_RMS, HAS_W, "evict_last")
                a1 += xhat * g
                if not IS_RMS:
                    a2 += g
                off += BLOCK_N
            c1 = tl.sum(a1, axis=1) / N
            c2 = tl.sum(a2, axis=1) / N
            # Pass 2, last chunk first (L2): dx, and this program's dw/db partial, which the
            # program's first row block initializes instead of reading.
            not_first = start != first
            off = last
            while off >= 0:
                c = off + cols
                col_mask = c < N
                mask = row_mask[:, None] & col_mask[None, :]
                dy, xhat, g = _bwd_tile(DY, X, W, rows, c, mask, col_mask, mean, rstd,
                                        stride_dy, stride_x, IS_RMS, HAS_W, "evict_first")
                _store_dx(DX, DRES, rows, c, mask, g, xhat, c1, c2, rstd, stride_dx,
                          stride_dres, IS_RMS, HAS_DRES)
                if HAS_DW:
                    part = DW_PART + pid * N + c
                    acc = tl.load(part, mask=col_mask & not_first, other=0.0)
                    tl.store(part, acc + tl.sum(dy * xhat, axis=0), mask=col_mask)
                if HAS_DB:
                    part = DB_PART + pid * N + c
                    acc = tl.load(part, mask=col_mask & not_first, other=0.0)
                    tl.store(part, acc + tl.sum(dy, axis=0), mask=col_mask)
                off -= BLOCK_N
            start += nprog * BLOCK_M


@triton.jit
def _bwd_row_dots_kernel(
    DY, X, W, MEAN, RSTD, C, M, N, stride_dy, stride_x,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """Long rows, first kernel: one program per row writes c1 = mean(x̂·g) to C[0, row] and,
    for LayerNorm, c2 = mean(g) to C[1, row]."""
    rows = tl.program_id(0).to(tl.int64) + tl.arange(0, 1)
    row_mask = rows < M
    rstd = tl.load(RSTD + rows)
    mean = rstd if IS_RMS else tl.load(MEAN + rows)  # RMS: unused
    cols = tl.arange(0, BLOCK_N)
    a1 = tl.zeros([1, BLOCK_N], dtype=tl.float32)
    a2 = tl.zeros([1, BLOCK_N], dtype=tl.float32)
    off = 0
    while off < N:
        c = off + cols
        col_mask = c < N
        mask = row_mask[:, None] & col_mask[None, :]
        _, xhat, g = _bwd_tile(DY, X, W, rows, c, mask, col_mask, mean, rstd,
                               stride_dy, stride_x, IS_RMS, HAS_W, "evict_first")
        a1 += xhat * g
        if not IS_RMS:
            a2 += g
        off += BLOCK_N
    tl.store(C + rows, tl.sum(a1, axis=1) / N)
    if not IS_RMS:
        tl.store(C + M + rows, tl.sum(a2, axis=1) / N)


@triton.jit
def _bwd_split_kernel(
    DY, X, W, MEAN, RSTD, C, DRES, DX, DW_PART, DB_PART, NPROG,
    M, N, stride_dy, stride_x, stride_dres, stride_dx,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_DRES: tl.constexpr,
    HAS_DW: tl.constexpr, HAS_DB: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PROGS_PER_SM: tl.constexpr,
):
    """Long rows, second kernel: program (j, g) owns column block j and row blocks g, g + G, ...
    (G = grid dim 1): dx from the row constants in C, and a dw/db partial over those rows,
    summed in registers and written to row g of DW_PART/DB_PART."""
    pid_n = tl.program_id(0)
    pid_g = tl.program_id(1).to(tl.int64)
    groups = tl.num_programs(1)
    if (pid_n == 0) & (pid_g == 0):
        tl.store(NPROG, groups)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    dw_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    db_acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    start = pid_g * BLOCK_M
    while start < M:
        rows = start + tl.arange(0, BLOCK_M)
        row_mask = rows < M
        mask = row_mask[:, None] & col_mask[None, :]
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        mean = rstd if IS_RMS else tl.load(MEAN + rows, mask=row_mask, other=0.0)  # RMS: unused
        c1 = tl.load(C + rows, mask=row_mask, other=0.0)
        c2 = c1 if IS_RMS else tl.load(C + M + rows, mask=row_mask, other=0.0)  # RMS: unused
        dy, xhat, g = _bwd_tile(DY, X, W, rows, cols, mask, col_mask, mean, rstd,
                                stride_dy, stride_x, IS_RMS, HAS_W, "evict_first")
        _store_dx(DX, DRES, rows, cols, mask, g, xhat, c1, c2, rstd, stride_dx, stride_dres,
                  IS_RMS, HAS_DRES)
        if HAS_DW:
            dw_acc += dy * xhat
        if HAS_DB:
            db_acc += dy
        start += groups * BLOCK_M
    if HAS_DW:
        tl.store(DW_PART + pid_g * N + cols, tl.sum(dw_acc, axis=0), mask=col_mask)
    if HAS_DB:
        tl.store(DB_PART + pid_g * N + cols, tl.sum(db_acc, axis=0), mask=col_mask)


@triton.jit
def _sum_partials_kernel(
    DW_PART, DB_PART, NPROG, DW, DB, N,
    HAS_DW: tl.constexpr, HAS_DB: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """dw[n] = Σ_p DW_PART[p, n] over the NPROG partial rows (and db likewise), fp32."""
    cols = tl.program_id(0).to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < N
    nrows = tl.load(NPROG)
    acc_w = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    acc_b = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    p0 = 0
    while p0 < nrows:
        p = p0 + tl.arange(0, BLOCK_P)
        mask = (p < nrows)[:, None] & col_mask[None, :]
        offs = p.to(tl.int64)[:, None] * N + cols[None, :]
        if HAS_DW:
            acc_w += tl.load(DW_PART + offs, mask=mask, other=0.0, eviction_policy="evict_first")
        if HAS_DB:
            acc_b += tl.load(DB_PART + offs, mask=mask, other=0.0, eviction_policy="evict_first")
        p0 += BLOCK_P
    if HAS_DW:
        tl.store(DW + cols, tl.sum(acc_w, axis=0).to(DW.dtype.element_ty), mask=col_mask)
    if HAS_DB:
        tl.store(DB + cols, tl.sum(acc_b, axis=0).to(DB.dtype.element_ty), mask=col_mask)


# fmt: on


# --------------------------------------------------------------------------------------------
# Launch configurations
# --------------------------------------------------------------------------------------------

# Test hooks. _CONFIG_OVERRIDE maps a kernel kind ("fwd", "bwd", "bwd_dots", "bwd_split") to a
# forced triton.Config, on GPU and in the interpreter alike (e.g. the looped variant on a short
# row); _SPLIT_BWD_ABOVE is the row length above which backward takes the two-kernel path;
# _POISON_WORKSPACES fills internal buffers (statistics, partials) with NaN so that unwritten
# entries show.
_CONFIG_OVERRIDE: dict[str, triton.Config] = {}
_SPLIT_BWD_ABOVE = 16384
_POISON_WORKSPACES = False

# Longest row kept in registers in one block in forward; beyond it only the looped variant.
_MAX_SINGLE_BLOCK = 32768


def _cfg(num_warps: int, **kwargs: int) -> triton.Config:
    return triton.Config(kwargs, num_warps=num_warps, num_stages=1)


def _row(num_warps: int, block_m: int, block_n: int, looped: bool, pps: int) -> triton.Config:
    """A config of the row-wise kernels; pps (programs per SM) 0 = one program per row block."""
    return _cfg(num_warps, BLOCK_M=block_m, BLOCK_N=block_n, LOOPED=looped, PROGS_PER_SM=pps)


# Candidates per row length, each checked with ptxas for sm_90 (registers, spills), and tried by
# the autotuner on the first call per (N, op, dtype). Persistent grids are sized so that their
# programs are resident at once.


@functools.cache
def _fwd_candidates(N: int) -> list[triton.Config]:
    """Rows in one block up to 16384 (32768 with 32 warps); the looped variant runs a persistent
    grid, so that only a few long rows per SM are in flight and their second read hits L2."""
    n = triton.next_power_of_2(N)
    if n <= 1024:
        bm = 1024 // n
        return [_row(4, 2 * bm, n, False, 0), _row(4, 4 * bm, n, False, 0), _row(8, 8 * bm, n, False, 0)]
    if n <= 4096:
        return [_row(4, 1, n, False, 0), _row(8, 1, n, False, 0), _row(8, 8192 // n, n, False, 0)]
    if n <= 8192:
        return [_row(4, 1, n, False, 0), _row(8, 1, n, False, 0), _row(16, 2, n, False, 0)]
    looped = [
        _row(16, 1, 8192, True, 2),
        _row(8, 1, 4096, True, 4),
        _row(16, 1, 16384, True, 1),
        _row(8, 1, 8192, True, 3),
    ]
    if n <= 16384:
        return [_row(8, 1, n, False, 0), _row(16, 1, n, False, 0), *looped[:2]]
    if n <= _MAX_SINGLE_BLOCK:
        return [_row(32, 1, n, False, 0), *looped[:2]]
    return looped


@functools.cache
def _bwd_candidates(N: int) -> list[triton.Config]:
    """Fewer elements per thread than forward: dy, x, w and the dw/db accumulators are live
    together. The tuning also times the partial-sum kernel, so that more programs pay for their
    extra partial rows."""
    n = triton.next_power_of_2(N)
    if n <= 1024:
        bm = 1024 // n
        return [
            _row(4, 2 * bm, n, False, 4),
            _row(4, 2 * bm, n, False, 2),
            _row(8, 4 * bm, n, False, 2),
            _row(8, 8 * bm, n, False, 1),
        ]
    if n <= 4096:
        return [
            _row(8, 1, n, False, 3),
            _row(16, 1, n, False, 2),
            _row(4, 1, n, False, 2),
            _row(8, 8192 // n, n, False, 1),
        ]
    if n <= 8192:
        return [_row(16, 1, n, False, 1), _row(8, 1, 4096, True, 2), _row(4, 1, 2048, True, 4)]
    # 16384: one block spills a little (dy, x and dw of 32 elements per thread), looped re-reads.
    return [
        _row(16, 1, n, False, 1),
        _row(32, 1, n, False, 1),
        _row(16, 1, 8192, True, 1),
        _row(8, 1, 4096, True, 2),
    ]


@functools.cache
def _dots_candidates(N: int) -> list[triton.Config]:
    return [_cfg(8, BLOCK_N=4096), _cfg(16, BLOCK_N=8192), _cfg(4, BLOCK_N=2048)]


@functools.cache
def _split_candidates(N: int) -> list[triton.Config]:
    """16 elements per thread per tile; grid dim 1 (row groups) makes ~PROGS_PER_SM programs
    per SM in all, enough loads in flight to stream (more groups only add partial rows)."""
    return [
        _cfg(4, BLOCK_M=2, BLOCK_N=1024, PROGS_PER_SM=8),
        _cfg(4, BLOCK_M=4, BLOCK_N=512, PROGS_PER_SM=8),
        _cfg(8, BLOCK_M=4, BLOCK_N=1024, PROGS_PER_SM=4),
        _cfg(8, BLOCK_M=2, BLOCK_N=2048, PROGS_PER_SM=8),
    ]


_CANDIDATES = {
    "fwd": _fwd_candidates,
    "bwd": _bwd_candidates,
    "bwd_dots": _dots_candidates,
    "bwd_split": _split_candidates,
}


def _interpreter_config(kind: str, N: int) -> triton.Config:
    """One configuration for Triton's interpreter: few, large programs (it runs them one by one);
    backward on a small persistent grid, so that programs loop over several row blocks."""
    n = triton.next_power_of_2(N)
    if kind == "bwd_dots":
        return _cfg(4, BLOCK_N=min(n, 16384))
    if kind == "bwd_split":
        return _cfg(4, BLOCK_M=4, BLOCK_N=min(n, 4096), PROGS_PER_SM=4)
    pps = 1 if kind == "bwd" else 0
    if n > 16384:
        return _row(4, 1, 16384, True, pps)
    return _row(4, 65536 // n, n, False, pps)


def _fixed_config(kind: str, N: int) -> triton.Config | None:
    """A forced or interpreter configuration, or None: autotune (GPU)."""
    if kind in _CONFIG_OVERRIDE:
        return _CONFIG_OVERRIDE[kind]
    if interpreter_mode():
        return _interpreter_config(kind, N)
    return None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)  # triton.cdiv is a jit function: slow to call from the host


def _grid_size(M: int, meta: dict, num_sms: int) -> int:
    blocks = _cdiv(M, meta["BLOCK_M"])
    pps = meta["PROGS_PER_SM"]
    return blocks if pps == 0 else min(blocks, num_sms * pps)


def _split_grid(M: int, N: int, meta: dict, num_sms: int) -> tuple[int, int]:
    col_blocks = _cdiv(N, meta["BLOCK_N"])
    groups = max(1, min(_cdiv(M, meta["BLOCK_M"]), num_sms * meta["PROGS_PER_SM"] // col_blocks))
    return col_blocks, groups


def _sum_partials(dw_part, db_part, nprog, dw, db, N: int) -> None:
    """dw = Σ rows of dw_part (db likewise), over the rows the backward kernel wrote."""
    # GPU: a few thousand partial elements per step (at most 16 per thread), narrow column
    # blocks so that even N = 1024 spreads over 32-64 programs; the partial rows were just
    # written and mostly sit in L2. Interpreter: few, large programs.
    if interpreter_mode():
        block_p, block_n = 32, 4096
    else:
        block_p, block_n = (128, 16 if N <= 1024 else 32) if N <= 4096 else (64, 64)
    _sum_partials_kernel[(_cdiv(N, block_n),)](
        dw_part, db_part, nprog, dw, db, N,
        HAS_DW=dw is not None, HAS_DB=db is not None, BLOCK_P=block_p, BLOCK_N=block_n,
        num_warps=8,
    )  # fmt: skip


def _bwd_tuning_post_hook(nargs: dict, exception) -> None:
    """Runs inside the autotuner's timed call: include the partial-sum kernel, so that a config
    with more programs (more partial rows to sum) pays for them."""
    if exception is None and (nargs["HAS_DW"] or nargs["HAS_DB"]):
        n = nargs["N"]
        scratch = torch.empty(2 * n, dtype=torch.float32, device=nargs["DX"].device)
        dw = scratch[:n] if nargs["HAS_DW"] else None
        db = scratch[n:] if nargs["HAS_DB"] else None
        _sum_partials(nargs["DW_PART"], nargs["DB_PART"], nargs["NPROG"], dw, db, n)


def _autotuned(kernel, kind: str, key: list[str], post_hook=None):
    """The autotuner needs more than one config to tune at all; the real candidates per N come
    from the prune hook. Results are also cached on disk (Triton's cache dir)."""
    candidates = _CANDIDATES[kind]
    placeholder = [triton.Config({}, num_warps=4), triton.Config({}, num_warps=8)]
    return triton.autotune(
        configs=placeholder,
        key=key,
        prune_configs_by={"early_config_prune": lambda configs, nargs, **kw: candidates(nargs["N"])},
        post_hook=post_hook,
        cache_results=True,
    )(kernel)


_BWD_KEY = ["N", "IS_RMS", "HAS_W", "HAS_DRES", "HAS_DW", "HAS_DB"]
_TUNERS = {
    "fwd": _autotuned(_norm_fwd_kernel, "fwd", ["N", "IS_RMS", "HAS_RES", "HAS_W", "HAS_B"]),
    "bwd": _autotuned(_norm_bwd_kernel, "bwd", _BWD_KEY, _bwd_tuning_post_hook),
    "bwd_dots": _autotuned(_bwd_row_dots_kernel, "bwd_dots", ["N", "IS_RMS", "HAS_W"]),
    "bwd_split": _autotuned(_bwd_split_kernel, "bwd_split", _BWD_KEY, _bwd_tuning_post_hook),
}
_KERNELS = {
    "fwd": _norm_fwd_kernel,
    "bwd": _norm_bwd_kernel,
    "bwd_dots": _bwd_row_dots_kernel,
    "bwd_split": _bwd_split_kernel,
}
# (kind, device, N, dtypes, flags) -> launch keyword arguments (flags + config) that the autotuner
# chose; later calls launch the kernel directly, skipping the autotuner's per-call overhead.
_TUNED: dict[tuple, dict] = {}


def _launch(kind: str, grid, args: tuple, flags: dict, key: tuple, N: int) -> None:
    """Launch ``kind`` with its forced/interpreter config, with the config the autotuner chose
    for ``key`` earlier, or autotune now (the first call per key on a GPU)."""
    cfg = _fixed_config(kind, N)
    kw = {**flags, **cfg.all_kwargs()} if cfg is not None else _TUNED.get(key)
    if kw is not None:
        _KERNELS[kind][grid(kw)](*args, **kw)
        return
    tuner = _TUNERS[kind]
    tuner[grid](*args, **flags)
    _TUNED[key] = {**flags, **tuner.best_config.all_kwargs()}


def _bound(configs: list[triton.Config]) -> tuple[int, int]:
    return min(c.kwargs["BLOCK_M"] for c in configs), max(c.kwargs["PROGS_PER_SM"] for c in configs)


@functools.cache
def _partial_rows_bound(kind: str, N: int) -> tuple[int, int]:
    """(smallest BLOCK_M, largest PROGS_PER_SM) over the candidates: bounds the partial rows."""
    return _bound(_CANDIDATES[kind](N))


def _like(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    return t if t.shape == shape else t.view(shape)


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # interpreter: a few programs, each looping over several row blocks
    return torch.cuda.get_device_properties(device).multi_processor_count


def _workspace(shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    if _POISON_WORKSPACES:
        return torch.full(shape, math.nan, dtype=torch.float32, device=device)
    return torch.empty(shape, dtype=torch.float32, device=device)


# --------------------------------------------------------------------------------------------
# Host functions
# --------------------------------------------------------------------------------------------


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """[..., N] -> [M, N] with a unit last-dim stride; the kernels take any row stride.

    Only a strided last dim is copied here; ``reshape`` copies besides only when the leading dims
    cannot be flattened into one row stride (e.g. a transposed batch dim)."""
    if t.stride(-1) != 1 and t.shape[-1] != 1:
        t = t.contiguous()
    return t.reshape(-1, t.shape[-1])


def _check_inputs(
    name: str,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> None:
    if not isinstance(x, torch.Tensor):
        raise KernelInputError(f"{name}: x must be a torch.Tensor, got {type(x).__name__}")
    check_device(x, weight, bias, residual, name=name)
    check_dtype(x, _DTYPES, what="x", name=name)
    if x.dim() == 0 or x.shape[-1] == 0:
        raise KernelInputError(
            f"{name}: x has shape {tuple(x.shape)}; expected at least one dim and a non-empty last dim"
        )
    n = x.shape[-1]
    for t, what in ((weight, "weight"), (bias, "bias")):
        if t is None:
            continue
        check_dtype(t, _DTYPES, what=what, name=name)
        if tuple(t.shape) != (n,):
            raise KernelInputError(
                f"{name}: {what} has shape {tuple(t.shape)}; expected ({n},), the last dim of x"
            )
    if residual is not None:
        if residual.shape != x.shape:
            raise KernelInputError(
                f"{name}: residual has shape {tuple(residual.shape)}; expected {tuple(x.shape)} like x"
            )
        if residual.dtype != x.dtype:
            raise KernelInputError(
                f"{name}: residual has dtype {str(residual.dtype).replace('torch.', '')}; "
                f"expected {str(x.dtype).replace('torch.', '')} like x"
            )


def _unit_stride(t: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


def _dtype_of(t: torch.Tensor | None) -> torch.dtype | None:
    return None if t is None else t.dtype


def _norm_fwd(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
    eps: float,
    is_rms: bool,
    *,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None, torch.Tensor]:
    """x, residual: [M, N] with unit last-dim stride. Returns (y, new_residual, mean, rstd).

    ``out`` / ``residual_out`` ([M, N], unit last-dim stride) receive y / new_residual: the tests
    pass buffers filled with NaN to prove that every element is written."""
    M, N = x.shape
    dev = x.device
    y = out if out is not None else torch.empty((M, N), dtype=x.dtype, device=dev)
    h = None
    if residual is not None:
        h = residual_out if residual_out is not None else torch.empty_like(y)
    rstd = _workspace((M,), dev)
    mean = None if is_rms else _workspace((M,), dev)
    if M == 0:
        return y, h, mean, rstd
    weight, bias = _unit_stride(weight), _unit_stride(bias)
    args = (
        x, residual, weight, bias, y, h, mean, rstd, M, N,
        x.stride(0),
        0 if residual is None else residual.stride(0),
        y.stride(0),
        0 if h is None else h.stride(0),
        float(eps),
    )  # fmt: skip
    flags = {
        "IS_RMS": is_rms,
        "HAS_RES": residual is not None,
        "HAS_W": weight is not None,
        "HAS_B": bias is not None,
    }
    num_sms = _num_sms(dev)
    key = ("fwd", dev, N, x.dtype, _dtype_of(weight), _dtype_of(bias), *flags.values())
    _launch("fwd", lambda meta: (_grid_size(M, meta, num_sms),), args, flags, key, N)
    return y, h, mean, rstd


def _norm_bwd(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    mean: torch.Tensor | None,
    rstd: torch.Tensor,
    *,
    dresidual: torch.Tensor | None = None,
    need_dw: bool = True,
    need_db: bool = False,
    dx_out: torch.Tensor | None = None,
    dw_out: torch.Tensor | None = None,
    db_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """dy, x, dresidual: [M, N] with unit last-dim stride; RMSNorm when ``mean`` is None.

    Returns (dx, dw, db): dw only when there is a weight and ``need_dw``, db when ``need_db``;
    dw/db in the weight's dtype. ``*_out`` buffers as in ``_norm_fwd``."""
    M, N = x.shape
    dev = x.device
    has_dw = weight is not None and need_dw
    wdtype = weight.dtype if weight is not None else x.dtype
    dx = dx_out if dx_out is not None else torch.empty((M, N), dtype=x.dtype, device=dev)
    dw = db = None
    if has_dw:
        dw = dw_out if dw_out is not None else torch.empty(N, dtype=wdtype, device=dev)
    if need_db:
        db = db_out if db_out is not None else torch.empty(N, dtype=wdtype, device=dev)
    if M == 0:
        for t in (dw, db):
            if t is not None:
                t.zero_()
        return dx, dw, db

    weight = _unit_stride(weight)
    num_sms = _num_sms(dev)
    split = N > _SPLIT_BWD_ABOVE
    kind = "bwd_split" if split else "bwd"
    cfg = _fixed_config(kind, N)
    min_bm, max_pps = _partial_rows_bound(kind, N) if cfg is None else _bound([cfg])
    # Partial rows: at most one per program (persistent) or per row group (split).
    max_rows = min(_cdiv(M, min_bm), num_sms * max(max_pps, 1))
    dw_part = _workspace((max_rows, N), dev) if has_dw else None
    db_part = _workspace((max_rows, N), dev) if need_db else None
    nprog = torch.empty(1, dtype=torch.int32, device=dev)
    flags = {
        "IS_RMS": mean is None,
        "HAS_W": weight is not None,
        "HAS_DRES": dresidual is not None,
        "HAS_DW": has_dw,
        "HAS_DB": need_db,
    }
    stride_dres = 0 if dresidual is None else dresidual.stride(0)
    key = (dev, N, x.dtype, dy.dtype, _dtype_of(weight), *flags.values())
    if not split:
        args = (
            dy, x, weight, mean, rstd, dresidual, dx, dw_part, db_part, nprog, M, N,
            dy.stride(0), x.stride(0), stride_dres, dx.stride(0),
        )  # fmt: skip
        _launch("bwd", lambda meta: (_grid_size(M, meta, num_sms),), args, flags, ("bwd", *key), N)
    else:
        c = _workspace((2, M), dev)
        dots_flags = {"IS_RMS": flags["IS_RMS"], "HAS_W": flags["HAS_W"]}
        args = (dy, x, weight, mean, rstd, c, M, N, dy.stride(0), x.stride(0))
        _launch("bwd_dots", lambda meta: (M,), args, dots_flags, ("bwd_dots", *key), N)
        args = (
            dy, x, weight, mean, rstd, c, dresidual, dx, dw_part, db_part, nprog, M, N,
            dy.stride(0), x.stride(0), stride_dres, dx.stride(0),
        )  # fmt: skip
        grid = lambda meta: _split_grid(M, N, meta, num_sms)
        _launch("bwd_split", grid, args, flags, ("bwd_split", *key), N)

    if has_dw or need_db:
        _sum_partials(dw_part, db_part, nprog, dw, db, N)
    return dx, dw, db


# --------------------------------------------------------------------------------------------
# Autograd
# --------------------------------------------------------------------------------------------


class _RMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, eps):
        x2 = _as_rows(x)
        y, _, _, rstd = _norm_fwd(x2, weight, None, None, eps, True)
        ctx.save_for_backward(x2, weight, rstd)
        ctx.x_shape = x.shape
        return _like(y, x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, rstd = ctx.saved_tensors
        dx, dw, _ = _norm_bwd(_as_rows(dy), x2, weight, None, rstd, need_dw=ctx.needs_input_grad[1])
        return _like(dx, ctx.x_shape), dw, None


class _LayerNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        x2 = _as_rows(x)
        y, _, mean, rstd = _norm_fwd(x2, weight, bias, None, eps, False)
        ctx.save_for_backward(x2, weight, mean, rstd)
        ctx.x_shape = x.shape
        ctx.has_bias = bias is not None
        return _like(y, x.shape)

    @staticmethod
    def backward(ctx, dy):
        x2, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = _norm_bwd(
            _as_rows(dy),
            x2,
            weight,
            mean,
            rstd,
            need_dw=ctx.needs_input_grad[1],
            need_db=ctx.has_bias and ctx.needs_input_grad[2],
        )
        return _like(dx, ctx.x_shape), dw, db, None


class _FusedAddRMSNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        y, h, _, rstd = _norm_fwd(_as_rows(x), weight, None, _as_rows(residual), eps, True)
        # Backward needs x + residual, which new_residual already holds.
        ctx.save_for_backward(h, weight, rstd)
        ctx.x_shape = x.shape
        return _like(y, x.shape), _like(h, x.shape)

    @staticmethod
    def backward(ctx, dnormed, dnew_residual):
        h, weight, rstd = ctx.saved_tensors
        if dnormed is None:
            dnormed = torch.zeros_like(h)
        dres = None if dnew_residual is None else _as_rows(dnew_residual)
        dh, dw, _ = _norm_bwd(
            _as_rows(dnormed),
            h,
            weight,
            None,
            rstd,
            dresidual=dres,
            need_dw=ctx.needs_input_grad[2],
        )
        dh = _like(dh, ctx.x_shape)
        return dh, dh, dw, None


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


# --------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dim of ``x``: ``x / sqrt(mean(x²) + eps) * weight``.

    Any leading shape; bf16, fp16 or fp32 (statistics in fp32); ``weight`` of shape (N,) or None.
    Differentiable in ``x`` and ``weight``. Raises KernelInputError for unsupported input."""
    _check_inputs("rms_norm", x, weight)
    if _needs_grad(x, weight):
        return _RMSNormFunction.apply(x, weight, float(eps))
    y, _, _, _ = _norm_fwd(_as_rows(x), weight, None, None, eps, True)
    return _like(y, x.shape)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """LayerNorm over the last dim: ``(x - mean) / sqrt(var + eps) * weight + bias``.

    ``weight`` and ``bias`` of shape (N,), each optional. Differentiable in all three."""
    _check_inputs("layer_norm", x, weight, bias)
    if _needs_grad(x, weight, bias):
        return _LayerNormFunction.apply(x, weight, bias, float(eps))
    y, _, _, _ = _norm_fwd(_as_rows(x), weight, bias, None, eps, False)
    return _like(y, x.shape)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual, weight, eps), x + residual)`` in one pass.

    ``residual`` has the shape and dtype of ``x``; the sum is rounded to that dtype before it is
    normalized, as an unfused ``h = x + residual; rms_norm(h)`` would."""
    _check_inputs("fused_add_rms_norm", x, weight, residual=residual)
    if _needs_grad(x, residual, weight):
        return _FusedAddRMSNormFunction.apply(x, residual, weight, float(eps))
    y, h, _, _ = _norm_fwd(_as_rows(x), weight, None, _as_rows(residual), eps, True)
    return _like(y, x.shape), _like(h, x.shape)


def _normalized_shape(shape: int | tuple[int, ...] | torch.Size) -> tuple[int, ...]:
    return (int(shape),) if isinstance(shape, int) else tuple(int(s) for s in shape)


class _NormBase(nn.Module):
    """Shared parameters and state-dict layout of torch.nn.RMSNorm / torch.nn.LayerNorm.

    A ``normalized_shape`` of several dims is handled by flattening those dims into one."""

    def __init__(self, normalized_shape, eps, elementwise_affine, bias, device, dtype):
        super().__init__()
        self.normalized_shape = _normalized_shape(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        factory = {"device": device, "dtype": dtype}
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(self.normalized_shape, **factory))
            if bias:
                self.bias = nn.Parameter(torch.zeros(self.normalized_shape, **factory))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def _flat(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
        k = len(self.normalized_shape)
        if tuple(x.shape[x.dim() - k :]) != self.normalized_shape:
            raise KernelInputError(
                f"{type(self).__name__}: input has shape {tuple(x.shape)}; its last dims must be "
                f"{self.normalized_shape}"
            )
        return (x if k == 1 else x.flatten(x.dim() - k)), tuple(x.shape)

    @staticmethod
    def _vec(p: torch.Tensor | None) -> torch.Tensor | None:
        return None if p is None else p.reshape(-1)

    def _eps(self, x: torch.Tensor) -> float:
        # torch.nn.RMSNorm(eps=None) means the input dtype's machine epsilon.
        return torch.finfo(x.dtype).eps if self.eps is None else self.eps

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class RMSNorm(_NormBase):
    """Drop-in for ``torch.nn.RMSNorm`` (same parameters and state dict)."""

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float | None = 1e-6,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__(normalized_shape, eps, elementwise_affine, False, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf, shape = self._flat(x)
        return _like(rms_norm(xf, self._vec(self.weight), self._eps(x)), shape)


class LayerNorm(_NormBase):
    """Drop-in for ``torch.nn.LayerNorm`` (same parameters and state dict)."""

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf, shape = self._flat(x)
        return _like(layer_norm(xf, self._vec(self.weight), self._vec(self.bias), self.eps), shape)


class FusedAddRMSNorm(_NormBase):
    """``forward(x, residual) -> (rms_norm(x + residual), x + residual)``; its state dict loads
    from ``torch.nn.RMSNorm``."""

    def __init__(
        self,
        normalized_shape: int | tuple[int, ...],
        eps: float | None = 1e-6,
        elementwise_affine: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__(normalized_shape, eps, elementwise_affine, False, device, dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        xf, shape = self._flat(x)
        rf, _ = self._flat(residual)
        y, h = fused_add_rms_norm(xf, rf, self._vec(self.weight), self._eps(x))
        return _like(y, shape), _like(h, shape)
