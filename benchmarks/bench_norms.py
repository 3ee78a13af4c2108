"""GPU benchmark of the built-in norm kernels (kerneltriage/kernels/norms).

    PYTHONPATH=. python3 benchmarks/bench_norms.py --out results/norms.json

Needs a CUDA GPU, torch with CUDA and triton; Liger-Kernel (``pip install liger-kernel``) is a
baseline when it imports. ``benchmarks/gpu_kernels.sh`` runs it with the settings BENCHMARKS.md's
tables were measured with.

1. Checks every kernel on the GPU first, against a float64 reference with outputs and workspaces
   poisoned with NaN: RMSNorm, LayerNorm and the fused residual-add + RMSNorm, forward and every
   gradient, at each benchmark shape (bf16, the autotuned configuration), with every candidate
   configuration of the autotuner on a short batch, and on odd shapes in fp16/fp32.
2. Times forward, backward and forward+backward in bf16 with triton.testing.do_bench (median of
   events; the L2 is flushed before each call, and inputs rotate over several buffer sets that
   together exceed the L2) for: ours, eager PyTorch (float, pow, mean, rsqrt, mul),
   F.rms_norm / F.layer_norm, torch.compile of the eager version, and Liger-Kernel when it imports.
   Bytes are what must cross HBM once: inputs + outputs + weights (forward 2·M·N·2, backward
   3·M·N·2 for the norms, 4·M·N·2 each way for the fused add). A device-to-device copy measured
   in the same run is the bandwidth ceiling (bytes read + written).
   Each case also gets the GPU time of its kernels alone (torch.profiler: the sum of kernel
   durations per call, launch gaps and host work excluded) and the host time per call: the
   wall time of 50 calls issued back to back without a synchronization (CUDA launches queue
   up; the queue holds them all), divided by 50 (Python, checks, allocation and launch
   overhead). When host > GPU, the call is launch-bound and do_bench's figure is the host's,
   not the kernels'.
3. Prints the tables (µs and host µs per call, GB/s, % of copy; then GPU and host µs) and writes
   everything to --out as JSON.

``--dry-run`` runs the same code path on CPU through Triton's interpreter on tiny shapes, with a
wall-clock timer instead of do_bench, to check the script itself. ``--shapes``, ``--methods``
(``ours-triton``: ours with every launch through ``kernel[grid](...)``, the fast launch path
off) and ``--checks`` narrow a run to the shapes, baselines and checks wanted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

SHAPES = [(4096, 1024), (16384, 4096), (32768, 8192), (8192, 16384), (4096, 65536)]
DRY_SHAPES = [(64, 256), (8, 20000)]
L2_BYTES = 60 * 2**20
EPS_RMS, EPS_LN = 1e-6, 1e-5


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("norms.json"))
    p.add_argument("--deadline-s", type=float, default=290.0, help="stop timing after this long")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile baselines")
    p.add_argument("--dry-run", action="store_true", help="CPU + Triton interpreter, tiny shapes")
    p.add_argument("--shapes", default="", help="M×N list, e.g. 4096x1024,16384x4096 (default: all)")
    p.add_argument(
        "--methods",
        default="ours,torch,eager,liger",
        help="besides compile; 'ours-triton' = ours with every launch through Triton's own path",
    )
    p.add_argument(
        "--checks", choices=("full", "shapes", "none"), default="full",
        help="full: every shape, every candidate config, odd shapes; shapes: every shape only",
    )  # fmt: skip
    return p.parse_args()


ARGS = _parse()
if ARGS.dry_run:
    os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

from kerneltriage.kernels import config, norms  # noqa: E402
from kerneltriage.kernels.norms import launch as L  # noqa: E402
from kerneltriage.kernels.norms.reference import (  # noqa: E402
    fused_add_rms_norm_ref,
    layer_norm_ref,
    rms_norm_ref,
)

T0 = time.perf_counter()
DEV = "cpu" if ARGS.dry_run else "cuda"
RESULTS: dict = {
    "date": time.strftime("%Y-%m-%d"),
    "command": " ".join(sys.argv),
    "versions": {"torch": torch.__version__, "triton": triton.__version__, "python": sys.version},
    "correctness": [],
    "timings": [],
    "autotune_trials": [],
    "errors": [],
    "skipped": [],
}


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


def save() -> None:
    ARGS.out.parent.mkdir(parents=True, exist_ok=True)
    ARGS.out.write_text(json.dumps(RESULTS, indent=1, default=str))


def time_left() -> float:
    return ARGS.deadline_s - (time.perf_counter() - T0)


# ---- environment ---------------------------------------------------------------------------------

if not ARGS.dry_run:
    props = torch.cuda.get_device_properties(0)
    RESULTS["device"] = {
        "name": props.name,
        "sm_count": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "memory_bytes": props.total_memory,
        "cuda": torch.version.cuda,
    }
    L2_BYTES = getattr(props, "L2_cache_size", L2_BYTES) or L2_BYTES
try:
    import importlib.metadata

    from liger_kernel.transformers.fused_add_rms_norm import LigerFusedAddRMSNorm
    from liger_kernel.transformers.layer_norm import LigerLayerNorm
    from liger_kernel.transformers.rms_norm import LigerRMSNorm

    RESULTS["versions"]["liger_kernel"] = importlib.metadata.version("liger-kernel")
    HAVE_LIGER = not ARGS.dry_run
except Exception as e:  # not installed, or fails to import: benchmark without it
    RESULTS["versions"]["liger_kernel"] = f"unavailable: {e!r}"
    HAVE_LIGER = False


# ---- timing --------------------------------------------------------------------------------------


def bench_ms(fn) -> tuple[float, float, float]:
    """(median, p20, p80) in ms."""
    if ARGS.dry_run:
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t) * 1e3)
        times.sort()
        return times[1], times[0], times[2]
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    est = (time.perf_counter() - t) / 3 * 1e3
    warmup = min(50.0, max(5.0, 5 * est))
    rep = min(200.0, max(40.0, 30 * est))
    q = triton.testing.do_bench(fn, warmup=warmup, rep=rep, quantiles=[0.5, 0.2, 0.8])
    return q[0], q[1], q[2]


def host_us(fn, reps: int = 50) -> float:
    """Host µs per call: ``reps`` calls issued without a synchronization (their launches queue
    up on the device), after one that drains the queue; best of 3 such rounds."""
    best = float("inf")
    for _ in range(3):
        fn()
        if not ARGS.dry_run:
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t) / reps * 1e6)
    return best


def gpu_and_host_us(fn, reps: int = 10) -> tuple[float | None, float]:
    """(µs of GPU kernel time per call from torch.profiler, µs of host time per call)."""
    host = host_us(fn, reps=3 if ARGS.dry_run else 50)
    if ARGS.dry_run:
        return None, host
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for e in prof.key_averages():
        total += getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
    return total / reps, host


def _cpu_bench(call, quantiles):
    t = time.perf_counter()
    call()
    ms = (time.perf_counter() - t) * 1e3
    return [ms] * len(quantiles)


def _log_autotune(tuned, name: str) -> None:
    """Record every configuration the autotuner times (and time them a little faster)."""
    if ARGS.dry_run:
        tuned._do_bench = _cpu_bench
    else:
        tuned._do_bench = lambda call, quantiles: triton.testing.do_bench(
            call, warmup=10, rep=40, quantiles=quantiles
        )
    orig = tuned._bench
    n_index = tuned.arg_names.index("N")

    def bench(*args, config, **meta):
        r = orig(*args, config=config, **meta)
        flags = {k: v for k, v in meta.items() if k.isupper()}
        RESULTS["autotune_trials"].append(
            {"kernel": name, "N": args[n_index], "flags": flags, "config": str(config), "ms": r[0]}
        )
        return r

    tuned._bench = bench


if ARGS.dry_run:
    # Exercise the autotuner under the interpreter too (the library uses one fixed config there).
    L._interpreter_config = lambda kind, N: None


for _kind, _tuner in L.TUNERS.items():
    _log_autotune(_tuner, _kind)


def copy_bandwidth() -> None:
    n = (2**30 if not ARGS.dry_run else 2**20) // 2
    src = torch.randn(n, device=DEV, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms, lo, hi = bench_ms(lambda: dst.copy_(src))
    rec = {"bytes": 4 * n, "ms": ms, "p20_ms": lo, "p80_ms": hi, "gbps": 4 * n / ms / 1e6}
    # Measured at the start (the ceiling used in the table) and again at the end (drift check).
    RESULTS["copy" if "copy" not in RESULTS else "copy_end"] = rec
    log(f"device-to-device copy: {rec['gbps']:.0f} GB/s ({4 * n / 1e9:.2f} GB moved)")


# ---- the ops and their implementations -----------------------------------------------------------
# Each implementation: make(N, dtype) -> (fn, params); fn(x, residual) -> output tensor(s),
# params: tensors that get gradients besides the activations.


def _params(n, dtype, bias):
    g = torch.Generator().manual_seed(n)
    w = (torch.rand(n, generator=g) + 0.5).to(DEV, dtype).requires_grad_()
    b = torch.randn(n, generator=g).to(DEV, dtype).requires_grad_() if bias else None
    return w, b


def _module(mod, w, b):
    mod = mod.to(DEV, w.dtype)
    with torch.no_grad():
        mod.weight.copy_(w)
        if b is not None:
            mod.bias.copy_(b)
    return mod


_COMPILED: dict[str, object] = {}


def _compiled(name, fn):
    if name not in _COMPILED:
        _COMPILED[name] = torch.compile(fn, dynamic=False)
    return _COMPILED[name]


def rms_impls(n, dtype):
    w, _ = _params(n, dtype, False)
    impls = {
        "ours": (lambda x, r: norms.rms_norm(x, w, EPS_RMS), [w]),
        "eager": (lambda x, r: rms_norm_ref(x, w, EPS_RMS), [w]),
        "torch": (lambda x, r: F.rms_norm(x, (n,), w, EPS_RMS), [w]),
    }
    if not ARGS.no_compile:
        c = _compiled("rms", rms_norm_ref)
        impls["compile"] = (lambda x, r: c(x, w, EPS_RMS), [w])
    impls["ours-triton"] = impls["ours"]
    if HAVE_LIGER:
        m = _module(LigerRMSNorm(n, eps=EPS_RMS, in_place=False), w, None)
        impls["liger"] = (lambda x, r: m(x), [m.weight])
    return impls


def ln_impls(n, dtype):
    w, b = _params(n, dtype, True)
    impls = {
        "ours": (lambda x, r: norms.layer_norm(x, w, b, EPS_LN), [w, b]),
        "eager": (lambda x, r: layer_norm_ref(x, w, b, EPS_LN), [w, b]),
        "torch": (lambda x, r: F.layer_norm(x, (n,), w, b, EPS_LN), [w, b]),
    }
    if not ARGS.no_compile:
        c = _compiled("ln", layer_norm_ref)
        impls["compile"] = (lambda x, r: c(x, w, b, EPS_LN), [w, b])
    impls["ours-triton"] = impls["ours"]
    if HAVE_LIGER:
        m = _module(LigerLayerNorm(n, eps=EPS_LN, bias=True), w, b)
        impls["liger"] = (lambda x, r: m(x), [m.weight, m.bias])
    return impls


def _eager_add_torch(x, r, w, n):
    h = x + r
    return F.rms_norm(h, (n,), w, EPS_RMS), h


def add_impls(n, dtype):
    w, _ = _params(n, dtype, False)
    impls = {
        "ours": (lambda x, r: norms.fused_add_rms_norm(x, r, w, EPS_RMS), [w]),
        "eager": (lambda x, r: fused_add_rms_norm_ref(x, r, w, EPS_RMS), [w]),
        "torch": (lambda x, r: _eager_add_torch(x, r, w, n), [w]),
    }
    if not ARGS.no_compile:
        c = _compiled("add", fused_add_rms_norm_ref)
        impls["compile"] = (lambda x, r: c(x, r, w, EPS_RMS), [w])
    impls["ours-triton"] = impls["ours"]
    if HAVE_LIGER:
        m = _module(LigerFusedAddRMSNorm(n, eps=EPS_RMS, in_place=False), w, None)
        impls["liger"] = (lambda x, r: m(x, r), [m.weight])
    return impls


OPS = {"rms_norm": rms_impls, "layer_norm": ln_impls, "fused_add_rms_norm": add_impls}


def hbm_bytes(op, mode, m, n, s=2):
    """Bytes that must cross HBM once (s bytes per element): activations in and out, plus
    forward: weight (+ bias) read; backward: weight read, dweight (+ dbias) written."""
    vecs = 2 if op == "layer_norm" else 1
    fwd = (4 if op == "fused_add_rms_norm" else 2) * m * n * s + vecs * n * s
    bwd = (4 if op == "fused_add_rms_norm" else 3) * m * n * s + (1 + vecs) * n * s
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[mode]


# ---- correctness ---------------------------------------------------------------------------------

TOL = {torch.bfloat16: 2**-7, torch.float16: 2**-9, torch.float32: 1e-5}
if ARGS.dry_run:
    TOL[torch.bfloat16] = 2**-6  # the interpreter truncates fp32 -> bf16


def _err(out, ref, dtype):
    """max |out − ref| / (|ref| + rms(ref)) in units of the dtype's tolerance (ok when <= 1)."""
    out, ref = out.double(), ref.double()
    scale = ref.pow(2).mean().sqrt().item() or 1.0
    ratio = ((out - ref).abs() / (ref.abs() + scale)).nan_to_num(float("inf")).max().item()
    return ratio / TOL[dtype]


def check(op, m, n, dtype, forced=None, note=""):
    """Run the host functions with NaN-poisoned outputs; compare with float64 autograd."""
    g = torch.Generator().manual_seed(int(time.time_ns() % 2**31))
    shift = 3.0 if op == "layer_norm" else 0.0

    def rnd(*shape, scale=1.0, s=0.0):
        return (torch.randn(shape, generator=g) * scale + s).to(DEV, dtype)

    x, dy = rnd(m, n, scale=2.0, s=shift), rnd(m, n)
    w = rnd(n, scale=0.5, s=1.0)
    b = rnd(n) if op == "layer_norm" else None
    r = rnd(m, n) if op == "fused_add_rms_norm" else None
    dres = rnd(m, n) if op == "fused_add_rms_norm" else None
    eps = EPS_LN if op == "layer_norm" else EPS_RMS

    def nan(*shape):
        return torch.full(shape, float("nan"), device=DEV, dtype=dtype)

    with config.override(norm_configs=forced or {}, poison=True):
        y, h = nan(m, n), nan(m, n)
        _, _, mean, rstd = L.norm_fwd(
            x, w, b, r, eps, op != "layer_norm", out=y, residual_out=h if r is not None else None
        )
        dx, dw, db = nan(m, n), nan(n), nan(n)
        L.norm_bwd(
            dy,
            h if r is not None else x,
            w,
            mean,
            rstd,
            dresidual=dres,
            need_db=b is not None,
            dx_out=dx,
            dw_out=dw,
            db_out=db if b is not None else None,
        )

    leaves = [t.double().requires_grad_() for t in (x, w, b, r) if t is not None]
    if op == "rms_norm":
        refs = [rms_norm_ref(leaves[0], leaves[1], eps)]
        outs, gouts = [y], [dy]
    elif op == "layer_norm":
        refs = [layer_norm_ref(leaves[0], leaves[1], leaves[2], eps)]
        outs, gouts = [y], [dy]
    else:
        refs = list(fused_add_rms_norm_ref(leaves[0], leaves[2], leaves[1], eps, residual_dtype=dtype))
        outs, gouts = [y, h], [dy, dres]
    grads = torch.autograd.grad(refs, leaves, [t.double() for t in gouts])
    got = {"y": outs[0], "dx": dx, "dw": dw}
    want = {"y": refs[0], "dx": grads[0], "dw": grads[1]}
    if b is not None:
        got["db"], want["db"] = db, grads[2]
    if r is not None:
        got["new_residual"], want["new_residual"] = h, refs[1]
        got["dresidual"], want["dresidual"] = dx, grads[2]
    errs = {k: _err(got[k], want[k].detach(), dtype) for k in got}
    ok = all(e <= 1.0 for e in errs.values())
    RESULTS["correctness"].append(
        {
            "op": op,
            "shape": [m, n],
            "dtype": str(dtype),
            "config": note or "autotuned",
            "err_over_tol": errs,
            "ok": ok,
        }
    )
    if not ok:
        log(f"CORRECTNESS FAILURE {op} {m}x{n} {dtype} {note}: {errs}")
    return ok


def check_baselines(op, m, n):
    """Each baseline's forward against the float64 reference (catches a misconfigured one)."""
    dtype = torch.bfloat16
    impls = OPS[op](n, dtype)
    x = (torch.randn(m, n, device=DEV) * 2 + (3.0 if op == "layer_norm" else 0.0)).to(dtype)
    r = torch.randn(m, n, device=DEV).to(dtype) if op == "fused_add_rms_norm" else None
    for name, (fn, params) in impls.items():
        if name in ("compile",):
            continue  # checked implicitly: compiled from the same reference code
        with torch.no_grad():
            out = fn(x, r)
            out = out[0] if isinstance(out, tuple) else out
            p = [t.double() for t in params]
            if op == "rms_norm":
                ref = rms_norm_ref(x.double(), p[0], EPS_RMS)
            elif op == "layer_norm":
                ref = layer_norm_ref(x.double(), p[0], p[1], EPS_LN)
            else:
                ref = fused_add_rms_norm_ref(x.double(), r.double(), p[0], EPS_RMS)[0]
        e = _err(out, ref, dtype)
        RESULTS["correctness"].append(
            {
                "op": op,
                "shape": [m, n],
                "dtype": "bf16",
                "config": f"baseline {name}",
                "err_over_tol": {"y": e},
                "ok": e <= 2,
            }
        )


# ---- timing one (op, shape) ----------------------------------------------------------------------


def time_op(op, m, n, methods):
    dtype = torch.bfloat16
    impls = OPS[op](n, dtype)
    s = 2
    set_bytes = (6 if op == "fused_add_rms_norm" else 3) * m * n * s
    nsets = max(2, min(8, math.ceil(3 * L2_BYTES / set_bytes)))
    sets = []
    for _ in range(nsets):
        x = torch.randn(m, n, device=DEV, dtype=dtype).requires_grad_()
        r = (
            torch.randn(m, n, device=DEV, dtype=dtype).requires_grad_()
            if op == "fused_add_rms_norm"
            else None
        )
        grads = [torch.randn(m, n, device=DEV, dtype=dtype)]
        if r is not None:
            grads.append(torch.randn(m, n, device=DEV, dtype=dtype))
        sets.append((x, r, grads))
    copy_gbps = RESULTS.get("copy", {}).get("gbps")
    for name in methods:
        if name not in impls:
            continue
        fn, params = impls[name]

        # ours-triton: the same wrappers, every launch through kernel[grid](...) (the fast
        # launch path off), to show what the fast path saves
        def launch_cfg(name=name):
            return config.override(fast_launch=False) if name == "ours-triton" else contextlib.nullcontext()

        for mode in ("fwd", "bwd", "fwd+bwd"):
            if time_left() < 0:
                RESULTS["skipped"].append(f"{op} {m}x{n} {name} {mode}: deadline")
                continue
            try:
                with launch_cfg():
                    run = _mode_fn(fn, params, sets, mode)
                    ms, lo, hi = bench_ms(run)
            except Exception as e:
                RESULTS["errors"].append(f"{op} {m}x{n} {name} {mode}: {e!r}")
                log(f"ERROR {op} {m}x{n} {name} {mode}: {e!r}")
                traceback.print_exc(limit=3)
                continue
            try:
                with launch_cfg():
                    gpu_us, host_us = gpu_and_host_us(run)
            except Exception as e:  # keep the do_bench figure without them
                RESULTS["errors"].append(f"{op} {m}x{n} {name} {mode} profiler: {e!r}")
                gpu_us, host_us = None, None
            nbytes = hbm_bytes(op, mode, m, n, s)
            gbps = nbytes / ms / 1e6
            RESULTS["timings"].append(
                {
                    "op": op,
                    "shape": [m, n],
                    "method": name,
                    "mode": mode,
                    "ms": ms,
                    "p20_ms": lo,
                    "p80_ms": hi,
                    "bytes": nbytes,
                    "gbps": gbps,
                    "pct_copy": 100 * gbps / copy_gbps if copy_gbps else None,
                    "buffer_sets": nsets,
                    "gpu_us": gpu_us,
                    "gpu_gbps": nbytes / gpu_us / 1e3 if gpu_us else None,
                    "host_us": host_us,
                }
            )
        torch.cuda.empty_cache() if not ARGS.dry_run else None


def _mode_fn(fn, params, sets, mode):
    """The callable that do_bench times for one mode, rotating over the buffer sets."""
    it = [0]

    def nxt():
        k = it[0] % len(sets)
        it[0] += 1
        return sets[k]

    def inputs(x, r):
        return [x] + ([r] if r is not None else []) + params

    def outs(o):
        return list(o) if isinstance(o, tuple) else [o]

    if mode == "fwd":

        def run():
            x, r, _ = nxt()
            fn(x, r)

    elif mode == "bwd":
        graphs = [(outs(fn(x, r)), inputs(x, r), g) for x, r, g in sets]

        def run():
            o, i, g = graphs[it[0] % len(graphs)]
            it[0] += 1
            torch.autograd.grad(o, i, g, retain_graph=True)

    else:

        def run():
            x, r, g = nxt()
            torch.autograd.grad(outs(fn(x, r)), inputs(x, r), g)

    return run


# ---- main ----------------------------------------------------------------------------------------


def _candidate_set(n, i):
    """The i-th candidate (cyclically) of every kernel kind, as forced ``norm_configs``."""
    return {kind: c(n)[i % len(c(n))] for kind, c in L.CANDIDATES.items()}


def _describe(cfg, n):
    split = n > config.current().norm_split_bwd_above
    used = ["fwd", "bwd_dots", "bwd_split"] if split else ["fwd", "bwd"]
    return " | ".join(
        f"{k} {cfg[k]}".replace(", num_ctas: 1, num_stages: 1, maxnreg: None", "") for k in used
    )


def _shapes() -> list[tuple[int, int]]:
    if ARGS.dry_run:
        return DRY_SHAPES
    if not ARGS.shapes:
        return SHAPES
    return [tuple(int(v) for v in s.lower().replace("×", "x").split("x")) for s in ARGS.shapes.split(",")]


def main() -> None:
    shapes = _shapes()
    methods = [m for m in ARGS.methods.split(",") if m]
    RESULTS["methods"] = methods
    if not ARGS.dry_run:  # ours at its fastest: the C++ bound calls (kernels/native.py), built now
        from kerneltriage.kernels import native

        t = time.perf_counter()
        native.build()
        RESULTS["versions"]["native"] = f"{native.status()} ({time.perf_counter() - t:.1f} s)"
        log(f"native bound calls: {RESULTS['versions']['native']}")
    copy_bandwidth()
    save()
    if ARGS.checks == "none":
        log("correctness: skipped (--checks none)")
    else:
        checks(shapes)
    # Timing: everything but torch.compile first; then torch.compile (slow to compile), op by
    # op, so that a deadline leaves whole ops measured.
    for m, n in shapes:
        for op in OPS:
            if time_left() < 0:
                RESULTS["skipped"].append(f"{op} {m}x{n}: deadline")
                continue
            time_op(op, m, n, methods)
        log(f"timed {', '.join(methods)} at {m}x{n}")
        save()
    if not ARGS.no_compile:
        for op in OPS:
            for m, n in shapes:
                if time_left() < 0:
                    RESULTS["skipped"].append(f"{op} {m}x{n} compile: deadline")
                    continue
                time_op(op, m, n, ["compile"])
            log(f"timed compile for {op}")
            save()

    copy_bandwidth()
    RESULTS["autotune_best"] = {str(k): str(v) for k, v in L.TUNED.items()}
    RESULTS["wall_s"] = time.perf_counter() - T0
    save()
    print_gpu_host_table()
    print_table()


def checks(shapes) -> None:
    log("correctness: every op at every shape (bf16, autotuned config)")
    for m, n in shapes:
        for op in OPS:
            check(op, m, n, torch.bfloat16)
            check_baselines(op, min(m, 512), n)
        save()
    if ARGS.checks == "shapes":
        return
    log("correctness: every candidate config on a short batch of each width")
    for _, n in shapes:
        mm = 272 if not ARGS.dry_run else 9
        for i in range(max(len(c(n)) for c in L.CANDIDATES.values())):
            cfg = _candidate_set(n, i)
            for op in OPS:
                check(op, mm, n, torch.bfloat16, cfg, note=_describe(cfg, n))
        save()
    log("correctness: odd shapes in fp16/fp32 (one candidate config each: no autotuning)")
    odd = [(1823, 781, torch.float16), (1823, 781, torch.float32), (15, 4097, torch.float32)]
    odd += [(1, 65536, torch.float16)]
    if ARGS.dry_run:
        odd = [(37, 781, torch.float16), (5, 4097, torch.float32), (1, 65536, torch.float16)]
    for i, (m, n, dtype) in enumerate(odd):
        cfg = _candidate_set(n, i)
        for op in OPS:
            check(op, m, n, dtype, cfg, note=_describe(cfg, n))
    save()
    bad = [c for c in RESULTS["correctness"] if not c["ok"]]
    log(f"correctness: {len(RESULTS['correctness']) - len(bad)} ok, {len(bad)} failed")


def print_gpu_host_table() -> None:
    print("\nGPU µs (kernels only, torch.profiler) | host µs per call; * = host-bound (host > GPU)")
    rows = {}
    for t in RESULTS["timings"]:
        rows.setdefault((t["op"], tuple(t["shape"]), t["method"]), {})[t["mode"]] = t
    print(
        f"{'op':<19}{'M×N':>12} {'method':<12}"
        + "".join(f"{m + ' gpu':>13}{'host':>8}" for m in ("fwd", "bwd", "fwd+bwd"))
    )
    for (op, shape, method), modes in rows.items():
        line = f"{op:<19}{f'{shape[0]}×{shape[1]}':>12} {method:<12}"
        for mode in ("fwd", "bwd", "fwd+bwd"):
            t = modes.get(mode)
            if t is None or t.get("gpu_us") is None or t.get("host_us") is None:
                line += f"{'-':>13}{'-':>8}"
            else:
                star = "*" if t["host_us"] > t["gpu_us"] else " "
                line += f"{t['gpu_us']:>12.1f}{star}{t['host_us']:>8.1f}"
        print(line)


def print_table() -> None:
    copy = RESULTS.get("copy", {}).get("gbps", float("nan"))
    dev = RESULTS.get("device", {}).get("name", "cpu (dry run)")
    v = RESULTS["versions"]
    print(
        f"\n{RESULTS['date']}  {dev}  torch {v['torch']}  triton {v['triton']}  "
        f"liger {v.get('liger_kernel')}  copy {copy:.0f} GB/s"
    )
    print(
        "µs: median of do_bench (L2 flushed, rotating inputs) | host µs per call (issued without "
        "a sync) | GB/s | % of copy; bf16"
    )
    rows = {}
    for t in RESULTS["timings"]:
        rows.setdefault((t["op"], tuple(t["shape"]), t["method"]), {})[t["mode"]] = t
    hdr = f"{'op':<19}{'M×N':>12} {'method':<12}" + "".join(
        f"{mode + ' µs':>11}{'host':>7}{'GB/s':>7}{'%':>5}" for mode in ("fwd", "bwd", "fwd+bwd")
    )
    print(hdr)
    for (op, shape, method), modes in rows.items():
        line = f"{op:<19}{f'{shape[0]}×{shape[1]}':>12} {method:<12}"
        for mode in ("fwd", "bwd", "fwd+bwd"):
            t = modes.get(mode)
            if t is None:
                line += f"{'-':>11}{'-':>7}{'-':>7}{'-':>5}"
            else:
                host = "-" if t.get("host_us") is None else f"{t['host_us']:.1f}"
                line += f"{t['ms'] * 1e3:>11.1f}{host:>7}{t['gbps']:>7.0f}{100 * t['gbps'] / copy:>5.0f}"
        print(line)
    bad = [c for c in RESULTS["correctness"] if not c["ok"]]
    print(
        f"correctness: {len(RESULTS['correctness']) - len(bad)} ok, {len(bad)} failed; "
        f"errors {len(RESULTS['errors'])}; skipped {len(RESULTS['skipped'])}; wall {RESULTS.get('wall_s', 0):.0f}s"
    )


if __name__ == "__main__":
    try:
        main()
    except Exception:
        RESULTS["errors"].append(traceback.format_exc())
        save()
        raise
