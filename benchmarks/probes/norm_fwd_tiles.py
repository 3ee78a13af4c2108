"""Forward tiles of the norms at a large shape against torch.compile's kernel (issue 20: RMSNorm
forward at 32768x8192 ran at 0.94x of torch.compile on an H200). Times ours under each forced
tile configuration and the compiled eager RMSNorm, and prints the Inductor kernel's launch
configuration.

    PYTHONPATH=. TORCH_LOGS=output_code python3 benchmarks/probes/norm_fwd_tiles.py 2>inductor.log

Needs a CUDA GPU, torch with CUDA and triton. BENCHMARKS.md, "RMSNorm forward at 32768×8192
against torch.compile".
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import triton
from triton.testing import do_bench

from kerneltriage.kernels import config, rms_norm
from kerneltriage.kernels.norms.launch import row_config
from kerneltriage.kernels.norms.reference import rms_norm_ref


def main() -> None:
    M, N = (int(v) for v in (sys.argv[1] if len(sys.argv) > 1 else "32768x8192").split("x"))
    x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(N, device="cuda", dtype=torch.bfloat16)
    gb = 2 * M * N * 2 / 1e9
    c = torch.compile(rms_norm_ref, dynamic=False)
    c(x, w, 1e-6)
    ms = do_bench(lambda: c(x, w, 1e-6), warmup=50, rep=300)
    print(f"compile            {ms * 1e3:8.1f} µs {gb / ms * 1e3:7.0f} GB/s")
    ms = do_bench(lambda: rms_norm(x, w), warmup=50, rep=300)
    print(f"ours (autotuned)   {ms * 1e3:8.1f} µs {gb / ms * 1e3:7.0f} GB/s")
    n = triton.next_power_of_2(N)
    tiles = []
    for warps in (4, 8, 16, 32):
        for evict in ("", "evict_first"):
            tiles.append((f"one row, {warps} warps, evict '{evict}'", warps, 1, n, False, 0, evict))
    for warps, bn, pps in ((8, 2048, 4), (8, 4096, 4), (16, 4096, 2), (4, 2048, 8)):
        tiles.append((f"looped {bn}, {warps} warps, {pps}/SM", warps, 1, bn, True, pps, "evict_first"))
    # one program per row, as Inductor's looped reduction (pass 1 evict_last, pass 2 evict_first)
    for warps in (4, 8, 16):
        for bn in (1024, 2048, 4096):
            if bn < N:
                tiles.append((f"looped {bn}, {warps} warps, a program per row", warps, 1, bn, True, 0, ""))
    for name, warps, bm, bn, looped, pps, evict in tiles:
        cfg = row_config(warps, bm, bn, looped, pps)
        cfg = triton.Config({**cfg.kwargs, "EVICT_X": evict}, num_warps=cfg.num_warps, num_stages=1)
        try:
            with config.override(norm_configs=(("fwd", cfg),)):
                y = rms_norm(x, w)
                torch.testing.assert_close(y, c(x, w, 1e-6), atol=2e-2, rtol=2e-2)
                ms = do_bench(lambda: rms_norm(x, w), warmup=50, rep=300)
            print(f"{name:<40}{ms * 1e3:8.1f} µs {gb / ms * 1e3:7.0f} GB/s")
        except Exception as e:
            print(f"{name:<40} failed: {type(e).__name__}: {str(e)[:100]}")


if __name__ == "__main__":
    main()
