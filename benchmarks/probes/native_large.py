"""The C++ bound norm call at large shapes: do_bench and the kernel's GPU time, Python path
against C++ path, in one process (a probe for kernels/native.py). BENCHMARKS.md, "Build
robustness": the same kernel time either way at 16384x4096 and 32768x8192.

    PYTHONPATH=. python3 benchmarks/probes/native_large.py

Needs a CUDA GPU, torch with CUDA, triton, ninja and a C++ compiler."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

from kerneltriage.kernels import native, rms_norm
from kerneltriage.kernels.norms import fast


def gpu_us(fn, n=20):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    ks = [e for e in p.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return {k.name[:40]: round(sum(e.device_time for e in ks if e.name == k.name) / n, 1) for k in ks}


def main(shape):
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(shape[1], device="cuda", dtype=torch.bfloat16)
    m, table = native._State.module, fast.TABLE
    native._State.module, native._State.why, fast.TABLE = None, "held back", None
    fast._forget()
    for _ in range(3):
        rms_norm(x, w)
    py = do_bench(lambda: rms_norm(x, w), warmup=20, rep=200) * 1e3
    pyk = gpu_us(lambda: rms_norm(x, w))
    native._State.why = None
    if m is None:
        native.build()
    else:
        native._State.module, fast.TABLE = m, table
    fast._forget()
    for _ in range(3):
        rms_norm(x, w)
    print("table", len(fast.TABLE))
    cc = do_bench(lambda: rms_norm(x, w), warmup=20, rep=200) * 1e3
    cck = gpu_us(lambda: rms_norm(x, w))
    print(shape, f"python {py:.1f} µs {pyk}  |  C++ {cc:.1f} µs {cck}")


for shape in ((16384, 4096), (32768, 8192), (4096, 1024)):
    main(shape)
