"""Comparison helpers shared by the norm tests (imported, not collected)."""

from __future__ import annotations

import torch

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
DTYPES = (BF16, FP16, FP32)
# Relative to |ref| + rms(ref): 2-4x the rounding of the output dtype (half an ulp is 2^-9 for
# bf16, 2^-11 for fp16); fp32 leaves room for fp32 sums over 65536 elements. The same under
# Triton's interpreter: the kernels round fp32 -> bf16 to nearest there too (its own cast
# truncates).
TOL = {BF16: 2**-7, FP16: 2**-9, FP32: 1e-5}


def randn(gen, shape, dtype, device, scale=1.0, shift=0.0):
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * scale + shift).to(
        device=device, dtype=dtype
    )


def assert_close(out, ref, dtype, what, seed, tol=None):
    """|out − ref| <= tol·(|ref| + rms(ref)) elementwise (tol: TOL[dtype] unless given); NaN
    never passes."""
    tol = TOL[dtype] if tol is None else tol
    out64, ref64 = out.double().cpu(), ref.double().cpu()
    assert out64.shape == ref64.shape, f"{what}: shape {tuple(out64.shape)} != {tuple(ref64.shape)}"
    scale = ref64.pow(2).mean().sqrt().item() or 1.0
    err = (out64 - ref64).abs()
    bound = tol * (ref64.abs() + scale)
    ok = err <= bound  # False where out is NaN
    if not bool(ok.all()):
        bad = (~ok).nonzero()[0].tolist()
        raise AssertionError(
            f"{what} ({dtype}, seed {seed}): {int((~ok).sum())} of {ok.numel()} elements off; "
            f"first at {bad}: got {out64[tuple(bad)].item()!r}, want {ref64[tuple(bad)].item()!r}; "
            f"max err/scale {(err / scale).nan_to_num(float('inf')).max().item():.3g}, tol {tol:.3g}"
        )
