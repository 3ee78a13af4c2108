"""The norms' Triton kernels (device code only; launch configuration in ``launch.py``).

Unformatted: arguments grouped by role, as Triton kernels are usually written. Eviction hints:
data read once is "evict_first", data read again soon (the weights, the first pass of a looped
row) is "evict_last". Row offsets are int64 (row index · row stride can pass 2^31); sums and
statistics are fp32 whatever the storage dtype.

Two flags give the Hugging Face variants: ``w_offset`` scales by ``w_offset + w`` (Gemma: 1),
and CAST_X rounds x̂ to the input's dtype before the weight multiplies it (Llama, Qwen,
Mistral: ``weight * hidden.to(input_dtype)``); dw then sums dy times that rounded x̂.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kerneltriage.kernels import interpreter_shim

if interpreter_shim.interpreting():
    interpreter_shim.apply()  # NumPy >= 2.4 under Triton's interpreter

# fmt: off

# fmt: off


@triton.jit
def _to(x, dtype: tl.constexpr, INTERP: tl.constexpr):
    """fp32 -> dtype, rounding to nearest even as the GPU's cvt.rn does: Triton 3.6's
    interpreter truncates fp32 -> bf16, so there the fp32 bits are rounded first (finite values;
    inf and NaN keep their class)."""
    if INTERP and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _load_x(X, R, H, rows, cols, mask, stride_x, stride_r, stride_h,
            HAS_RES: tl.constexpr, STORE_H: tl.constexpr, EVICT: tl.constexpr,
            INTERP: tl.constexpr):
    """Load a [rows, cols] tile of x as fp32; with a residual, x + residual rounded to the
    storage dtype (so that the norm sees exactly what new_residual holds), stored if STORE_H."""
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                eviction_policy=EVICT).to(tl.float32)
    if HAS_RES:
        r = tl.load(R + rows[:, None] * stride_r + cols[None, :], mask=mask, other=0.0,
                    eviction_policy=EVICT)
        h = _to(x + r.to(tl.float32), H.dtype.element_ty, INTERP)
        if STORE_H:
            tl.store(H + rows[:, None] * stride_h + cols[None, :], h, mask=mask)
        x = h.to(tl.float32)
    return x


@triton.jit
def _scale_shift(y, W, B, cols, col_mask, w_offset, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
    """y·(w_offset + w) (+ b) in fp32."""
    if HAS_W:
        w = tl.load(W + cols, mask=col_mask, other=0.0, eviction_policy="evict_last")
        y = y * (w.to(tl.float32) + w_offset)[None, :]
    if HAS_B:
        b = tl.load(B + cols, mask=col_mask, other=0.0, eviction_policy="evict_last")
        y = y + b.to(tl.float32)[None, :]
    return y


@triton.jit
def _rounded(xhat, dtype: tl.constexpr, CAST_X: tl.constexpr, INTERP: tl.constexpr):
    """x̂ as the weight sees it: rounded to the input's dtype under CAST_X (Hugging Face's
    ``weight * hidden.to(input_dtype)``), else as computed."""
    if CAST_X:
        xhat = _to(xhat, dtype, INTERP).to(tl.float32)
    return xhat


@triton.jit
def _fwd_rows_single(X, R, W, B, Y, H, MEAN, RSTD, rows, row_mask, N,
                     stride_x, stride_r, stride_y, stride_h, eps, w_offset,
                     IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr,
                     HAS_B: tl.constexpr, CAST_X: tl.constexpr, BLOCK_N: tl.constexpr,
                     INTERP: tl.constexpr, EVICT_X: tl.constexpr):
    """Rows that fit in one block: one read of x (and of the residual), one write of y."""
    cols = tl.arange(0, BLOCK_N)
    col_mask = cols < N
    mask = row_mask[:, None] & col_mask[None, :]
    x = _load_x(X, R, H, rows, cols, mask, stride_x, stride_r, stride_h, HAS_RES, True,
                EVICT_X, INTERP)
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
    y = _scale_shift(_rounded(xhat, X.dtype.element_ty, CAST_X, INTERP), W, B, cols, col_mask, w_offset,
                     HAS_W, HAS_B)
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], _to(y, Y.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _fwd_rows_looped(X, R, W, B, Y, H, MEAN, RSTD, rows, row_mask, N,
                     stride_x, stride_r, stride_y, stride_h, eps, w_offset,
                     IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr,
                     HAS_B: tl.constexpr, CAST_X: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, INTERP: tl.constexpr):
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
                        "evict_last", INTERP)
            acc += x * x
            off += BLOCK_N
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / N + eps)
    else:
        # Sums shifted by the first chunk's mean: E[(x−s)²] − E[x−s]² loses nothing to
        # cancellation when s is already close to the mean, unlike E[x²] − E[x]².
        mask = row_mask[:, None] & (cols < N)[None, :]
        x = _load_x(X, R, H, rows, cols, mask, stride_x, stride_r, stride_h, HAS_RES, True,
                    "evict_last", INTERP)
        shift = tl.sum(x, axis=1) / tl.minimum(N, BLOCK_N)
        d = tl.where(mask, x - shift[:, None], 0.0)
        s1 = d
        s2 = d * d
        off = BLOCK_N
        while off < N:
            c = off + cols
            mask = row_mask[:, None] & (c < N)[None, :]
            x = _load_x(X, R, H, rows, c, mask, stride_x, stride_r, stride_h, HAS_RES, True,
                        "evict_last", INTERP)
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
                    "evict_first", INTERP)
        y = x * rstd[:, None] if IS_RMS else (x - mean[:, None]) * rstd[:, None]
        y = _scale_shift(_rounded(y, X.dtype.element_ty, CAST_X, INTERP), W, B, c, col_mask, w_offset,
                         HAS_W, HAS_B)
        tl.store(Y + rows[:, None] * stride_y + c[None, :], _to(y, Y.dtype.element_ty, INTERP), mask=mask)
        off -= BLOCK_N


@triton.jit
def _norm_fwd_kernel(
    X, R, W, B, Y, H, MEAN, RSTD,
    M, N, stride_x, stride_r, stride_y, stride_h, eps, w_offset,
    IS_RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
    CAST_X: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOPED: tl.constexpr,
    PROGS_PER_SM: tl.constexpr, INTERP: tl.constexpr, EVICT_X: tl.constexpr = "evict_first",
):
    """Program p normalizes row blocks p, p + P, ... (P = grid size: one program per row block,
    or a persistent grid of PROGS_PER_SM per SM, which bounds how many long rows are in flight
    so that the looped variant's second pass hits L2). R and H (residual in, new_residual out)
    are used only if HAS_RES; PROGS_PER_SM is read by the launch grid. EVICT_X: the cache
    policy of the single-block variant's loads of x ("" = the default), an autotuned choice."""
    start = tl.program_id(0).to(tl.int64) * BLOCK_M
    step = tl.num_programs(0) * BLOCK_M
    while start < M:
        rows = start + tl.arange(0, BLOCK_M)
        row_mask = rows < M
        if LOOPED:
            _fwd_rows_looped(X, R, W, B, Y, H, MEAN, RSTD, rows, row_mask, N,
                             stride_x, stride_r, stride_y, stride_h, eps, w_offset,
                             IS_RMS, HAS_RES, HAS_W, HAS_B, CAST_X, BLOCK_M, BLOCK_N, INTERP)
        else:
            _fwd_rows_single(X, R, W, B, Y, H, MEAN, RSTD, rows, row_mask, N,
                             stride_x, stride_r, stride_y, stride_h, eps, w_offset,
                             IS_RMS, HAS_RES, HAS_W, HAS_B, CAST_X, BLOCK_N, INTERP, EVICT_X)
        start += step


@triton.jit
def _bwd_tile(DY, X, W, rows, cols, mask, col_mask, mean, rstd, stride_dy, stride_x, w_offset,
              IS_RMS: tl.constexpr, HAS_W: tl.constexpr, EVICT: tl.constexpr):
    """Load dy and x for a tile; return (dy, x̂, g = (w_offset + w)·dy) in fp32."""
    dy = tl.load(DY + rows[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0,
                 eviction_policy=EVICT).to(tl.float32)
    x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                eviction_policy=EVICT).to(tl.float32)
    xhat = x * rstd[:, None] if IS_RMS else tl.where(mask, (x - mean[:, None]) * rstd[:, None], 0.0)
    g = _scale_shift(dy, W, W, cols, col_mask, w_offset, HAS_W, False)
    return dy, xhat, g


@triton.jit
def _store_dx(DX, DRES, rows, cols, mask, g, xhat, c1, c2, rstd, stride_dx, stride_dres,
              IS_RMS: tl.constexpr, HAS_DRES: tl.constexpr, INTERP: tl.constexpr):
    """dx = rstd·(g − x̂·c1 (− c2)) (+ dnew_residual), stored in DX's dtype."""
    if IS_RMS:
        dx = (g - xhat * c1[:, None]) * rstd[:, None]
    else:
        dx = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
    if HAS_DRES:
        dres = tl.load(DRES + rows[:, None] * stride_dres + cols[None, :], mask=mask, other=0.0,
                       eviction_policy="evict_first")
        dx += dres.to(tl.float32)
    tl.store(DX + rows[:, None] * stride_dx + cols[None, :], _to(dx, DX.dtype.element_ty, INTERP), mask=mask)


@triton.jit
def _norm_bwd_kernel(
    DY, X, W, MEAN, RSTD, DRES, DX, DW_PART, DB_PART, NPROG,
    M, N, stride_dy, stride_x, stride_dres, stride_dx, w_offset,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_DRES: tl.constexpr,
    HAS_DW: tl.constexpr, HAS_DB: tl.constexpr, CAST_X: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, LOOPED: tl.constexpr,
    PROGS_PER_SM: tl.constexpr, INTERP: tl.constexpr,
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
                                    stride_dy, stride_x, w_offset, IS_RMS, HAS_W, "evict_first")
            c1 = tl.sum(xhat * g, axis=1) / N
            c2 = c1 if IS_RMS else tl.sum(g, axis=1) / N  # RMS: unused
            _store_dx(DX, DRES, rows, cols, mask, g, xhat, c1, c2, rstd, stride_dx, stride_dres,
                      IS_RMS, HAS_DRES, INTERP)
            if HAS_DW:
                dw_acc += dy * _rounded(xhat, X.dtype.element_ty, CAST_X, INTERP)
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
                                       stride_dy, stride_x, w_offset, IS_RMS, HAS_W, "evict_last")
                a1 += xhat * g
                if not IS_RMS:
                    a2 += g
                off += BLOCK_N
            c1 = tl.sum(a1, axis=1) / N
            c2 = tl.sum(a2, axis=1) / N
            # Pass 2, last chunk first (L2): dx, and this program's dw/db partial, which the
            # program's first row block initializes instead of reading.
            # A tensor, not a scalar: triton 3.9's interpreter turns `tensor & scalar` masks into int32.
            not_first = (cols * 0 + start) != first
            off = last
            while off >= 0:
                c = off + cols
                col_mask = c < N
                mask = row_mask[:, None] & col_mask[None, :]
                dy, xhat, g = _bwd_tile(DY, X, W, rows, c, mask, col_mask, mean, rstd,
                                        stride_dy, stride_x, w_offset, IS_RMS, HAS_W, "evict_first")
                _store_dx(DX, DRES, rows, c, mask, g, xhat, c1, c2, rstd, stride_dx,
                          stride_dres, IS_RMS, HAS_DRES, INTERP)
                if HAS_DW:
                    part = DW_PART + pid * N + c
                    acc = tl.load(part, mask=col_mask & not_first, other=0.0)
                    tl.store(part, acc + tl.sum(dy * _rounded(xhat, X.dtype.element_ty, CAST_X, INTERP), axis=0), mask=col_mask)
                if HAS_DB:
                    part = DB_PART + pid * N + c
                    acc = tl.load(part, mask=col_mask & not_first, other=0.0)
                    tl.store(part, acc + tl.sum(dy, axis=0), mask=col_mask)
                off -= BLOCK_N
            start += nprog * BLOCK_M


@triton.jit
def _bwd_row_dots_kernel(
    DY, X, W, MEAN, RSTD, C, M, N, stride_dy, stride_x, w_offset,
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
                               stride_dy, stride_x, w_offset, IS_RMS, HAS_W, "evict_first")
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
    M, N, stride_dy, stride_x, stride_dres, stride_dx, w_offset,
    IS_RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_DRES: tl.constexpr,
    HAS_DW: tl.constexpr, HAS_DB: tl.constexpr, CAST_X: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PROGS_PER_SM: tl.constexpr, INTERP: tl.constexpr,
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
                                stride_dy, stride_x, w_offset, IS_RMS, HAS_W, "evict_first")
        _store_dx(DX, DRES, rows, cols, mask, g, xhat, c1, c2, rstd, stride_dx, stride_dres,
                  IS_RMS, HAS_DRES, INTERP)
        if HAS_DW:
            dw_acc += dy * _rounded(xhat, X.dtype.element_ty, CAST_X, INTERP)
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
    INTERP: tl.constexpr,
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
        tl.store(DW + cols, _to(tl.sum(acc_w, axis=0), DW.dtype.element_ty, INTERP), mask=col_mask)
    if HAS_DB:
        tl.store(DB + cols, _to(tl.sum(acc_b, axis=0), DB.dtype.element_ty, INTERP), mask=col_mask)


# fmt: on
