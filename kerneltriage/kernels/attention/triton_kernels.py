"""The flash-attention Triton kernels (device code only; launch configuration in ``launch.py``).

Each kernel visits the tiles its rows (or keys) can see in up to three stages, one call of its
inner loop per stage, unrolled at compile time (``tl.static_range``) as in Triton's
fused-attention tutorial; the stage picks the loop bounds and whether the tile needs a mask:

    STAGE 1  masked tiles before the band (only with a window limit on that side)
    STAGE 2  tiles every row sees: no mask
    STAGE 3  masked tiles after the band: the causal diagonal, the window's other edge, the
             ragged end of the sequence

The bounds come from ``_kv_blocks`` / ``_q_blocks``: only tiles inside the band are visited
(sliding-window tiles that no row sees are skipped), and only the boundary tiles pay for the
mask. Batch/head offsets are int64; scores and accumulators are fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kerneltriage.kernels import interpreter_shim

if interpreter_shim.interpreting():
    interpreter_shim.apply()  # NumPy >= 2.4 under Triton's interpreter


@triton.jit
def _tanh(x, FAST: tl.constexpr):
    if FAST:
        # one MUFU op; |error| < 2^-10.9 relative, far below bf16 logit rounding
        y = tl.inline_asm_elementwise(
            "tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        # tanh(x) = 1 - 2 / (e^2x + 1): saturates to ±1 without inf/inf
        y = 1.0 - 2.0 / (tl.math.exp2(x * 2.8853900817779268) + 1.0)
    return y


@triton.jit
def _dot(a, b, acc, INTERP_BF16: tl.constexpr):
    # Triton 3.6's interpreter multiplies bf16 bit patterns as integers: run the product in
    # fp32 there (bf16·bf16 products are exact in fp32, as on the tensor cores)
    return tl.dot(a.to(tl.float32), b.to(tl.float32), acc) if INTERP_BF16 else tl.dot(a, b, acc)


@triton.jit
def _cast(x, dtype: tl.constexpr, INTERP_BF16: tl.constexpr):
    """fp32 -> input dtype, rounding to nearest even as the GPU's cvt.rn does."""
    if INTERP_BF16:
        # the interpreter truncates fp32 -> bf16; round the fp32 bits first so the
        # truncation is exact (finite values only: inf/nan never reach these casts)
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _make_src(base, n_rows, stride_row, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, USE_TMA: tl.constexpr):
    """A (n_rows, head_dim) view of one head: a TMA descriptor, or the base pointer."""
    if USE_TMA:
        src = tl.make_tensor_descriptor(
            base, shape=[n_rows, BLOCK_D], strides=[stride_row, 1], block_shape=[BLOCK_R, BLOCK_D]
        )
    else:
        src = base
    return src


@triton.jit
def _load_tile(
    src,
    row0,
    offs_r,
    offs_d,
    stride_row,
    n_rows,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CHECK_ROWS: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    if USE_TMA:
        tile = src.load([row0, 0])  # out-of-range rows come back as zeros
    else:
        ptrs = src + offs_r[:, None] * stride_row + offs_d[None, :]
        if CHECK_ROWS:
            mask = offs_r[:, None] < n_rows
            if BLOCK_D != HEAD_DIM:
                mask = mask & (offs_d[None, :] < HEAD_DIM)
            tile = tl.load(ptrs, mask=mask, other=0.0)
        elif BLOCK_D != HEAD_DIM:
            tile = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
        else:
            tile = tl.load(ptrs)
    return tile


@triton.jit
def _store_tile(
    dst,
    value,
    row0,
    offs_r,
    offs_d,
    stride_row,
    n_rows,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    if USE_TMA:
        dst.store([row0, 0], value)  # clipped at n_rows by the copy engine
    else:
        mask = offs_r[:, None] < n_rows
        if BLOCK_D != HEAD_DIM:
            mask = mask & (offs_d[None, :] < HEAD_DIM)
        tl.store(dst + offs_r[:, None] * stride_row + offs_d[None, :], value, mask=mask)


@triton.jit
def _kv_blocks(m0, Sq, Sk, off, win_left, win_right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """KV block bounds for q rows [m0, m0 + BLOCK_M): [lo, full_lo) and [full_hi, hi) need
    the mask, [full_lo, full_hi) is visible to every row; blocks outside [lo, hi) are skipped."""
    m_last = tl.minimum(m0 + BLOCK_M, Sq) - 1
    first = tl.maximum(m0 + off - win_left, 0)  # first key any row sees
    end = tl.minimum(m_last + off + win_right + 1, Sk)  # one past the last key any row sees
    lo = (first // BLOCK_N) * BLOCK_N
    hi = tl.where(end > first, tl.cdiv(end, BLOCK_N) * BLOCK_N, lo)
    # a block is unmasked when the last row's window starts at or before it, the first
    # row's window ends at or after it, and it lies inside Sk
    full_lo = tl.cdiv(tl.maximum(m_last + off - win_left, 0), BLOCK_N) * BLOCK_N
    full_hi = (tl.maximum(tl.minimum(m0 + off + win_right + 1, Sk), 0) // BLOCK_N) * BLOCK_N
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def _q_blocks(n0, Sq, Sk, off, win_left, win_right, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Q block bounds for the key rows [n0, n0 + BLOCK_N); same convention as _kv_blocks."""
    n_last = tl.minimum(n0 + BLOCK_N, Sk) - 1
    first = tl.maximum(n0 - off - win_right, 0)  # first row that sees a key of the block
    end = tl.minimum(n_last - off + win_left + 1, Sq)
    lo = (first // BLOCK_M) * BLOCK_M
    hi = tl.where(end > first, tl.cdiv(end, BLOCK_M) * BLOCK_M, lo)
    full_lo = tl.cdiv(tl.maximum(n0 + BLOCK_N - 1 - off - win_right, 0), BLOCK_M) * BLOCK_M
    full_hi = (tl.maximum(tl.minimum(n0 - off + win_left + 1, Sq), 0) // BLOCK_M) * BLOCK_M
    # a ragged key block needs no mask here: its padded keys are zero-filled and their dK/dV
    # rows are never stored
    full_lo = tl.minimum(tl.maximum(full_lo, lo), hi)
    full_hi = tl.minimum(tl.maximum(full_hi, full_lo), hi)
    return lo, full_lo, full_hi, hi


@triton.jit
def _stage_bounds(lo, full_lo, full_hi, hi, STAGE: tl.constexpr):
    """The tile range of one stage (see the module docstring)."""
    if STAGE == 1:
        start = lo
        stop = full_lo
    elif STAGE == 2:
        start = full_lo
        stop = full_hi
    else:
        start = full_hi
        stop = hi
    return start, stop


# ----------------------------------------------------------------------------- forward
# Unformatted below: arguments grouped by role.
# fmt: off


@triton.jit
def _fwd_inner(
    acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_vn, Sk,
    lo, full_lo, full_hi, hi, key_lo, key_hi, qk_scale, cap2, cap_in,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, STAGE: tl.constexpr,
    SOFTCAP: tl.constexpr, STATIC_MAX: tl.constexpr, FAST_TANH: tl.constexpr,
    USE_TMA: tl.constexpr, INTERP_BF16: tl.constexpr, WS: tl.constexpr,
):
    """Online softmax over the KV tiles of one stage; stages 1 and 3 mask per row to the keys
    key_lo[i] <= j <= key_hi[i] (key_hi already < Sk)."""
    start, stop = _stage_bounds(lo, full_lo, full_hi, hi, STAGE)
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in tl.range(start, stop, BLOCK_N, warp_specialize=WS):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_src, start_n, offs_n, offs_d, stride_kn, Sk, HEAD_DIM, BLOCK_D, STAGE != 2, USE_TMA)
        qk = _dot(q, tl.trans(k), None, INTERP_BF16)
        if SOFTCAP:
            s = cap2 * _tanh(qk * cap_in, FAST_TANH)
        elif STAGE != 2:
            s = qk * qk_scale
        if STAGE != 2:
            keep = (offs_n[None, :] >= key_lo[:, None]) & (offs_n[None, :] <= key_hi[:, None])
            s = tl.where(keep, s, float("-inf"))
        if STATIC_MAX:
            p = tl.math.exp2(s)
        else:
            if SOFTCAP or STAGE != 2:
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_use = m_new
                if STAGE != 2:  # a row that has seen nothing keeps m = -inf: subtract 0
                    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
                p = tl.math.exp2(s - m_use[:, None])
            else:
                m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
                m_use = m_new
                p = tl.math.exp2(qk * qk_scale - m_use[:, None])  # one FFMA per score
            alpha = tl.math.exp2(m_i - m_use)
            l_i = l_i * alpha
            acc = acc * alpha[:, None]
            m_i = m_new
        l_i += tl.sum(p, 1)
        v = _load_tile(v_src, start_n, offs_n, offs_d, stride_vn, Sk, HEAD_DIM, BLOCK_D, STAGE != 2, USE_TMA)
        acc = _dot(_cast(p, v.dtype, INTERP_BF16), v, acc, INTERP_BF16)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, O, LSE,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_ob, stride_oh, stride_om,
    H, GROUP, Sq, Sk, win_left, win_right, sm_scale, softcap,
    SQ_KEY, SK_KEY,  # only for the autotuner's key
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SOFTCAP: tl.constexpr,
    STATIC_MAX: tl.constexpr, FAST_TANH: tl.constexpr, USE_TMA: tl.constexpr,
    REVERSE: tl.constexpr, INTERP_BF16: tl.constexpr, HAS_LEFT: tl.constexpr, WS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program per (q block, batch·head): O and LSE of BLOCK_M query rows."""
    pid_m = tl.program_id(0)
    if REVERSE:  # causal: the heaviest q blocks first, so the last wave is short
        pid_m = tl.cdiv(Sq, BLOCK_M) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    off = Sk - Sq
    m0 = pid_m * BLOCK_M

    q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    k_base = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    o_base = O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    q_src = _make_src(q_base, Sq, stride_qm, BLOCK_M, BLOCK_D, USE_TMA)
    k_src = _make_src(k_base, Sk, stride_kn, BLOCK_N, BLOCK_D, USE_TMA)
    v_src = _make_src(v_base, Sk, stride_vn, BLOCK_N, BLOCK_D, USE_TMA)
    o_dst = _make_src(o_base, Sq, stride_om, BLOCK_M, BLOCK_D, USE_TMA)

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q = _load_tile(q_src, m0, offs_m, offs_d, stride_qm, Sq, HEAD_DIM, BLOCK_D, True, USE_TMA)

    qk_scale = sm_scale * 1.4426950408889634
    cap2 = softcap * 1.4426950408889634
    cap_in = sm_scale / softcap
    if STATIC_MAX:
        m_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    lo, full_lo, full_hi, hi = _kv_blocks(m0, Sq, Sk, off, win_left, win_right, BLOCK_M, BLOCK_N)
    # per-row visible key range, for the boundary tiles' mask
    key_lo = offs_m + off - win_left
    key_hi = tl.minimum(offs_m + off + win_right, Sk - 1)
    # without a left window limit stage 1 is empty: compile no loop for it
    for STAGE in tl.static_range(2 - HAS_LEFT, 4):
        acc, l_i, m_i = _fwd_inner(
            acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_vn, Sk,
            lo, full_lo, full_hi, hi, key_lo, key_hi, qk_scale, cap2, cap_in,
            HEAD_DIM, BLOCK_D, BLOCK_N, STAGE, SOFTCAP, STATIC_MAX, FAST_TANH, USE_TMA,
            INTERP_BF16, WS,
        )

    empty = l_i == 0.0  # rows that see no key: output 0, lse -inf
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    tl.store(LSE + pid_bh.to(tl.int64) * Sq + offs_m, lse, mask=offs_m < Sq)
    _store_tile(o_dst, _cast(out, O.dtype.element_ty, INTERP_BF16), m0, offs_m, offs_d, stride_om,
                Sq, HEAD_DIM, BLOCK_D, USE_TMA)


# ----------------------------------------------------------------------------- backward


@triton.jit
def _attn_bwd_preprocess_kernel(
    O, DO, DELTA,
    stride_ob, stride_oh, stride_om, stride_dob, stride_doh, stride_dom,
    H, Sq,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """delta = rowsum(dO·O), fp32, one program per (q block, batch·head)."""
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < Sq) & (offs_d[None, :] < HEAD_DIM)
    rows = offs_m[:, None]
    o_ptrs = O + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + rows * stride_om + offs_d[None, :]
    do_ptrs = DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh + rows * stride_dom + offs_d[None, :]
    o = tl.load(o_ptrs, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + pid_bh.to(tl.int64) * Sq + offs_m, tl.sum(o * do, 1), mask=offs_m < Sq)


@triton.jit
def _dkdv_inner(
    dk, dv, k, v, q_src, do_src, lse_ptr, delta_ptr, stride_qm, stride_dom, offs_n,
    Sq, Sk, off, win_left, win_right, lo, full_lo, full_hi, hi, qk_scale, cap2, cap_in,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, STAGE: tl.constexpr,
    SOFTCAP: tl.constexpr, FAST_TANH: tl.constexpr, USE_TMA: tl.constexpr,
    INTERP_BF16: tl.constexpr,
):
    """dK/dV of one KV tile over the q tiles of one stage (one q head)."""
    start, stop = _stage_bounds(lo, full_lo, full_hi, hi, STAGE)
    offs_d = tl.arange(0, BLOCK_D)
    for start_m in range(start, stop, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = _load_tile(q_src, start_m, offs_m, offs_d, stride_qm, Sq, HEAD_DIM, BLOCK_D, STAGE != 2, USE_TMA)
        if STAGE != 2:
            lse2 = tl.load(lse_ptr + offs_m, mask=offs_m < Sq, other=0.0)
            delta = tl.load(delta_ptr + offs_m, mask=offs_m < Sq, other=0.0)
        else:
            lse2 = tl.load(lse_ptr + offs_m)
            delta = tl.load(delta_ptr + offs_m)
        # rows that saw no key have lse = -inf; +inf makes their p exactly 0
        lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2 * 1.4426950408889634)
        qkT = _dot(k, tl.trans(q), None, INTERP_BF16)  # (BLOCK_N, BLOCK_M): keys along rows
        if SOFTCAP:
            tT = _tanh(qkT * cap_in, FAST_TANH)
            pT = tl.math.exp2(cap2 * tT - lse2[None, :])
        else:
            pT = tl.math.exp2(qkT * qk_scale - lse2[None, :])
        if STAGE != 2:
            key_lo = offs_m + off - win_left  # per q row: visible keys key_lo..key_hi
            key_hi = tl.minimum(offs_m + off + win_right, Sk - 1)
            keep = (offs_n[:, None] >= key_lo[None, :]) & (offs_n[:, None] <= key_hi[None, :])
            pT = tl.where(keep, pT, 0.0)
        do = _load_tile(do_src, start_m, offs_m, offs_d, stride_dom, Sq, HEAD_DIM, BLOCK_D, STAGE != 2, USE_TMA)
        dv = _dot(_cast(pT, do.dtype, INTERP_BF16), do, dv, INTERP_BF16)
        dpT = _dot(v, tl.trans(do), None, INTERP_BF16)
        dsT = pT * (dpT - delta[None, :])
        if SOFTCAP:  # d(c·tanh(u))/du = c·(1 - tanh²); the c cancels against u = qk·scale/c
            dsT = dsT * (1.0 - tT * tT)
        dk = _dot(_cast(dsT, q.dtype, INTERP_BF16), q, dk, INTERP_BF16)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, DK, DV,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
    stride_dkb, stride_dkh, stride_dkn, stride_dvb, stride_dvh, stride_dvn,
    H, HK, GROUP, Sq, Sk, win_left, win_right, sm_scale, softcap,
    SQ_KEY, SK_KEY,  # only for the autotuner's key
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SOFTCAP: tl.constexpr,
    FAST_TANH: tl.constexpr, USE_TMA: tl.constexpr, INTERP_BF16: tl.constexpr,
    HAS_RIGHT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program per (KV block, batch·kv head): dK and dV of BLOCK_N keys, summed over the
    q heads of the GQA group on chip (no atomics)."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)  # over batch · kv heads
    b = pid_bh // HK
    hk = pid_bh % HK
    off = Sk - Sq
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    k_base = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    k_src = _make_src(k_base, Sk, stride_kn, BLOCK_N, BLOCK_D, USE_TMA)
    v_src = _make_src(v_base, Sk, stride_vn, BLOCK_N, BLOCK_D, USE_TMA)
    k = _load_tile(k_src, n0, offs_n, offs_d, stride_kn, Sk, HEAD_DIM, BLOCK_D, True, USE_TMA)
    v = _load_tile(v_src, n0, offs_n, offs_d, stride_vn, Sk, HEAD_DIM, BLOCK_D, True, USE_TMA)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    qk_scale = sm_scale * 1.4426950408889634
    cap2 = softcap * 1.4426950408889634
    cap_in = sm_scale / softcap
    lo, full_lo, full_hi, hi = _q_blocks(n0, Sq, Sk, off, win_left, win_right, BLOCK_M, BLOCK_N)
    for g in range(GROUP):
        h = hk * GROUP + g
        q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        do_base = DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
        q_src = _make_src(q_base, Sq, stride_qm, BLOCK_M, BLOCK_D, USE_TMA)
        do_src = _make_src(do_base, Sq, stride_dom, BLOCK_M, BLOCK_D, USE_TMA)
        row = (b * H + h).to(tl.int64) * Sq
        # stage 1 (q rows below the band) is empty without a right limit (non-causal)
        for STAGE in tl.static_range(2 - HAS_RIGHT, 4):
            dk, dv = _dkdv_inner(
                dk, dv, k, v, q_src, do_src, LSE + row, DELTA + row, stride_qm, stride_dom, offs_n,
                Sq, Sk, off, win_left, win_right, lo, full_lo, full_hi, hi, qk_scale, cap2, cap_in,
                HEAD_DIM, BLOCK_D, BLOCK_M, STAGE, SOFTCAP, FAST_TANH, USE_TMA, INTERP_BF16,
            )

    dk_base = DK + b.to(tl.int64) * stride_dkb + hk.to(tl.int64) * stride_dkh
    dv_base = DV + b.to(tl.int64) * stride_dvb + hk.to(tl.int64) * stride_dvh
    dk_dst = _make_src(dk_base, Sk, stride_dkn, BLOCK_N, BLOCK_D, USE_TMA)
    dv_dst = _make_src(dv_base, Sk, stride_dvn, BLOCK_N, BLOCK_D, USE_TMA)
    _store_tile(dk_dst, _cast(dk * sm_scale, DK.dtype.element_ty, INTERP_BF16), n0, offs_n, offs_d,
                stride_dkn, Sk, HEAD_DIM, BLOCK_D, USE_TMA)
    _store_tile(dv_dst, _cast(dv, DV.dtype.element_ty, INTERP_BF16), n0, offs_n, offs_d,
                stride_dvn, Sk, HEAD_DIM, BLOCK_D, USE_TMA)


@triton.jit
def _dq_inner(
    dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_vn, Sk,
    lo, full_lo, full_hi, hi, key_lo, key_hi, qk_scale, cap2, cap_in,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, STAGE: tl.constexpr,
    SOFTCAP: tl.constexpr, FAST_TANH: tl.constexpr, USE_TMA: tl.constexpr,
    INTERP_BF16: tl.constexpr,
):
    """dQ of one q tile over the KV tiles of one stage."""
    start, stop = _stage_bounds(lo, full_lo, full_hi, hi, STAGE)
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in range(start, stop, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_src, start_n, offs_n, offs_d, stride_kn, Sk, HEAD_DIM, BLOCK_D, STAGE != 2, USE_TMA)
        v = _load_tile(v_src, start_n, offs_n, offs_d, stride_vn, Sk, HEAD_DIM, BLOCK_D, STAGE != 2, USE_TMA)
        qk = _dot(q, tl.trans(k), None, INTERP_BF16)
        if SOFTCAP:
            t = _tanh(qk * cap_in, FAST_TANH)
            p = tl.math.exp2(cap2 * t - lse2[:, None])
        else:
            p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if STAGE != 2:
            keep = (offs_n[None, :] >= key_lo[:, None]) & (offs_n[None, :] <= key_hi[:, None])
            p = tl.where(keep, p, 0.0)
        dp = _dot(do, tl.trans(v), None, INTERP_BF16)
        ds = p * (dp - delta[:, None])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = _dot(_cast(ds, k.dtype, INTERP_BF16), k, dq, INTERP_BF16)
    return dq


@triton.jit
def _attn_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, DQ,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn,
    stride_vb, stride_vh, stride_vn, stride_dob, stride_doh, stride_dom,
    stride_dqb, stride_dqh, stride_dqm,
    H, GROUP, Sq, Sk, win_left, win_right, sm_scale, softcap,
    SQ_KEY, SK_KEY,  # only for the autotuner's key
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, SOFTCAP: tl.constexpr,
    FAST_TANH: tl.constexpr, USE_TMA: tl.constexpr, REVERSE: tl.constexpr,
    INTERP_BF16: tl.constexpr, HAS_LEFT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """One program per (q block, batch·head): dQ of BLOCK_M query rows."""
    pid_m = tl.program_id(0)
    if REVERSE:
        pid_m = tl.cdiv(Sq, BLOCK_M) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    off = Sk - Sq
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
    do_base = DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
    k_base = K + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = V + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    dq_base = DQ + b.to(tl.int64) * stride_dqb + h.to(tl.int64) * stride_dqh
    q_src = _make_src(q_base, Sq, stride_qm, BLOCK_M, BLOCK_D, USE_TMA)
    do_src = _make_src(do_base, Sq, stride_dom, BLOCK_M, BLOCK_D, USE_TMA)
    k_src = _make_src(k_base, Sk, stride_kn, BLOCK_N, BLOCK_D, USE_TMA)
    v_src = _make_src(v_base, Sk, stride_vn, BLOCK_N, BLOCK_D, USE_TMA)
    dq_dst = _make_src(dq_base, Sq, stride_dqm, BLOCK_M, BLOCK_D, USE_TMA)

    q = _load_tile(q_src, m0, offs_m, offs_d, stride_qm, Sq, HEAD_DIM, BLOCK_D, True, USE_TMA)
    do = _load_tile(do_src, m0, offs_m, offs_d, stride_dom, Sq, HEAD_DIM, BLOCK_D, True, USE_TMA)
    row = pid_bh.to(tl.int64) * Sq
    lse2 = tl.load(LSE + row + offs_m, mask=offs_m < Sq, other=0.0)
    lse2 = tl.where(lse2 == float("-inf"), float("inf"), lse2 * 1.4426950408889634)
    delta = tl.load(DELTA + row + offs_m, mask=offs_m < Sq, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    qk_scale = sm_scale * 1.4426950408889634
    cap2 = softcap * 1.4426950408889634
    cap_in = sm_scale / softcap
    lo, full_lo, full_hi, hi = _kv_blocks(m0, Sq, Sk, off, win_left, win_right, BLOCK_M, BLOCK_N)
    key_lo = offs_m + off - win_left
    key_hi = tl.minimum(offs_m + off + win_right, Sk - 1)
    for STAGE in tl.static_range(2 - HAS_LEFT, 4):
        dq = _dq_inner(
            dq, q, do, lse2, delta, k_src, v_src, stride_kn, stride_vn, Sk,
            lo, full_lo, full_hi, hi, key_lo, key_hi, qk_scale, cap2, cap_in,
            HEAD_DIM, BLOCK_D, BLOCK_N, STAGE, SOFTCAP, FAST_TANH, USE_TMA, INTERP_BF16,
        )
    _store_tile(dq_dst, _cast(dq * sm_scale, DQ.dtype.element_ty, INTERP_BF16), m0, offs_m, offs_d,
                stride_dqm, Sq, HEAD_DIM, BLOCK_D, USE_TMA)


# fmt: on
