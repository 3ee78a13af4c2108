"""flash_attention (kerneltriage/kernels/attention) against a float64 reference, on CUDA or
through Triton's interpreter.

The rule is FlashAttention's: the kernel's max error (output, LSE, dq, dk, dv) against the
float64 math path must be at most twice the error of PyTorch's math path run in the input
dtype, plus one ulp of the largest reference value. Every output buffer is pre-filled with
NaN, so an element the kernels fail to write shows up. Inputs are drawn fresh for each case
(seeded by the case id, so failures reproduce).
"""

from __future__ import annotations

import re
import zlib

import pytest
import torch
import torch.nn.functional as F

from kerneltriage.errors import KernelInputError
from kerneltriage.kernels import config
from kerneltriage.kernels.attention import flash_attention, launch
from kerneltriage.kernels.attention.reference import attention_ref

BF16, FP16 = torch.bfloat16, torch.float16


@pytest.fixture(autouse=True)
def _poison_outputs():
    with config.override(poison=True):
        yield


# B, H, HK, SQ, SK, D, dtype, options. Lengths are deliberately not multiples of the blocks.
CASES = {
    "dense-67-bf16": (2, 4, 4, 67, 67, 64, BF16, {}),
    "dense-bshd-strided-fp16": (2, 4, 4, 100, 100, 64, FP16, {"layout": "bshd"}),
    "causal-160-bf16": (2, 4, 4, 160, 160, 64, BF16, {"causal": True}),
    "causal-sq<sk-fp16": (2, 4, 4, 67, 200, 64, FP16, {"causal": True}),
    "causal-sq>sk-bf16": (2, 4, 4, 200, 67, 64, BF16, {"causal": True}),  # top rows see nothing
    # the GPU's default tile shapes (128-row q blocks, 32-row q blocks in dK/dV)
    "gqa-8:2-causal-gpu-tiles-bf16": (1, 8, 2, 130, 130, 64, BF16, {"causal": True, "gpu_tiles": 1}),
    "mqa-4:1-dense-fp16": (1, 4, 1, 90, 150, 64, FP16, {}),
    "window-40,16-fp16": (2, 4, 4, 150, 150, 64, FP16, {"window": (40, 16)}),
    "causal-win48-sq<sk-bf16": (2, 4, 4, 150, 190, 64, BF16, {"causal": True, "window": (48, -1)}),
    # a small cap and a large scale saturate tanh, so the chain rule through it matters
    "softcap-5-bf16": (2, 4, 4, 100, 100, 64, BF16, {"softcap": 5.0, "sm_scale": 0.5}),
    "softcap-30-gqa-causal-fp16": (2, 4, 2, 100, 100, 64, FP16, {"causal": True, "softcap": 30.0}),
    "softcap-80-window-bf16": (1, 4, 4, 120, 120, 64, BF16, {"softcap": 80.0, "window": (30, 30)}),
    "d128-causal-scale-bf16": (1, 4, 4, 80, 80, 128, BF16, {"causal": True, "sm_scale": 0.3}),
    "d96-fp16": (1, 4, 4, 70, 70, 96, FP16, {}),
    # the tensor-descriptor (TMA) code path of Hopper GPUs, run by the interpreter
    "tma-gqa-win-bf16": (1, 4, 2, 150, 150, 64, BF16, {"causal": True, "window": (64, None), "tma": 1}),
}


def _inputs(case_id, device, B, H, HK, SQ, SK, D, dtype, layout="bhsd"):
    gen = torch.Generator().manual_seed(zlib.crc32(case_id.encode()))

    def make(heads, seq):
        if layout == "bshd":  # (B, S, H, D) storage seen through a transpose, as models do
            t = torch.randn(B, seq, heads, D, generator=gen).transpose(1, 2)
        else:
            t = torch.randn(B, heads, seq, D, generator=gen)
        return t.to(device=device, dtype=dtype).requires_grad_()

    q, k, v = make(H, SQ), make(HK, SK), make(HK, SK)
    dout = torch.randn(B, H, SQ, D, generator=gen).to(device=device, dtype=dtype)
    return q, k, v, dout


def _max_err(a, b):
    return (a.double() - b.double()).abs().max().item()


def _check(name, got, ref, base, dtype):
    assert got.shape == ref.shape and got.dtype == dtype, (name, got.shape, got.dtype)
    assert torch.isfinite(got).all(), f"{name}: NaN/inf, i.e. unwritten or broken elements"
    err, base_err = _max_err(got, ref), _max_err(base, ref)
    floor = torch.finfo(dtype).eps * ref.abs().max().item()
    assert err <= 2 * base_err + floor, f"{name}: error {err:.3g} > 2 × math-path {base_err:.3g}"


@pytest.mark.parametrize("case_id", list(CASES))
def test_matches_reference(case_id, device):
    B, H, HK, SQ, SK, D, dtype, opts = CASES[case_id]
    opts = dict(opts)
    layout = opts.pop("layout", "bhsd")
    settings = {}
    if opts.pop("tma", False):
        settings["attention_tma"] = "on"
    if opts.pop("gpu_tiles", False):
        settings["attention_configs"] = {kind: launch.GPU_CONFIGS[kind][0] for kind in ("fwd", "dkdv", "dq")}
    q, k, v, dout = _inputs(case_id, device, B, H, HK, SQ, SK, D, dtype, layout)

    with config.override(**settings):
        out, lse = flash_attention(q, k, v, **opts, return_lse=True)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    assert not lse.requires_grad and lse.dtype == torch.float32 and lse.shape == (B, H, SQ)

    out_ref, lse_ref = attention_ref(q, k, v, **opts, compute_dtype=torch.float64)
    grads_ref = torch.autograd.grad(out_ref, (q, k, v), dout.double())
    out_pt, lse_pt = attention_ref(q, k, v, **opts)  # PyTorch's math path in the input dtype
    grads_pt = torch.autograd.grad(out_pt, (q, k, v), dout)

    _check("out", out, out_ref, out_pt, dtype)
    for name, g, g_ref, g_pt in zip(("dq", "dk", "dv"), grads, grads_ref, grads_pt, strict=True):
        _check(name, g, g_ref, g_pt, dtype)

    # LSE: -inf exactly where a row sees no key, and fp32-accurate elsewhere
    assert not torch.isnan(lse).any(), "lse: NaN (unwritten rows)"
    empty = torch.isneginf(lse_ref)
    assert torch.equal(torch.isneginf(lse), empty)
    if opts.get("causal") and SQ > SK:
        assert empty.any() and (out[:, :, : SQ - SK] == 0).all()
    err, base_err = _max_err(lse[~empty], lse_ref[~empty]), _max_err(lse_pt[~empty], lse_ref[~empty])
    assert err <= 2 * base_err + 1e-5, f"lse: error {err:.3g} > 2 × math-path {base_err:.3g}"
    if "softcap" not in opts or not device.startswith("cuda"):  # GPU softcap: tanh.approx
        assert err <= 1e-3 * max(1.0, lse_ref[~empty].abs().max().item()), f"lse: error {err:.3g}"


def test_causal_is_sdpa_drop_in(device):
    """flash_attention(q, k, v, causal=True) computes F.scaled_dot_product_attention(q, k, v,
    is_causal=True), gradients included."""
    q, k, v, dout = _inputs("sdpa", device, 2, 4, 4, 67, 67, 64, BF16)
    out = flash_attention(q, k, v, causal=True)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    expected = F.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    grads_expected = torch.autograd.grad(expected, (q64, k64, v64), dout.double())
    base = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grads_base = torch.autograd.grad(base, (q, k, v), dout)
    _check("out", out, expected, base, BF16)
    for name, g, g_exp, g_base in zip("qkv", grads, grads_expected, grads_base, strict=True):
        _check(f"d{name}", g, g_exp, g_base, BF16)


def test_bad_inputs_raise_precise_errors(device):
    def qkv(B=1, H=4, HK=4, S=16, D=64, dtype=BF16):
        q = torch.randn(B, H, S, D, device=device, dtype=dtype)
        k = torch.randn(B, HK, S, D, device=device, dtype=dtype)
        return q, k, k.clone()

    cases = [
        (qkv(dtype=torch.float32), {}, "dtype float32"),
        ((qkv()[0], *qkv(dtype=FP16)[1:]), {}, "share one dtype"),
        ((qkv()[0][0], *qkv()[1:]), {}, "must be 4-D"),
        (qkv(D=72), {}, "head_dim 72"),
        (qkv(D=512), {}, "head_dim 512"),
        (qkv(H=6, HK=4), {}, "must divide the q head count"),
        ((qkv(B=2)[0], *qkv(B=1)[1:]), {}, "batch sizes differ"),
        ((*qkv()[:2], qkv(S=8)[2]), {}, "v must have k's shape"),
        (qkv(), {"window": (1,)}, "window must be a (left, right) pair"),
        (qkv(), {"window": 5}, "window must be a (left, right) pair"),
        (qkv(), {"window": (-2, 0)}, "window left must be an int >= 0"),
        (qkv(), {"window": (3, 1.5)}, "window right must be an int >= 0"),
        (qkv(), {"window": (True, 0)}, "window left must be an int >= 0"),
        (qkv(), {"softcap": 0.0}, "softcap must be a positive number"),
        (qkv(), {"softcap": float("nan")}, "softcap must be a positive number"),
        (qkv(), {"sm_scale": -1.0}, "sm_scale must be a positive number"),
    ]
    for (q, k, v), kwargs, message in cases:
        with pytest.raises(KernelInputError, match=re.escape(message)):
            flash_attention(q, k, v, **kwargs)

    if device == "cpu":  # CPU tensors only run under the interpreter
        with config.override(interpreter=False), pytest.raises(KernelInputError, match="need a CUDA device"):
            flash_attention(*qkv())
