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
to three loops: masked blocks below the band, unmasked blocks, masked blocks above it; only
the boundary blocks pay for the mask.

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
±5% of the pointer path, so it is opt-in (KERNELTRIAGE_ATTN_TMA=on, see _TMA_MODE). Measured
rates against SDPA and FlexAttention: kerneltriage/data/attention_perf.yaml.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kerneltriage.errors import KernelInputError

from ._common import check_device, check_dtype, interpreter_mode

_NAME = "flash_attention"
# With a softcap, logits lie in [-c, c]; 2^(c·log2 e) stays far inside the fp32/bf16
# exponent range for c <= 50, so the forward pass can skip the running max (bf16 only:
# fp16 p would overflow).
_STATIC_MAX_SOFTCAP = 50.0


# ----------------------------------------------------------------------------- kernels


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
def _fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    k_src,
    v_src,
    stride_kn,
    stride_vn,
    start,
    stop,
    Sk,
    key_lo,
    key_hi,
    qk_scale,
    cap2,
    cap_in,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    SOFTCAP: tl.constexpr,
    STATIC_MAX: tl.constexpr,
    FAST_TANH: tl.constexpr,
    USE_TMA: tl.constexpr,
    INTERP_BF16: tl.constexpr,
    WS: tl.constexpr,
):
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in tl.range(start, stop, BLOCK_N, warp_specialize=WS):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_src, start_n, offs_n, offs_d, stride_kn, Sk, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        qk = _dot(q, tl.trans(k), None, INTERP_BF16)
        if SOFTCAP:
            s = cap2 * _tanh(qk * cap_in, FAST_TANH)
        elif MASKED:
            s = qk * qk_scale
        if MASKED:  # row i keeps keys key_lo[i] <= j <= key_hi[i] (key_hi already < Sk)
            keep = (offs_n[None, :] >= key_lo[:, None]) & (offs_n[None, :] <= key_hi[:, None])
            s = tl.where(keep, s, float("-inf"))
        if STATIC_MAX:
            p = tl.math.exp2(s)
        else:
            if SOFTCAP or MASKED:
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_use = m_new
                if MASKED:  # a row that has seen nothing keeps m = -inf: subtract 0
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
        v = _load_tile(v_src, start_n, offs_n, offs_d, stride_vn, Sk, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        acc = _dot(_cast(p, v.dtype, INTERP_BF16), v, acc, INTERP_BF16)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(
    Q,
    K,
    V,
    O,
    LSE,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_ob,
    stride_oh,
    stride_om,
    H,
    GROUP,
    Sq,
    Sk,
    win_left,
    win_right,
    sm_scale,
    softcap,
    SQ_KEY,
    SK_KEY,  # only for the autotuner's key
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SOFTCAP: tl.constexpr,
    STATIC_MAX: tl.constexpr,
    FAST_TANH: tl.constexpr,
    USE_TMA: tl.constexpr,
    REVERSE: tl.constexpr,
    INTERP_BF16: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    WS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
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
    # per-row visible key range, for the boundary blocks' mask
    key_lo = offs_m + off - win_left
    key_hi = tl.minimum(offs_m + off + win_right, Sk - 1)
    if HAS_LEFT:  # without a left window limit [lo, full_lo) is empty: compile no loop
        acc, l_i, m_i = _fwd_inner(
            acc,
            l_i,
            m_i,
            q,
            k_src,
            v_src,
            stride_kn,
            stride_vn,
            lo,
            full_lo,
            Sk,
            key_lo,
            key_hi,
            qk_scale,
            cap2,
            cap_in,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            True,
            SOFTCAP,
            STATIC_MAX,
            FAST_TANH,
            USE_TMA,
            INTERP_BF16,
            WS,
        )
    acc, l_i, m_i = _fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        k_src,
        v_src,
        stride_kn,
        stride_vn,
        full_lo,
        full_hi,
        Sk,
        key_lo,
        key_hi,
        qk_scale,
        cap2,
        cap_in,
        HEAD_DIM,
        BLOCK_D,
        BLOCK_N,
        False,
        SOFTCAP,
        STATIC_MAX,
        FAST_TANH,
        USE_TMA,
        INTERP_BF16,
        WS,
    )
    acc, l_i, m_i = _fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        k_src,
        v_src,
        stride_kn,
        stride_vn,
        full_hi,
        hi,
        Sk,
        key_lo,
        key_hi,
        qk_scale,
        cap2,
        cap_in,
        HEAD_DIM,
        BLOCK_D,
        BLOCK_N,
        True,
        SOFTCAP,
        STATIC_MAX,
        FAST_TANH,
        USE_TMA,
        INTERP_BF16,
        WS,
    )

    empty = l_i == 0.0  # rows that see no key: output 0, lse -inf
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc / l_safe[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(l_safe)) * 0.6931471805599453)
    tl.store(LSE + pid_bh.to(tl.int64) * Sq + offs_m, lse, mask=offs_m < Sq)
    _store_tile(
        o_dst,
        _cast(out, O.dtype.element_ty, INTERP_BF16),
        m0,
        offs_m,
        offs_d,
        stride_om,
        Sq,
        HEAD_DIM,
        BLOCK_D,
        USE_TMA,
    )


@triton.jit
def _attn_bwd_preprocess_kernel(
    O,
    DO,
    DELTA,
    stride_ob,
    stride_oh,
    stride_om,
    stride_dob,
    stride_doh,
    stride_dom,
    H,
    Sq,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < Sq) & (offs_d[None, :] < HEAD_DIM)
    o_ptrs = (
        O
        + b.to(tl.int64) * stride_ob
        + h.to(tl.int64) * stride_oh
        + offs_m[:, None] * stride_om
        + offs_d[None, :]
    )
    do_ptrs = (
        DO
        + b.to(tl.int64) * stride_dob
        + h.to(tl.int64) * stride_doh
        + offs_m[:, None] * stride_dom
        + offs_d[None, :]
    )
    o = tl.load(o_ptrs, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(DELTA + pid_bh.to(tl.int64) * Sq + offs_m, tl.sum(o * do, 1), mask=offs_m < Sq)


@triton.jit
def _dkdv_inner(
    dk,
    dv,
    k,
    v,
    q_src,
    do_src,
    lse_ptr,
    delta_ptr,
    stride_qm,
    stride_dom,
    start,
    stop,
    offs_n,
    Sq,
    Sk,
    off,
    win_left,
    win_right,
    qk_scale,
    cap2,
    cap_in,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr,
    SOFTCAP: tl.constexpr,
    FAST_TANH: tl.constexpr,
    USE_TMA: tl.constexpr,
    INTERP_BF16: tl.constexpr,
):
    offs_d = tl.arange(0, BLOCK_D)
    for start_m in range(start, stop, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        q = _load_tile(q_src, start_m, offs_m, offs_d, stride_qm, Sq, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        if MASKED:
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
        if MASKED:
            key_lo = offs_m + off - win_left  # per q row: visible keys key_lo..key_hi
            key_hi = tl.minimum(offs_m + off + win_right, Sk - 1)
            keep = (offs_n[:, None] >= key_lo[None, :]) & (offs_n[:, None] <= key_hi[None, :])
            pT = tl.where(keep, pT, 0.0)
        do = _load_tile(do_src, start_m, offs_m, offs_d, stride_dom, Sq, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        dv = _dot(_cast(pT, do.dtype, INTERP_BF16), do, dv, INTERP_BF16)
        dpT = _dot(v, tl.trans(do), None, INTERP_BF16)
        dsT = pT * (dpT - delta[None, :])
        if SOFTCAP:  # d(c·tanh(u))/du = c·(1 - tanh²); the c cancels against u = qk·scale/c
            dsT = dsT * (1.0 - tT * tT)
        dk = _dot(_cast(dsT, q.dtype, INTERP_BF16), q, dk, INTERP_BF16)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dkb,
    stride_dkh,
    stride_dkn,
    stride_dvb,
    stride_dvh,
    stride_dvn,
    H,
    HK,
    GROUP,
    Sq,
    Sk,
    win_left,
    win_right,
    sm_scale,
    softcap,
    SQ_KEY,
    SK_KEY,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SOFTCAP: tl.constexpr,
    FAST_TANH: tl.constexpr,
    USE_TMA: tl.constexpr,
    INTERP_BF16: tl.constexpr,
    HAS_RIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
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
    # the q heads of this kv head's group, one after another: dK/dV sum over the group
    # on chip, so no atomics are needed
    for g in range(GROUP):
        h = hk * GROUP + g
        q_base = Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
        do_base = DO + b.to(tl.int64) * stride_dob + h.to(tl.int64) * stride_doh
        q_src = _make_src(q_base, Sq, stride_qm, BLOCK_M, BLOCK_D, USE_TMA)
        do_src = _make_src(do_base, Sq, stride_dom, BLOCK_M, BLOCK_D, USE_TMA)
        row = (b * H + h).to(tl.int64) * Sq
        if HAS_RIGHT:  # rows below the band; empty without a right limit (non-causal)
            dk, dv = _dkdv_inner(
                dk,
                dv,
                k,
                v,
                q_src,
                do_src,
                LSE + row,
                DELTA + row,
                stride_qm,
                stride_dom,
                lo,
                full_lo,
                offs_n,
                Sq,
                Sk,
                off,
                win_left,
                win_right,
                qk_scale,
                cap2,
                cap_in,
                HEAD_DIM,
                BLOCK_D,
                BLOCK_M,
                True,
                SOFTCAP,
                FAST_TANH,
                USE_TMA,
                INTERP_BF16,
            )
        dk, dv = _dkdv_inner(
            dk,
            dv,
            k,
            v,
            q_src,
            do_src,
            LSE + row,
            DELTA + row,
            stride_qm,
            stride_dom,
            full_lo,
            full_hi,
            offs_n,
            Sq,
            Sk,
            off,
            win_left,
            win_right,
            qk_scale,
            cap2,
            cap_in,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_M,
            False,
            SOFTCAP,
            FAST_TANH,
            USE_TMA,
            INTERP_BF16,
        )
        dk, dv = _dkdv_inner(
            dk,
            dv,
            k,
            v,
            q_src,
            do_src,
            LSE + row,
            DELTA + row,
            stride_qm,
            stride_dom,
            full_hi,
            hi,
            offs_n,
            Sq,
            Sk,
            off,
            win_left,
            win_right,
            qk_scale,
            cap2,
            cap_in,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_M,
            True,
            SOFTCAP,
            FAST_TANH,
            USE_TMA,
            INTERP_BF16,
        )

    dk_base = DK + b.to(tl.int64) * stride_dkb + hk.to(tl.int64) * stride_dkh
    dv_base = DV + b.to(tl.int64) * stride_dvb + hk.to(tl.int64) * stride_dvh
    dk_dst = _make_src(dk_base, Sk, stride_dkn, BLOCK_N, BLOCK_D, USE_TMA)
    dv_dst = _make_src(dv_base, Sk, stride_dvn, BLOCK_N, BLOCK_D, USE_TMA)
    _store_tile(
        dk_dst,
        _cast(dk * sm_scale, DK.dtype.element_ty, INTERP_BF16),
        n0,
        offs_n,
        offs_d,
        stride_dkn,
        Sk,
        HEAD_DIM,
        BLOCK_D,
        USE_TMA,
    )
    _store_tile(
        dv_dst,
        _cast(dv, DV.dtype.element_ty, INTERP_BF16),
        n0,
        offs_n,
        offs_d,
        stride_dvn,
        Sk,
        HEAD_DIM,
        BLOCK_D,
        USE_TMA,
    )


@triton.jit
def _dq_inner(
    dq,
    q,
    do,
    lse2,
    delta,
    k_src,
    v_src,
    stride_kn,
    stride_vn,
    start,
    stop,
    Sk,
    key_lo,
    key_hi,
    qk_scale,
    cap2,
    cap_in,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASKED: tl.constexpr,
    SOFTCAP: tl.constexpr,
    FAST_TANH: tl.constexpr,
    USE_TMA: tl.constexpr,
    INTERP_BF16: tl.constexpr,
):
    offs_d = tl.arange(0, BLOCK_D)
    for start_n in range(start, stop, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        k = _load_tile(k_src, start_n, offs_n, offs_d, stride_kn, Sk, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        v = _load_tile(v_src, start_n, offs_n, offs_d, stride_vn, Sk, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        qk = _dot(q, tl.trans(k), None, INTERP_BF16)
        if SOFTCAP:
            t = _tanh(qk * cap_in, FAST_TANH)
            p = tl.math.exp2(cap2 * t - lse2[:, None])
        else:
            p = tl.math.exp2(qk * qk_scale - lse2[:, None])
        if MASKED:
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
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_dob,
    stride_doh,
    stride_dom,
    stride_dqb,
    stride_dqh,
    stride_dqm,
    H,
    GROUP,
    Sq,
    Sk,
    win_left,
    win_right,
    sm_scale,
    softcap,
    SQ_KEY,
    SK_KEY,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SOFTCAP: tl.constexpr,
    FAST_TANH: tl.constexpr,
    USE_TMA: tl.constexpr,
    REVERSE: tl.constexpr,
    INTERP_BF16: tl.constexpr,
    HAS_LEFT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
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
    if HAS_LEFT:
        dq = _dq_inner(
            dq,
            q,
            do,
            lse2,
            delta,
            k_src,
            v_src,
            stride_kn,
            stride_vn,
            lo,
            full_lo,
            Sk,
            key_lo,
            key_hi,
            qk_scale,
            cap2,
            cap_in,
            HEAD_DIM,
            BLOCK_D,
            BLOCK_N,
            True,
            SOFTCAP,
            FAST_TANH,
            USE_TMA,
            INTERP_BF16,
        )
    dq = _dq_inner(
        dq,
        q,
        do,
        lse2,
        delta,
        k_src,
        v_src,
        stride_kn,
        stride_vn,
        full_lo,
        full_hi,
        Sk,
        key_lo,
        key_hi,
        qk_scale,
        cap2,
        cap_in,
        HEAD_DIM,
        BLOCK_D,
        BLOCK_N,
        False,
        SOFTCAP,
        FAST_TANH,
        USE_TMA,
        INTERP_BF16,
    )
    dq = _dq_inner(
        dq,
        q,
        do,
        lse2,
        delta,
        k_src,
        v_src,
        stride_kn,
        stride_vn,
        full_hi,
        hi,
        Sk,
        key_lo,
        key_hi,
        qk_scale,
        cap2,
        cap_in,
        HEAD_DIM,
        BLOCK_D,
        BLOCK_N,
        True,
        SOFTCAP,
        FAST_TANH,
        USE_TMA,
        INTERP_BF16,
    )
    _store_tile(
        dq_dst,
        _cast(dq * sm_scale, DQ.dtype.element_ty, INTERP_BF16),
        m0,
        offs_m,
        offs_d,
        stride_dqm,
        Sq,
        HEAD_DIM,
        BLOCK_D,
        USE_TMA,
    )


# ----------------------------------------------------------------------------- host side

_UNBOUNDED = 1 << 30  # window side without a limit; keeps the bound arithmetic in int32
_MAX_SEQ = 1 << 23  # keeps in-head row offsets (seq·head_dim) inside int32
_HEAD_DIMS = "a multiple of 16 between 16 and 256 (tuned for 64 and 128)"
# "auto": tensor descriptors (TMA) on sm_90+ for the kernels named in _TMA_KINDS when
# alignment allows; "on": every kernel where alignment allows (tests run the descriptor path
# under the interpreter this way); "off": never.
_TMA_MODE = os.environ.get("KERNELTRIAGE_ATTN_TMA", "auto")


def _alloc(shape, dtype, device) -> torch.Tensor:
    """Uninitialised output buffer; tests replace this to poison every output with NaN."""
    return torch.empty(shape, dtype=dtype, device=device)


def _cfg(bm: int, bn: int, warps: int, stages: int) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=stages)


# Autotuning candidates, (BLOCK_M, BLOCK_N, num_warps, num_stages), kept from the sweeps of
# benchmarks/bench_attention.py on an H200 (2026-11-21, Triton 3.6). For the dK/dV kernel
# BLOCK_N is the KV block it holds and BLOCK_M the q block it streams; the others hold q and
# stream KV. Tried there and left out: tensor-descriptor (TMA) loads (within ±5% of plain
# pointer loads, no consistent winner), warp specialization of the forward's KV loop (fails
# to compile with 4 warps, 5-13% slower with 8), and rescaling the accumulator only when the
# row max grows by 2^8 (the branch in the loop costs the wgmma pipelining: 10-40% slower).
_GPU_CONFIGS = {
    "fwd": [(128, 64, 8, 3), (128, 128, 8, 3), (64, 64, 4, 3)],
    "dkdv": [(32, 64, 4, 3), (32, 128, 4, 3), (64, 128, 8, 3)],
    "dq": [(128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3)],
}
# head_dim > 128: smaller tiles and two stages, so that K/V tiles fit in shared memory and
# the fp32 accumulators in registers
_GPU_CONFIGS_BIG_D = {
    "fwd": [(64, 64, 4, 2), (64, 32, 4, 2), (128, 64, 8, 2)],
    "dkdv": [(32, 32, 4, 2), (64, 64, 8, 2)],
    "dq": [(64, 32, 4, 2), (64, 64, 8, 2)],
}
# The interpreter runs one numpy op per tile op: small tiles and one config keep CI quick.
_INTERP_CONFIGS = {"fwd": [(64, 32, 4, 1)], "dkdv": [(32, 64, 4, 1)], "dq": [(64, 32, 4, 1)]}
# Kernels that load through tensor descriptors in "auto" mode (see _TMA_MODE): none by
# default, as measured; the descriptor path stays tested and selectable.
_TMA_KINDS = {"fwd": False, "dkdv": False, "dq": False}
# Test hook: {"fwd" | "dkdv" | "dq": config tuple} replaces autotuning.
_CONFIG_OVERRIDE: dict[str, tuple] = {}


def _configs(kind: str) -> list[triton.Config]:
    table = _INTERP_CONFIGS if interpreter_mode() else _GPU_CONFIGS
    return [_cfg(*c) for c in table[kind]]


def _pruner(kind: str):
    def prune(configs, named_args, **kwargs):
        """Big head dims get their own candidates (the autotuner benchmarks what we return)."""
        head_dim = kwargs.get("HEAD_DIM", named_args.get("HEAD_DIM"))  # constexprs: kwargs
        if head_dim <= 128 or interpreter_mode():
            return configs
        return [_cfg(*c) for c in _GPU_CONFIGS_BIG_D[kind]]

    return {"early_config_prune": prune}


_KEY = ["SQ_KEY", "SK_KEY", "HEAD_DIM", "SOFTCAP", "USE_TMA", "win_left", "win_right"]
_attn_fwd_tuned = triton.autotune(_configs("fwd"), key=[*_KEY, "REVERSE"], prune_configs_by=_pruner("fwd"))(
    _attn_fwd_kernel
)
_attn_bwd_dkdv_tuned = triton.autotune(_configs("dkdv"), key=_KEY, prune_configs_by=_pruner("dkdv"))(
    _attn_bwd_dkdv_kernel
)
_attn_bwd_dq_tuned = triton.autotune(_configs("dq"), key=[*_KEY, "REVERSE"], prune_configs_by=_pruner("dq"))(
    _attn_bwd_dq_kernel
)


@dataclass(frozen=True)
class _Params:
    causal: bool
    sm_scale: float
    win_left: int  # _UNBOUNDED when the window has no left limit
    win_right: int
    softcap: float | None
    group: int


def _bucket(n: int) -> int:
    """Autotune key for a length: its power-of-two ceiling."""
    return 1 << max(n - 1, 0).bit_length()


def _parse_window(window, causal: bool) -> tuple[int, int]:
    if window is None:
        left, right = -1, -1
    else:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise KernelInputError(
                f"{_NAME}: window must be a (left, right) pair of ints (-1 or None: unbounded); "
                f"got {window!r}"
            )
        left, right = (-1 if w is None else w for w in window)
        for side, w in (("left", left), ("right", right)):
            if isinstance(w, bool) or not isinstance(w, int) or w < -1:
                raise KernelInputError(
                    f"{_NAME}: window {side} must be an int >= 0, or -1/None for unbounded; got {w!r}"
                )
    left = _UNBOUNDED if left == -1 else left
    right = _UNBOUNDED if right == -1 else right
    if causal:
        right = min(right, 0)  # causal caps the right side at the diagonal
    return left, right


def _check_inputs(q, k, v, causal, sm_scale, window, softcap) -> _Params:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise KernelInputError(f"{_NAME}: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise KernelInputError(
                f"{_NAME}: {name} must be 4-D (batch, heads, seq, head_dim) as for "
                f"F.scaled_dot_product_attention; got shape {tuple(t.shape)}"
            )
    check_device(q, k, v, name=_NAME)
    check_dtype(q, (torch.float16, torch.bfloat16), what="q", name=_NAME)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise KernelInputError(
            f"{_NAME}: q, k and v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    B, H, Sq, D = q.shape
    Bk, Hk, Sk, Dk = k.shape
    if v.shape != k.shape:
        raise KernelInputError(
            f"{_NAME}: v must have k's shape {tuple(k.shape)} (same head dim for q, k and v); "
            f"got {tuple(v.shape)}"
        )
    if Bk != B:
        raise KernelInputError(f"{_NAME}: batch sizes differ: q has {B}, k and v have {Bk}")
    if Dk != D:
        raise KernelInputError(f"{_NAME}: head dims differ: q has {D}, k and v have {Dk}")
    if D % 16 or not 16 <= D <= 256:
        raise KernelInputError(f"{_NAME}: head_dim {D} is not supported; it must be {_HEAD_DIMS}")
    if Hk == 0 or H % Hk:
        raise KernelInputError(
            f"{_NAME}: q has {H} heads and k/v have {Hk}: for GQA/MQA the k/v head count must "
            "divide the q head count"
        )
    if min(B, H, Sq, Sk) == 0:
        raise KernelInputError(f"{_NAME}: empty input: q {tuple(q.shape)}, k {tuple(k.shape)}")
    if max(Sq, Sk) >= _MAX_SEQ:
        raise KernelInputError(f"{_NAME}: sequence length {max(Sq, Sk)} is over {_MAX_SEQ}")
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, (int, float)):
            raise KernelInputError(f"{_NAME}: softcap must be a positive number; got {softcap!r}")
        if not (softcap > 0 and math.isfinite(softcap)):
            raise KernelInputError(f"{_NAME}: softcap must be a positive number; got {softcap!r}")
        softcap = float(softcap)
    if sm_scale is None:
        sm_scale = 1.0 / math.sqrt(D)
    elif (
        isinstance(sm_scale, bool)
        or not isinstance(sm_scale, (int, float))
        or not (math.isfinite(sm_scale) and sm_scale > 0)
    ):
        raise KernelInputError(f"{_NAME}: sm_scale must be a positive number; got {sm_scale!r}")
    left, right = _parse_window(window, causal)
    return _Params(bool(causal), float(sm_scale), left, right, softcap, H // Hk)


def _lastdim_contiguous(t: torch.Tensor) -> torch.Tensor:
    # the kernels take every stride from the tensor except the last, which must be 1
    t = t if t.stride(-1) == 1 else t.contiguous()
    # in-head row offsets are int32 inside the kernels
    if (t.shape[2] - 1) * t.stride(2) + t.shape[3] >= 1 << 31:
        t = t.contiguous()
    return t


def _use_tma(*tensors: torch.Tensor) -> bool:
    D = tensors[0].shape[-1]
    if _TMA_MODE == "off" or D & (D - 1):  # descriptors take the power-of-two head dim only
        return False
    if _TMA_MODE != "on" and (
        interpreter_mode()
        or tensors[0].device.type != "cuda"
        or torch.cuda.get_device_capability(tensors[0].device)[0] < 9
    ):
        return False
    size = tensors[0].element_size()
    # descriptors need 16-byte aligned bases (per batch/head) and row strides
    return all(t.data_ptr() % 16 == 0 and all(s * size % 16 == 0 for s in t.stride()[:3]) for t in tensors)


def _tma_alloc(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _ensure_allocator() -> None:
    """Descriptors built inside kernels need scratch memory from a Triton allocator; install
    one unless the application already did."""
    try:
        from triton.runtime import _allocation

        current = _allocation._allocator.get()
        if not isinstance(current, _allocation.NullAllocator):
            return
    except (ImportError, AttributeError):
        pass
    triton.set_allocator(_tma_alloc)


def _common_meta(q, k, p: _Params, use_tma: bool) -> dict:
    D = q.shape[-1]
    return dict(
        win_left=p.win_left,
        win_right=p.win_right,
        sm_scale=p.sm_scale,
        softcap=p.softcap or 1.0,
        SQ_KEY=_bucket(q.shape[2]),
        SK_KEY=_bucket(k.shape[2]),
        HEAD_DIM=D,
        BLOCK_D=triton.next_power_of_2(D),
        SOFTCAP=p.softcap is not None,
        FAST_TANH=q.device.type == "cuda" and not interpreter_mode(),
        USE_TMA=use_tma,
        INTERP_BF16=interpreter_mode() and q.dtype == torch.bfloat16,
    )


def _fwd_meta(q, k, p: _Params, use_tma: bool, ws: bool = False) -> dict:
    meta = _common_meta(q, k, p, use_tma)
    meta["STATIC_MAX"] = (
        p.softcap is not None and p.softcap <= _STATIC_MAX_SOFTCAP and q.dtype == torch.bfloat16
    )
    meta["REVERSE"] = p.causal
    meta["HAS_LEFT"] = p.win_left < _UNBOUNDED
    meta["WS"] = ws
    return meta


def _launch(kind, tuned, raw, grid, args, meta, cfg):
    cfg = cfg or _CONFIG_OVERRIDE.get(kind)
    if cfg is None:
        tuned[grid](*args, **meta)
    else:
        c = _cfg(*cfg)
        raw[grid](*args, **meta, **c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages)


def _tma_for(kind: str, eligible: bool) -> bool:
    return eligible and (_TMA_KINDS[kind] or _TMA_MODE == "on")


def _flash_fwd(q, k, v, p: _Params, cfg=None, use_tma: bool | None = None, ws: bool = False):
    """Returns (out, lse); ``cfg`` = (BLOCK_M, BLOCK_N, num_warps, num_stages) skips
    autotuning; ``use_tma`` None: decided by _use_tma and _TMA_KINDS."""
    B, H, Sq, D = q.shape
    Sk = k.shape[2]
    o = _alloc((B, H, Sq, D), q.dtype, q.device)
    lse = _alloc((B, H, Sq), torch.float32, q.device)
    use_tma = _tma_for("fwd", _use_tma(q, k, v, o)) if use_tma is None else use_tma
    if use_tma and q.device.type == "cuda":
        _ensure_allocator()
    meta = _fwd_meta(q, k, p, use_tma, ws)
    args = (
        q,
        k,
        v,
        o,
        lse,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        *o.stride()[:3],
        H,
        p.group,
        Sq,
        Sk,
    )
    grid = lambda m: (triton.cdiv(Sq, m["BLOCK_M"]), B * H)
    _launch("fwd", _attn_fwd_tuned, _attn_fwd_kernel, grid, args, meta, cfg)
    return o, lse


def _flash_bwd(do, q, k, v, o, lse, p: _Params, cfgs=None, use_tma: bool | None = None, parts=("dkdv", "dq")):
    """Returns (dq, dk, dv); ``cfgs`` = {"dkdv": cfg, "dq": cfg} skips autotuning; ``parts``
    lets the benchmark time one of the two kernels."""
    B, H, Sq, D = q.shape
    Hk, Sk = k.shape[1], k.shape[2]
    BLOCK_D = triton.next_power_of_2(D)
    delta = _alloc((B, H, Sq), torch.float32, q.device)
    pre_bm = 32 if interpreter_mode() else 128
    _attn_bwd_preprocess_kernel[(triton.cdiv(Sq, pre_bm), B * H)](
        o,
        do,
        delta,
        *o.stride()[:3],
        *do.stride()[:3],
        H,
        Sq,
        HEAD_DIM=D,
        BLOCK_D=BLOCK_D,
        BLOCK_M=pre_bm,
    )
    dq = _alloc(q.shape, q.dtype, q.device)
    dk = _alloc(k.shape, k.dtype, k.device)
    dv = _alloc(v.shape, v.dtype, v.device)
    eligible = _use_tma(q, k, v, do, dq, dk, dv) if use_tma is None else use_tma
    tma = {kind: _tma_for(kind, eligible) if use_tma is None else use_tma for kind in ("dkdv", "dq")}
    if (tma["dkdv"] or tma["dq"]) and q.device.type == "cuda":
        _ensure_allocator()
    meta = _common_meta(q, k, p, tma["dkdv"])
    cfgs = cfgs or {}
    args = (
        q,
        k,
        v,
        do,
        lse,
        delta,
        dk,
        dv,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        *do.stride()[:3],
        *dk.stride()[:3],
        *dv.stride()[:3],
        H,
        Hk,
        p.group,
        Sq,
        Sk,
    )
    grid = lambda m: (triton.cdiv(Sk, m["BLOCK_N"]), B * Hk)
    if "dkdv" in parts:
        _launch(
            "dkdv",
            _attn_bwd_dkdv_tuned,
            _attn_bwd_dkdv_kernel,
            grid,
            args,
            {**meta, "HAS_RIGHT": p.win_right < _UNBOUNDED},
            cfgs.get("dkdv"),
        )
    args = (
        q,
        k,
        v,
        do,
        lse,
        delta,
        dq,
        *q.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        *do.stride()[:3],
        *dq.stride()[:3],
        H,
        p.group,
        Sq,
        Sk,
    )
    grid = lambda m: (triton.cdiv(Sq, m["BLOCK_M"]), B * H)
    meta.update(REVERSE=p.causal, HAS_LEFT=p.win_left < _UNBOUNDED, USE_TMA=tma["dq"])
    if "dq" in parts:
        _launch("dq", _attn_bwd_dq_tuned, _attn_bwd_dq_kernel, grid, args, meta, cfgs.get("dq"))
    return dq, dk, dv


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, params: _Params):
        q, k, v = (_lastdim_contiguous(t) for t in (q, k, v))
        o, lse = _flash_fwd(q, k, v, params)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.params = params
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _flash_bwd(_lastdim_contiguous(do), q, k, v, o, lse, ctx.params)
        return dq, dk, dv, None


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
    params = _check_inputs(q, k, v, causal, sm_scale, window, softcap)
    o, lse = _FlashAttention.apply(q, k, v, params)
    return (o, lse) if return_lse else o
