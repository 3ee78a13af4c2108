"""GPU benchmark of kerneltriage's flash attention against SDPA, FlexAttention and naive eager.

    PYTHONPATH=. python benchmarks/bench_attention.py --out results/attention.json \
        [--parts check,sweep,table,variants] [--budget-s 540]

Needs a CUDA GPU, torch with CUDA (FlexAttention: torch >= 2.5) and triton;
``benchmarks/gpu_kernels.sh`` runs it with the settings BENCHMARKS.md's tables were measured with.

Parts (each writes its results into the JSON as soon as it finishes):
  check     correctness on the GPU first: odd shapes (ragged lengths, Sq != Sk, GQA, window,
            softcap, D 64/96/128/256, fp16/bf16) against a float64 math reference with the
            test suite's rule (error <= 2x PyTorch's same-dtype math path + 1 ulp), through
            tensor descriptors (TMA) and through plain pointers.
  sweep     the kernels one by one with explicit configs (BLOCK_M, BLOCK_N, warps, stages),
            with and without TMA (and warp specialization for the forward), at S=4096; every
            timed config is also checked against fp32 SDPA on a (batch 0, heads 0-1) slice.
  table     the issue's sweep: bf16, B*S = 16k tokens, S in 1k..16k, H*D = 2048 (D=64: H=32,
            D=128: H=16), causal or not, forward and backward, for flash_attention (autotuned
            public API), F.scaled_dot_product_attention (backend named from its kernels) and
            naive eager attention (skipped where its S x S tensors would not fit).
  variants  B4 H32 S4096 D128 bf16: plain, causal, causal + window 1024, causal + softcap 30
            for ours, FlexAttention (torch.compile) and SDPA (plain and causal only).

TFLOP/s: forward 4*B*H*S^2*D (halved if causal; 4*B*H*S*W*D for a window of W), backward
2.5x the forward count. Times are medians of triton.testing.do_bench (L2 flushed per run).
Table and variants also give each implementation's host time per forward call and per
forward + backward call (``*_host_fwd_us``, ``*_host_fwdbwd_us``): the wall time of calls
issued back to back without a synchronization (their kernels queue up on the GPU), divided by
their number, best of 3 rounds (Python, autograd, allocation and launch overhead). Where it
exceeds do_bench's time, the call is launch-bound and do_bench's figure is the host's.
Kernels are compiled beforehand in a pool of processes (Triton's and Inductor's on-disk
caches are shared), so no compilation lands in a timing. The last thing printed is a compact
table; the JSON holds every figure.

``--smoke`` runs the parts on CPU through Triton's interpreter (set here) on tiny shapes, to
test this script; the sweep, whose tile configs are the GPU's, is skipped there.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import sys
import time
import traceback

# --smoke: Triton picks its CPU interpreter when it is first imported (torch may import it)
if "--smoke" in sys.argv[1:]:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from kerneltriage.kernels import attention as A  # noqa: E402
from kerneltriage.kernels import config  # noqa: E402
from kerneltriage.kernels.attention import launch as L  # noqa: E402
from kerneltriage.kernels.attention.reference import attention_ref  # noqa: E402

T0 = time.time()
# FlexAttention's compiled backward donates buffers, which forbids the retain_graph=True that
# timing a backward repeatedly needs; donation only saves memory
import torch._functorch.config  # noqa: E402

torch._functorch.config.donated_buffer = False
SMOKE = False  # --smoke: tiny shapes on CPU through the interpreter, to test this script
DEV = os.environ.get("BENCH_DEVICE", "cuda")  # "cpu" + TRITON_INTERPRET=1 to test locally

# --------------------------------------------------------------------------- configs

# Config tuples are (BLOCK_M, BLOCK_N, warps, stages), as in attention.launch.tile_config. Run 1
# (2026-11-21) swept a wider grid with and without tensor descriptors; run 2 swept these
# lists plus a lazily rescaling forward (since removed: 10-40% slower). Warp specialization
# of the forward's KV loop failed to compile with 4 warps ("PassManager::run failed" in
# NVGPUWarpSpecialization) and ran 5-13% slower than plain pipelining with 8 (FWD_WS).
# Run 3 (2026-11-22, H100) adds the Triton tutorial's Hopper settings: more stages, BLOCK_N 128
# with 8 warps (the tutorial drops 8-warp tiles under 128x128 on Hopper), and warp
# specialization with 2-4 stages.
FWD_SWEEP = [
    (128, 64, 8, 3),
    (128, 64, 8, 4),
    (128, 128, 8, 3),
    (128, 128, 8, 2),
    (64, 64, 4, 3),
    (128, 64, 4, 3),
    (128, 64, 8, 5),
    (128, 128, 8, 4),
    (128, 32, 4, 4),
]
FWD_TMA = [(128, 64, 8, 3), (128, 128, 8, 3), (128, 128, 8, 4), (128, 64, 8, 4)]  # descriptors
FWD_WS = [(128, 64, 8, 3), (128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 8, 2)]  # descriptors + WS
DKDV_SWEEP = [  # (BLOCK_M: q rows streamed, BLOCK_N: kv rows held, warps, stages)
    (32, 64, 4, 3),
    (32, 64, 4, 4),
    (32, 64, 4, 2),
    (32, 128, 4, 3),
    (64, 128, 8, 3),
    (32, 128, 8, 4),
    (16, 64, 4, 3),
    (32, 128, 4, 5),
    (64, 128, 8, 2),
    (64, 64, 4, 3),
]
DQ_SWEEP = [  # (BLOCK_M: q rows held, BLOCK_N: kv rows streamed, warps, stages)
    (128, 64, 8, 3),
    (128, 64, 8, 4),
    (128, 64, 4, 3),
    (128, 128, 8, 3),
    (64, 64, 4, 3),
    (64, 64, 4, 4),
    (128, 32, 4, 5),
    (128, 32, 8, 4),
]
DQ_TMA = [(128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3)]

# --------------------------------------------------------------------------- helpers


def elapsed() -> float:
    return time.time() - T0


def log(*args) -> None:
    print(f"[{elapsed():6.1f}s]", *args, flush=True)


def fwd_flops(B, H, S, D, causal=False, window=None) -> float:
    if window is not None:
        return 4.0 * B * H * S * window * D
    return 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)


def tflops(flop: float, ms: float | None) -> float | None:
    return None if not ms else flop / (ms * 1e-3) / 1e12


def bench_ms(fn, rep: int = 100) -> float:
    if SMOKE:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


# Host timing: up to HOST_CALLS calls a round, fewer where each keeps the GPU busy long, so a
# cell queues at most ~HOST_QUEUE_MS of GPU work (a few dozen launches: the launch queue never
# fills, which would make the host wait for the GPU and time the GPU instead).
HOST_CALLS, HOST_MIN_CALLS, HOST_ROUNDS, HOST_QUEUE_MS = 20, 3, 3, 150.0


def host_us(fn, gpu_ms: float | None) -> float:
    """Host µs per call of ``fn``: calls issued back to back without a synchronization, after
    one that drains the queue; the best of HOST_ROUNDS rounds. ``gpu_ms``: do_bench's time
    per call, which sets how many calls a round makes."""
    if SMOKE:
        calls, rounds = 2, 1
    else:
        fit = int(HOST_QUEUE_MS / (HOST_ROUNDS * gpu_ms)) if gpu_ms else HOST_CALLS
        calls, rounds = max(HOST_MIN_CALLS, min(HOST_CALLS, fit)), HOST_ROUNDS
    fn()  # warm: the allocator's blocks, any lazy set-up
    best = float("inf")
    for _ in range(rounds):
        sync()
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
    sync()  # the queued kernels finish here, not inside the next timing
    return best


def add_host_times(row: dict, name: str, fn, q, k, v, do) -> None:
    """row[name_host_fwd_us], row[name_host_fwdbwd_us]: host µs per forward call, and per
    forward + backward call (each call's graph freed before the next; no retain_graph)."""
    fwd_ms, bwd_ms = row.get(f"{name}_fwd_ms"), row.get(f"{name}_bwd_ms")

    def fwd():
        fn(q, k, v)

    def fwd_bwd():
        torch.autograd.grad(fn(q, k, v), (q, k, v), do)

    try:
        row[f"{name}_host_fwd_us"] = host_us(fwd, fwd_ms)
        row[f"{name}_host_fwdbwd_us"] = host_us(fwd_bwd, fwd_ms and bwd_ms and fwd_ms + bwd_ms)
    except Exception as e:  # the GPU timings stand; say why the host's are missing
        row[f"{name}_host_error"] = f"{type(e).__name__}: {str(e)[:300]}"


def rel_rms(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    if not torch.isfinite(got).all():
        return float("nan")
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make_qkv(B, H, HK, S, D, dtype=torch.bfloat16, seed=0, grad=False, sk=None):
    g = torch.Generator(device=DEV).manual_seed(seed)
    sk = S if sk is None else sk

    def rnd(*shape):
        return torch.randn(*shape, device=DEV, dtype=dtype, generator=g).requires_grad_(grad)

    return rnd(B, H, S, D), rnd(B, HK, sk, D), rnd(B, HK, sk, D), rnd(B, H, S, D).detach()


def window_pair(spec):
    """Check specs carry the (left, right) pair as "win"; the others a causal width "window"."""
    if "win" in spec:
        return None if spec["win"] is None else tuple(spec["win"])
    return None if spec.get("window") is None else (spec["window"], 0)


# ----------------------------------------------------------------- compile-ahead pool


def _pool_init():
    if DEV == "cpu":  # local test of this script through the interpreter
        _interpreter_numpy_shim()


def run_kernel_once(spec: dict) -> None:
    """Launch what `spec` times, once, on uninitialised inputs: compiles it into the cache."""
    kind = spec["kind"]
    B, H, HK, S, D = spec["B"], spec["H"], spec["HK"], spec["S"], spec["D"]
    dtype = getattr(torch, spec.get("dtype", "bfloat16"))
    q, k, v, do = make_qkv(B, H, HK, S, D, dtype, seed=1, sk=spec.get("Sk"))
    p = L.check_inputs(q, k, v, spec["causal"], spec.get("sm_scale"), window_pair(spec), spec.get("softcap"))
    if kind == "fwd":
        L.flash_fwd(q, k, v, p, cfg=spec["cfg"], use_tma=spec["tma"], ws=spec.get("ws", False))
    elif kind in ("dkdv", "dq"):
        o, lse = torch.zeros_like(q), torch.zeros(B, H, S, device=DEV)
        L.flash_bwd(do, q, k, v, o, lse, p, cfgs={kind: spec["cfg"]}, use_tma=spec["tma"], parts=(kind,))
    elif kind == "flex":
        q, k, v, do = make_qkv(B, H, HK, S, D, seed=1, grad=True)
        out = flex_call(spec)(q, k, v)
        torch.autograd.grad(out, (q, k, v), do)
    sync()


def _compile_job(spec: dict) -> str | None:
    try:
        run_kernel_once(spec)
        return None
    except Exception as e:  # reported, and the spec is skipped in the main process
        return f"{type(e).__name__}: {str(e)[:400]}"


def precompile(specs: list[dict], timeout_s: float = 240.0) -> dict[str, str]:
    """Compile every spec in worker processes; returns {spec key: error} for the failures."""
    todo, seen = [], set()
    for s in specs:
        key = spec_key(s)
        if key not in seen:
            seen.add(key)
            todo.append(s)
    if SMOKE or not todo:
        return {}
    log(f"compiling {len(todo)} kernels in a pool")
    errors: dict[str, str] = {}
    try:
        pool = mp.get_context("spawn").Pool(min(14, len(todo)), initializer=_pool_init)
    except Exception as e:  # no pool: the main process compiles as it goes
        log(f"no compile pool ({e}); compiling serially")
        return {}
    try:
        pending = [(s, pool.apply_async(_compile_job, (s,))) for s in todo]
        deadline = time.time() + timeout_s
        for s, res in pending:
            try:
                err = res.get(timeout=max(1.0, deadline - time.time()))
            except mp.TimeoutError:
                err = "compile timed out in the pool"
            if err:
                errors[spec_key(s)] = err
    finally:
        pool.terminate()
        pool.join()
    log(f"compiled; {len(errors)} failed", sorted(set(errors.values()))[:3])
    if len(errors) > len(todo) // 2:  # the pool itself is broken: let the main process try
        log("most compiles failed in the pool; ignoring the pool's verdicts")
        return {}
    return errors


def spec_key(s: dict) -> str:
    return json.dumps(s, sort_keys=True)


# ----------------------------------------------------------------------- FlexAttention

_FLEX = {}


def flex_call(spec: dict):
    """A compiled FlexAttention callable for spec's variant (causal / window / softcap)."""
    key = (spec["S"], spec.get("window"), spec.get("softcap"), spec["causal"])
    if key in _FLEX:
        return _FLEX[key]
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    S, W, cap = spec["S"], spec.get("window"), spec.get("softcap")

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def sliding(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= W)

    def softcap_mod(score, b, h, q_idx, kv_idx):
        return cap * torch.tanh(score / cap)

    mask = sliding if W is not None else causal
    block_mask = create_block_mask(mask, None, None, S, S, device=DEV)
    # --smoke: eager (the path of this script, not Inductor's CPU compile, is what it tests)
    compiled = flex_attention if SMOKE else torch.compile(flex_attention, dynamic=False)
    score_mod = softcap_mod if cap is not None else None
    fn = lambda q, k, v: compiled(q, k, v, score_mod=score_mod, block_mask=block_mask)
    _FLEX[key] = fn
    return fn


# ------------------------------------------------------------------------ naive eager


def naive_attention(q, k, v, causal: bool):
    """What a model without a fused kernel runs: scores, mask, softmax, matmul, in bf16."""
    S = q.shape[2]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
    if causal:
        mask = torch.ones(S, S, device=q.device, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf"))
    return torch.softmax(att, dim=-1) @ v


def naive_fits(B, H, S) -> bool:
    # forward keeps ~3 S x S bf16 tensors for autograd, backward ~3 more at its peak
    return B * H * S * S * 2 * 7 < 100e9


# ------------------------------------------------------------------------- SDPA backend


def sdpa_backend(B=4, H=16, S=4096, D=128) -> dict:
    """Names the SDPA backend from the kernels a forward + backward actually launches."""
    from torch.profiler import ProfilerActivity, profile

    q, k, v, do = make_qkv(B, H, H, S, D, grad=True)
    for causal in (False, True):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.autograd.grad(out, (q, k, v), do)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.autograd.grad(out, (q, k, v), do)
        torch.cuda.synchronize()
    names = sorted({e.key for e in prof.key_averages()})
    hints = ("flash", "fmha", "attention", "attn", "cudnn", "sdpa", "mha", "xmma", "sm90")
    kernels = [n for n in names if any(h in n.lower() for h in hints)]
    text = " ".join(kernels).lower()
    if "cudnn" in text or "fort_native_sdpa" in text or "xmma" in text:
        backend = "cuDNN attention"
    elif "flash" in text:
        backend = "flash (FlashAttention kernels in PyTorch)"
    elif "fmha" in text or "efficient" in text:
        backend = "memory-efficient (CUTLASS fmha)"
    else:
        backend = "math or unknown"
    flags = {
        "flash": torch.backends.cuda.flash_sdp_enabled(),
        "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
        "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
        "math": torch.backends.cuda.math_sdp_enabled(),
    }
    return {"backend": backend, "kernels": kernels[:12], "enabled": flags}


# ------------------------------------------------------------------------------ check


CHECK_CASES = [  # B, H, HK, Sq, Sk, D, dtype, options
    (2, 4, 4, 67, 67, 64, torch.bfloat16, {}),
    (2, 4, 4, 300, 300, 64, torch.bfloat16, {"causal": True}),
    (2, 4, 4, 67, 300, 64, torch.float16, {"causal": True}),
    (2, 4, 4, 300, 67, 64, torch.bfloat16, {"causal": True}),
    (2, 8, 2, 257, 257, 64, torch.bfloat16, {"causal": True}),
    (1, 4, 1, 200, 333, 128, torch.float16, {}),
    (2, 4, 4, 300, 300, 64, torch.float16, {"window": (40, 16)}),
    (2, 4, 4, 400, 450, 128, torch.bfloat16, {"causal": True, "window": (100, None)}),
    (2, 4, 4, 300, 300, 128, torch.bfloat16, {"softcap": 30.0}),
    (2, 4, 2, 300, 300, 64, torch.float16, {"causal": True, "softcap": 30.0}),
    (1, 4, 4, 250, 250, 64, torch.bfloat16, {"softcap": 80.0, "window": (30, 30)}),
    (1, 4, 4, 200, 200, 128, torch.bfloat16, {"causal": True, "sm_scale": 0.3}),
    (1, 4, 4, 170, 170, 96, torch.float16, {"causal": True}),
    (1, 2, 2, 300, 300, 256, torch.bfloat16, {"causal": True}),
]
# the first autotuning candidate of each kernel (its favourite at the benchmark shapes)
CHECK_CFG = {kind: L.GPU_CONFIGS[kind][0] for kind in ("fwd", "dkdv", "dq")}
CHECK_CFG_BIG_D = {kind: L.GPU_CONFIGS_BIG_D[kind][0] for kind in ("fwd", "dkdv", "dq")}


def check_cfg(D: int, use_tma: bool) -> dict:
    return CHECK_CFG_BIG_D if D > 128 else CHECK_CFG


def check_case(case, use_tma: bool) -> dict:
    B, H, HK, Sq, Sk, D, dtype, opts = case
    g = torch.Generator(device=DEV).manual_seed(Sq * 1000 + Sk + D)

    def rnd(*shape):
        return torch.randn(*shape, device=DEV, generator=g).to(dtype).requires_grad_()

    q, k, v, do = rnd(B, H, Sq, D), rnd(B, HK, Sk, D), rnd(B, HK, Sk, D), rnd(B, H, Sq, D)
    do = do.detach()
    cfg = check_cfg(D, use_tma)
    p = L.check_inputs(
        q, k, v, opts.get("causal", False), opts.get("sm_scale"), opts.get("window"), opts.get("softcap")
    )
    with config.override(poison=True):  # every output NaN until written
        o, lse = L.flash_fwd(q.detach(), k.detach(), v.detach(), p, cfg=cfg["fwd"], use_tma=use_tma)
        grads = L.flash_bwd(do, q.detach(), k.detach(), v.detach(), o, lse, p, cfgs=cfg, use_tma=use_tma)
    out_ref, lse_ref = attention_ref(q, k, v, **opts, compute_dtype=torch.float64)
    grads_ref = torch.autograd.grad(out_ref, (q, k, v), do.double())
    out_pt, _ = attention_ref(q, k, v, **opts)
    grads_pt = torch.autograd.grad(out_pt, (q, k, v), do)
    result, ok = {}, True
    for name, got, ref, base in zip(
        ("out", "dq", "dk", "dv"), (o, *grads), (out_ref, *grads_ref), (out_pt, *grads_pt), strict=True
    ):
        err = (got.double() - ref).abs().max().item()
        base_err = (base.double() - ref).abs().max().item()
        floor = torch.finfo(dtype).eps * ref.abs().max().item()
        good = bool(torch.isfinite(got).all()) and err <= 2 * base_err + floor
        result[name] = {"err": err, "math_err": base_err, "ok": good}
        ok &= good
    empty = torch.isneginf(lse_ref)
    lse_err = (lse[~empty].double() - lse_ref[~empty]).abs().max().item()
    lse_ok = torch.equal(torch.isneginf(lse), empty) and not torch.isnan(lse).any()
    lse_ok = bool(lse_ok) and lse_err <= 2e-2
    result["lse"] = {"err": lse_err, "ok": lse_ok}
    result["ok"] = ok and lse_ok
    return result


def check_variants():
    for case in CHECK_CASES[:2] if SMOKE else CHECK_CASES:
        D = case[5]
        for use_tma in (True, False) if D & (D - 1) == 0 else (False,):
            yield case, use_tma


def check_specs(case, use_tma) -> list[dict]:
    B, H, HK, Sq, Sk, D, dtype, opts = case
    cfg = check_cfg(D, use_tma)
    base = {
        "B": B,
        "H": H,
        "HK": HK,
        "S": Sq,
        "Sk": Sk,
        "D": D,
        "dtype": str(dtype)[6:],
        "causal": opts.get("causal", False),
        "sm_scale": opts.get("sm_scale"),
        "win": opts.get("window"),
        "softcap": opts.get("softcap"),
        "tma": use_tma,
    }
    return [{**base, "kind": kind, "cfg": cfg[kind]} for kind in ("fwd", "dkdv", "dq")]


def part_check(res: dict) -> None:
    specs = [s for case, tma in check_variants() for s in check_specs(case, tma)]
    precompile(specs + api_specs(4, 16, 16, 4096, 128, True))
    rows = []
    for case in CHECK_CASES[:2] if SMOKE else CHECK_CASES:
        D = case[5]
        for use_tma in (True, False) if D & (D - 1) == 0 else (False,):
            name = f"B{case[0]} H{case[1]}/{case[2]} Sq{case[3]} Sk{case[4]} D{D} " + (
                f"{str(case[6])[6:]} {case[7]} {'tma' if use_tma else 'ptr'}"
            )
            try:
                r = check_case(case, use_tma)
            except Exception as e:
                r = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
                traceback.print_exc()
            rows.append({"case": name, **r})
            log(
                "check",
                "PASS" if r["ok"] else "FAIL",
                name,
                {k: f"{v['err']:.2e}" for k, v in r.items() if isinstance(v, dict)},
            )
    if SMOKE:
        res["check"] = {"cases": rows, "all_ok": all(r["ok"] for r in rows)}
        return
    # the Hopper path against fp32 SDPA at a benchmark shape
    q, k, v, do = make_qkv(4, 16, 16, 4096, 128, grad=True)
    out = A.flash_attention(q, k, v, causal=True)
    grads = torch.autograd.grad(out, (q, k, v), do)
    qs, ks, vs = (t[:1, :2].detach().float().requires_grad_() for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    grads_ref = torch.autograd.grad(ref, (qs, ks, vs), do[:1, :2].float())
    errs = {"out": rel_rms(out[:1, :2], ref)}
    errs.update({n: rel_rms(g[:1, :2], r) for n, g, r in zip("qkv", grads, grads_ref, strict=True)})
    big_ok = all(e < 2e-2 for e in errs.values())
    rows.append({"case": "B4 H16 S4096 D128 causal vs fp32 SDPA (rel rms)", "ok": big_ok, **errs})
    log("check", "PASS" if big_ok else "FAIL", "S4096 vs fp32 SDPA", errs)
    res["check"] = {"cases": rows, "all_ok": all(r["ok"] for r in rows)}


# ------------------------------------------------------------------------------ sweep

_REF_CACHE: dict = {}


def slice_reference(spec, q, k, v, do):
    """fp32 SDPA on batch 0, heads 0-1: output and gradients."""
    key = (spec["D"], spec["causal"])
    if key not in _REF_CACHE:
        _REF_CACHE.clear()
        qs, ks, vs = (t[:1, :2].detach().float().requires_grad_() for t in (q, k, v))
        out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=spec["causal"])
        grads = torch.autograd.grad(out, (qs, ks, vs), do[:1, :2].float())
        _REF_CACHE[key] = (out.detach(), *grads)
    return _REF_CACHE[key]


def sweep_specs(D: int, causal: bool) -> list[dict]:
    H = 2048 // D
    base = {"B": 4, "H": H, "HK": H, "S": 4096, "D": D, "causal": causal}
    specs = [{**base, "kind": "fwd", "cfg": c, "tma": False, "ws": False} for c in FWD_SWEEP]
    specs += [{**base, "kind": "fwd", "cfg": c, "tma": True, "ws": False} for c in FWD_TMA]
    specs += [{**base, "kind": "fwd", "cfg": c, "tma": True, "ws": True} for c in FWD_WS]
    specs += [{**base, "kind": "dkdv", "cfg": c, "tma": False} for c in DKDV_SWEEP]
    specs += [{**base, "kind": "dq", "cfg": c, "tma": tma} for tma in (True, False) for c in DQ_SWEEP]
    return specs


def _sweep_one(spec, q, k, v, do, o, lse, p, ref, fl) -> dict:
    kind, cfg, tma, ws = spec["kind"], spec["cfg"], spec["tma"], spec.get("ws", False)
    row = {"kind": kind, "D": spec["D"], "causal": spec["causal"], "cfg": cfg, "tma": tma}
    row["ws"] = ws
    if kind == "fwd":

        def fn():
            return L.flash_fwd(q, k, v, p, cfg=cfg, use_tma=tma, ws=ws)

        row["err"] = rel_rms(fn()[0][:1, :2], ref[0])
        flop = fl
    else:

        def fn():
            return L.flash_bwd(do, q, k, v, o, lse, p, cfgs={kind: cfg}, use_tma=tma, parts=(kind,))

        dq, dk, dv = fn()
        if kind == "dq":
            row["err"] = rel_rms(dq[:1, :2], ref[1])
        else:
            row["err"] = max(rel_rms(dk[:1, :2], ref[2]), rel_rms(dv[:1, :2], ref[3]))
        # the kernel's share of the 2.5x backward count: dq does 3 of 7 matmuls, dkdv 4
        flop = 2.5 * fl * (3 / 7 if kind == "dq" else 4 / 7)
    row["ok"] = row["err"] < 2e-2
    row["ms"] = bench_ms(fn, rep=60)
    row["tflops_equiv"] = tflops(flop, row["ms"])
    return row


def _sweep_group(D: int, causal: bool, failed: dict, budget_s: float) -> list[dict]:
    H = 2048 // D
    q, k, v, do = make_qkv(4, H, H, 4096, D)
    p = L.check_inputs(q, k, v, causal, None, None, None)
    o, lse = L.flash_fwd(q, k, v, p, cfg=CHECK_CFG["fwd"])
    ref = slice_reference({"D": D, "causal": causal}, q, k, v, do)
    fl = fwd_flops(4, H, 4096, D, causal)
    rows = []
    for spec in sweep_specs(D, causal):
        if elapsed() > budget_s:
            rows.append({**spec, "skipped": "time budget"})
        elif spec_key(spec) in failed:
            rows.append({**spec, "error": failed[spec_key(spec)]})
        else:
            try:
                rows.append(_sweep_one(spec, q, k, v, do, o, lse, p, ref, fl))
            except Exception as e:
                rows.append({**spec, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        log("sweep", rows[-1])
    # the same config twice: the spread between repeated timings
    fn = lambda: L.flash_fwd(q, k, v, p, cfg=CHECK_CFG["fwd"])
    spread = [bench_ms(fn, rep=60) for _ in range(2)]
    rows.append({"kind": "repeat", "D": D, "causal": causal, "ms": spread})
    return rows


SWEEP_GROUPS = [(128, False), (128, True), (64, False), (64, True)]
TABLE_D = (64, 128)
TABLE_S = (1024, 2048, 4096, 8192, 16384)


def part_sweep(res: dict, budget_s: float) -> None:
    groups = SWEEP_GROUPS
    failed = precompile([s for D, c in groups for s in sweep_specs(D, c)])
    rows = []
    for D, causal in groups:
        rows += _sweep_group(D, causal, failed, budget_s)
        torch.cuda.empty_cache()
    res["sweep"] = rows


# ------------------------------------------------------------------------------ table


def time_fwd_bwd(fn, q, k, v, do) -> tuple[float, float]:
    fwd = bench_ms(lambda: fn(q, k, v))
    out = fn(q, k, v)
    bwd = bench_ms(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
    return fwd, bwd


def api_specs(B, H, HK, S, D, causal, window=None, softcap=None) -> list[dict]:
    """Compile jobs for every config the autotuner may try at this shape."""
    base = {"B": B, "H": H, "HK": HK, "S": S, "D": D, "causal": causal, "window": window, "softcap": softcap}
    q = torch.empty(1, 1, 1, D, device=DEV, dtype=torch.bfloat16)
    table = L.GPU_CONFIGS_BIG_D if D > 128 else L.GPU_CONFIGS
    specs = []
    for kind in ("fwd", "dkdv", "dq"):
        tma = L.tma_for(kind, (q,), config.current().attention_tma)
        specs += [{**base, "kind": kind, "cfg": c, "tma": tma, "ws": False} for c in table[kind]]
    return specs


def best_configs() -> dict:
    out = {}
    for name, tuner in L.TUNERS.items():
        c = getattr(tuner, "best_config", None)
        out[name] = None if c is None else str(c)
    return out


def table_shapes():
    tokens, width = (256, 128) if SMOKE else (16384, 2048)  # B*S, H*D
    for D in TABLE_D:
        H = width // D
        for S in TABLE_S:
            for causal in (False, True):
                yield tokens // S, H, S, D, causal


def _table_row(B, H, S, D, causal, failed) -> dict:
    row = {"B": B, "H": H, "S": S, "D": D, "causal": causal}
    if any(spec_key(s) in failed for s in api_specs(B, H, H, S, D, causal)):
        row["note"] = "some configs failed to compile (the autotuner skips them)"
    q, k, v, do = make_qkv(B, H, H, S, D, grad=True)
    fl = fwd_flops(B, H, S, D, causal)

    def ours(a, b, c):
        return A.flash_attention(a, b, c, causal=causal)

    def sdpa(a, b, c):
        return F.scaled_dot_product_attention(a, b, c, is_causal=causal)

    def naive(a, b, c):
        return naive_attention(a, b, c, causal)

    try:
        t = time.time()
        torch.autograd.grad(ours(q, k, v), (q, k, v), do)  # autotunes
        sync()
        row["ours_tune_s"] = time.time() - t
        out = ours(q, k, v)
        qs, ks, vs = (t[:1, :2].detach().float() for t in (q, k, v))
        ref = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
        row["ours_err_vs_fp32"] = rel_rms(out[:1, :2], ref)
        fwd, bwd = time_fwd_bwd(ours, q, k, v, do)
        row["ours_configs"] = best_configs()
        row.update(ours_fwd_ms=fwd, ours_bwd_ms=bwd)
        row.update(ours_fwd=tflops(fl, fwd), ours_bwd=tflops(2.5 * fl, bwd))
    except Exception as e:
        row["ours_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    else:
        add_host_times(row, "ours", ours, q, k, v, do)
    fwd, bwd = time_fwd_bwd(sdpa, q, k, v, do)
    row.update(sdpa_fwd_ms=fwd, sdpa_bwd_ms=bwd)
    row.update(sdpa_fwd=tflops(fl, fwd), sdpa_bwd=tflops(2.5 * fl, bwd))
    add_host_times(row, "sdpa", sdpa, q, k, v, do)
    if naive_fits(B, H, S):
        try:
            fwd, bwd = time_fwd_bwd(naive, q, k, v, do)
            row.update(naive_fwd_ms=fwd, naive_bwd_ms=bwd)
            row.update(naive_fwd=tflops(fl, fwd), naive_bwd=tflops(2.5 * fl, bwd))
            add_host_times(row, "naive", naive, q, k, v, do)
        except torch.OutOfMemoryError:
            row["naive"] = "out of memory"
    else:
        row["naive"] = "skipped: its S x S tensors would not fit in memory"
    return row


def part_table(res: dict, budget_s: float) -> None:
    specs = [s for B, H, S, D, c in table_shapes() for s in api_specs(B, H, H, S, D, c)]
    failed = precompile(specs)
    rows = []
    for B, H, S, D, causal in table_shapes():
        if elapsed() > budget_s:
            rows.append({"B": B, "H": H, "S": S, "D": D, "causal": causal, "skipped": "time"})
            continue
        rows.append(_table_row(B, H, S, D, causal, failed))
        torch.cuda.empty_cache()
        log("table", rows[-1])
    res["table"] = rows


# --------------------------------------------------------------------------- variants

VARIANTS = [  # name, causal, window, softcap
    ("plain", False, None, None),
    ("causal", True, None, None),
    ("causal+window1024", True, 1024, None),
    ("causal+softcap30", True, None, 30.0),
]


def part_variants(res: dict, budget_s: float, shape=None) -> None:
    B, H, S, D = shape or ((1, 2, 128, 64) if SMOKE else (4, 32, 4096, 128))
    specs = []
    for _, causal, window, cap in VARIANTS:
        specs += api_specs(B, H, H, S, D, causal, window, cap)
        if causal:
            base = {"B": B, "H": H, "HK": H, "S": S, "D": D, "causal": causal}
            specs.append({**base, "kind": "flex", "window": window, "softcap": cap})
    failed = precompile(specs, timeout_s=300)
    q, k, v, do = make_qkv(B, H, H, S, D, grad=True)
    qs, ks, vs = (t[:1, :2].detach().float() for t in (q, k, v))
    rows = []
    for name, causal, window, cap in VARIANTS:
        row = {"variant": name, "B": B, "H": H, "S": S, "D": D}
        rows.append(row)
        if elapsed() > budget_s:
            row["skipped"] = "time budget"
            continue
        fl = fwd_flops(B, H, S, D, causal, window)
        win = None if window is None else (window, 0)
        ours = lambda a, b, c, causal=causal, win=win, cap=cap: A.flash_attention(
            a, b, c, causal=causal, window=win, softcap=cap
        )
        ref, _ = attention_ref(
            qs, ks, vs, causal=causal, window=win, softcap=cap, compute_dtype=torch.float32
        )
        try:
            out = ours(q, k, v)
            torch.autograd.grad(out, (q, k, v), do)
            row["ours_err_vs_fp32"] = rel_rms(out[:1, :2], ref)
            fwd, bwd = time_fwd_bwd(ours, q, k, v, do)
            row["ours_configs"] = best_configs()
            row.update(
                ours_fwd_ms=fwd, ours_bwd_ms=bwd, ours_fwd=tflops(fl, fwd), ours_bwd=tflops(2.5 * fl, bwd)
            )
        except Exception as e:
            row["ours_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc()
        else:
            add_host_times(row, "ours", ours, q, k, v, do)
        if window is None and cap is None:
            sdpa = lambda a, b, c, causal=causal: F.scaled_dot_product_attention(a, b, c, is_causal=causal)
            fwd, bwd = time_fwd_bwd(sdpa, q, k, v, do)
            row.update(
                sdpa_fwd_ms=fwd, sdpa_bwd_ms=bwd, sdpa_fwd=tflops(fl, fwd), sdpa_bwd=tflops(2.5 * fl, bwd)
            )
            add_host_times(row, "sdpa", sdpa, q, k, v, do)
        if causal:
            spec = {
                "B": B,
                "H": H,
                "HK": H,
                "S": S,
                "D": D,
                "causal": causal,
                "kind": "flex",
                "window": window,
                "softcap": cap,
            }
            if spec_key(spec) in failed:
                row["flex_error"] = failed[spec_key(spec)]
            else:
                try:
                    fn = flex_call(spec)
                    t = time.time()
                    out = fn(q, k, v)
                    torch.autograd.grad(out, (q, k, v), do)
                    sync()
                    row["flex_first_call_s"] = time.time() - t
                    row["flex_err_vs_fp32"] = rel_rms(out[:1, :2], ref)
                    fwd, bwd = time_fwd_bwd(fn, q, k, v, do)
                    row.update(
                        flex_fwd_ms=fwd,
                        flex_bwd_ms=bwd,
                        flex_fwd=tflops(fl, fwd),
                        flex_bwd=tflops(2.5 * fl, bwd),
                    )
                except Exception as e:
                    row["flex_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                else:
                    add_host_times(row, "flex", fn, q, k, v, do)
        log("variants", row)
    res["variants"] = rows


# ------------------------------------------------------------------------------- main


def fmt(x, nd=0) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def host_cols(r: dict, names) -> str:
    """The host µs columns of a summary line (after ``||``): fwd/fwd+bwd of each implementation."""
    cols = [f"{fmt(r.get(f'{n}_host_fwd_us'))}/{fmt(r.get(f'{n}_host_fwdbwd_us'))}" for n in names]
    return " || " + " | ".join(cols)


def summary(res: dict) -> str:
    lines = [
        f"# {res['env'].get('gpu')} torch {res['env']['torch']} triton {res['env']['triton']}"
        f" SDPA backend: {res.get('sdpa', {}).get('backend')}"
    ]
    if "check" in res:
        bad = [r["case"] for r in res["check"]["cases"] if not r["ok"]]
        lines.append(
            f"check: {len(res['check']['cases']) - len(bad)} pass, {len(bad)} fail " + "; ".join(bad[:5])
        )
    if "sweep" in res:
        lines.append("sweep (best 3 per kernel; TFLOP/s-equivalent; cfg = BM,BN,warps,stages)")
        groups = {}
        for r in res["sweep"]:
            if r.get("tflops_equiv") and r.get("ok"):
                groups.setdefault((r["kind"], r["D"], r["causal"]), []).append(r)
        for (kind, D, causal), rs in sorted(groups.items()):
            rs.sort(key=lambda r: -r["tflops_equiv"])
            best = ", ".join(
                f"{r['cfg']}{'T' if r['tma'] else 'P'}{'W' if r['ws'] else ''}={r['tflops_equiv']:.0f}"
                for r in rs[:3]
            )
            lines.append(f"  {kind:5s} D{D} {'causal' if causal else 'full  '} {best}")
    if "table" in res:
        lines.append(
            "table (TFLOP/s) D   S     B  H  causal | ours fwd/bwd | sdpa fwd/bwd | "
            "ratio fwd/bwd | naive fwd/bwd"
            " || host µs per call, fwd/fwd+bwd: ours | sdpa | naive"
        )
        for r in res["table"]:
            rf = r.get("ours_fwd") and r.get("sdpa_fwd") and r["ours_fwd"] / r["sdpa_fwd"]
            rb = r.get("ours_bwd") and r.get("sdpa_bwd") and r["ours_bwd"] / r["sdpa_bwd"]
            lines.append(
                f"  {r['D']:3d} {r['S']:5d} {r['B']:2d} {r['H']:2d} {'y' if r['causal'] else 'n'}"
                f" | {fmt(r.get('ours_fwd'))}/{fmt(r.get('ours_bwd'))}"
                f" | {fmt(r.get('sdpa_fwd'))}/{fmt(r.get('sdpa_bwd'))}"
                f" | {fmt(rf or None, 2)}/{fmt(rb or None, 2)}"
                f" | {fmt(r.get('naive_fwd'))}/{fmt(r.get('naive_bwd'))}"
                f"{host_cols(r, ('ours', 'sdpa', 'naive'))}"
            )
    if "variants" in res:
        first = res["variants"][0] if res["variants"] else {"B": 4, "H": 32, "S": 4096, "D": 128}
        lines.append(
            f"variants B{first['B']} H{first['H']} S{first['S']} D{first['D']} (TFLOP/s) | ours fwd/bwd"
            " | flex | sdpa || host µs per call, fwd/fwd+bwd: ours | flex | sdpa"
        )
        for r in res["variants"]:
            lines.append(
                f"  {r['variant']:18s} | {fmt(r.get('ours_fwd'))}/{fmt(r.get('ours_bwd'))}"
                f" | {fmt(r.get('flex_fwd'))}/{fmt(r.get('flex_bwd'))}"
                f" | {fmt(r.get('sdpa_fwd'))}/{fmt(r.get('sdpa_bwd'))}"
                f"{host_cols(r, ('ours', 'flex', 'sdpa'))}"
            )
    return "\n".join(lines)


def _interpreter_numpy_shim() -> None:
    """--smoke only: Triton 3.6's interpreter calls int() on shape-(1,) arrays for loop
    bounds, which NumPy >= 2.4 rejects (the test suite applies the same fix)."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patched


def main(argv=None) -> int:
    global SMOKE, DEV, SWEEP_GROUPS, TABLE_D, TABLE_S, VARIANTS
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="attention.json")
    ap.add_argument("--parts", default="check,sweep,table,variants")
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter dry run on tiny shapes (no sweep)")
    ap.add_argument("--sweep-groups", default="128:0,128:1,64:0,64:1", help="D:causal pairs to sweep")
    ap.add_argument("--table-d", default="64,128", help="head dims of the table")
    ap.add_argument("--table-s", default="1024,2048,4096,8192,16384", help="sequence lengths of the table")
    ap.add_argument("--variants", default=",".join(v[0] for v in VARIANTS), help="variants to time")
    args = ap.parse_args(argv)
    TABLE_S = tuple(int(v) for v in args.table_s.split(",") if v)
    VARIANTS = [v for v in VARIANTS if v[0] in args.variants.split(",")]
    SWEEP_GROUPS = [(int(d), c == "1") for d, c in (g.split(":") for g in args.sweep_groups.split(",") if g)]
    TABLE_D = tuple(int(d) for d in args.table_d.split(",") if d)
    if args.smoke:
        SMOKE, DEV = True, "cpu"
        TABLE_D, TABLE_S = (64,), (128,)  # table_shapes: B2 H2 S128 D64
        _interpreter_numpy_shim()
    import triton

    res: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "env": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
            "cuda": torch.version.cuda,
        },
    }

    def save():
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1, default=str)

    parts = args.parts.split(",")
    if not SMOKE:
        res["sdpa"] = sdpa_backend()
        log("SDPA", res["sdpa"])
    for part in parts:
        if elapsed() > args.budget_s or (SMOKE and part == "sweep"):
            res.setdefault("skipped_parts", []).append(part)
            continue
        try:
            if part == "check":
                part_check(res)
            elif part == "sweep":
                part_sweep(res, args.budget_s)
            elif part == "table":
                part_table(res, args.budget_s)
            elif part == "variants":
                part_variants(res, args.budget_s)
        except Exception as e:
            res.setdefault("errors", {})[part] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        save()
    save()
    print(summary(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
