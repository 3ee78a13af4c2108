"""Where a norm call's host time goes on a GPU machine (issue 20): host µs per call of
F.rms_norm, ours through the fast launch path, ours through Triton's own path, ours with the
launch stubbed out (Python only), one bare Triton launch of the same kernel, and the pieces of
the fast path; the state of every cached launcher; and a cProfile of the wrappers. Two passes:
the Python path (bound closures, ``autograd.Function``), then the C++ bound calls
(``kernels/native.py``, built between the passes).

    PYTHONPATH=. python3 benchmarks/probes/launch_overhead.py --out results/launch_overhead.json

Needs a CUDA GPU, torch with CUDA and triton; the C++ pass needs ninja and a C++ compiler
(without them it reports why and times the Python path only). BENCHMARKS.md's host µs tables.

Host µs per call: best of 30 rounds of 100 calls issued without a synchronization (one
synchronization between rounds, so the launch queue never fills).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.nn.functional as F
import triton

from kerneltriage.kernels import config, fast_launch, fused_add_rms_norm, layer_norm, rms_norm
from kerneltriage.kernels.fast_launch import _arg_class, _Driver
from kerneltriage.kernels.norms import launch as NL


def host_us(fn, calls: int = 100, rounds: int = 30) -> float:
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
    torch.cuda.synchronize()
    return best


def profile_top(fn, n: int = 2000, top: int = 25) -> str:
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    out = io.StringIO()
    pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("launch_overhead.json"))
    args = ap.parse_args()
    res: dict = {
        "versions": {"torch": torch.__version__, "triton": triton.__version__},
        "gpu": torch.cuda.get_device_name(),
        "loadavg": os.getloadavg(),
        "cpus": os.cpu_count(),
    }
    M, N = 4096, 1024
    dt = torch.bfloat16
    x = torch.randn(M, N, device="cuda", dtype=dt)
    r = torch.randn(M, N, device="cuda", dtype=dt)
    w = torch.rand(N, device="cuda", dtype=dt)
    b = torch.randn(N, device="cuda", dtype=dt)
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    dy = torch.randn_like(x)
    bg = b.clone().requires_grad_()

    def cases() -> dict:
        """The calls to time; the graphs that the backward cases replay are made after the
        warm-up calls, so that they come from the path being measured."""
        c = {
            "F.rms_norm fwd": lambda: F.rms_norm(x, (N,), w, 1e-6),
            "F.layer_norm fwd": lambda: F.layer_norm(x, (N,), w, b, 1e-5),
            "ours rms_norm fwd": lambda: rms_norm(x, w),
            "ours layer_norm fwd": lambda: layer_norm(x, w, b),
            "ours fused_add_rms_norm fwd": lambda: fused_add_rms_norm(x, r, w),
            "F.rms_norm fwd, x requires grad": lambda: F.rms_norm(xg, (N,), wg, 1e-6),
            "ours rms_norm fwd, x requires grad": lambda: rms_norm(xg, wg),
            "F.layer_norm fwd, x requires grad": lambda: F.layer_norm(xg, (N,), wg, bg, 1e-5),
            "ours layer_norm fwd, x requires grad": lambda: layer_norm(xg, wg, bg),
            "ours fused_add_rms_norm fwd, x requires grad": lambda: fused_add_rms_norm(xg, r, wg),
        }
        for fn in c.values():
            for _ in range(3):
                fn()  # autotune, compile, resolve, bind
        graphs = {
            "F.rms_norm bwd": (F.rms_norm(xg, (N,), wg, 1e-6), (xg, wg)),
            "ours rms_norm bwd": (rms_norm(xg, wg), (xg, wg)),
            "F.layer_norm bwd": (F.layer_norm(xg, (N,), wg, bg, 1e-5), (xg, wg, bg)),
            "ours layer_norm bwd": (layer_norm(xg, wg, bg), (xg, wg, bg)),
            "ours fused_add_rms_norm bwd": (fused_add_rms_norm(xg, r, wg)[0], (xg, wg)),
        }
        for name, (out, wrt) in graphs.items():
            c[name] = lambda out=out, wrt=wrt: torch.autograd.grad(out, wrt, dy, retain_graph=True)
            for _ in range(3):
                c[name]()  # the backward binds its gradient signature
        c["torch.empty(4096,1024)"] = lambda: torch.empty(M, N, device="cuda", dtype=dt)
        torch.cuda.synchronize()
        return c

    from kerneltriage.kernels import native
    from kerneltriage.kernels.norms import fast

    # Pass 1: the Python path (bound closures, autograd.Function); pass 2: the C++ calls.
    native._State.why = "held back for the Python pass"
    times = {}
    for name, fn in cases().items():
        times[name] = host_us(fn)
        if name.startswith("ours"):
            with config.override(fast_launch=False):
                times[name + " (Triton's launch path)"] = host_us(fn)
            with config.override(launcher=lambda *a: None):
                times[name + " (launch stubbed: Python only)"] = host_us(fn)
    native._State.why = None
    t0 = time.perf_counter()
    built = native.build()
    res["native"] = {"status": native.status(), "build_s": round(time.perf_counter() - t0, 1)}
    if built is not None:
        fast._forget()
        for name, fn in cases().items():
            if name.startswith("ours"):
                times[name + " (C++ call)"] = host_us(fn)
        res["native"]["bound"] = len(fast.TABLE) if fast.TABLE is not None else 0
    # one bare launch of the forward kernel, both ways, and the fast path's pieces
    plan = NL.plan(
        "fwd", N, (dt, dt, dt, None),
        tuple({"IS_RMS": True, "HAS_RES": False, "HAS_W": True, "HAS_B": False, "CAST_X": False,
               "INTERP": False}.items()),
        x.device, None, False,
    )  # fmt: skip
    y = torch.empty_like(x)
    rstd = torch.empty(M, device="cuda", dtype=torch.float32)
    kargs = (x, None, w, None, y, None, None, rstd, M, N, N, 0, N, 0, 1e-6, 0.0)
    grid = plan.grid(M, N, plan.kwargs)
    kernel = NL.KERNELS["fwd"]
    times["bare kernel[grid](...)"] = host_us(lambda: kernel[grid](*kargs, **plan.kwargs))
    times["fast_launch(kernel, ...)"] = host_us(
        lambda: fast_launch.fast_launch(kernel, grid, kargs, plan.kwargs)
    )
    times["_arg_class(args)"] = host_us(lambda: _arg_class(kargs))
    times["_Driver.device()"] = host_us(_Driver.device)
    times["_Driver.stream(0)"] = host_us(lambda: _Driver.stream(0))
    times["_Driver.hooks_set()"] = host_us(_Driver.hooks_set)
    res["host_us"] = times
    res["driver"] = {"ok": _Driver.ok, "failed": _Driver.failed}
    from kerneltriage.kernels.norms import fast

    res["bound"] = {
        "fwd": [str((k[0], k[-3], k[-2])) for k in fast._FWD],
        "bwd": [str((k[0][0], k[-3], k[-2])) for k in fast._BWD],
    }
    res["launchers"] = [
        {
            "kernel": fl.kernel.fn.__name__,
            "why_triton_path": fl.why,
            "classes": len(fl.compiled),
            "scratch": [e[5] for e in fl.compiled.values()],
        }
        for fl in fast_launch._LAUNCHERS.values()
    ]
    c = cases()
    res["profile ours rms_norm fwd"] = profile_top(c["ours rms_norm fwd"])
    res["profile ours rms_norm bwd"] = profile_top(c["ours rms_norm bwd"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1, default=str))
    for k, v in times.items():
        print(f"{k:<60}{v:8.1f} µs")
    print(json.dumps({k: res[k] for k in ("driver", "bound", "loadavg", "native")}, indent=1, default=str))
    print(res["profile ours rms_norm fwd"][:4000])


if __name__ == "__main__":
    main()
