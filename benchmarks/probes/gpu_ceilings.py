"""What this GPU reaches, for kerneltriage's ceilings: the per-launch floor of a kernel, the
achievable matmul peaks, copy bandwidth, and SDPA's rate per backend (attention table rows).

    PYTHONPATH=. python benchmarks/probes/gpu_ceilings.py --out results/ceilings.json

Needs a CUDA GPU, torch with CUDA and triton. Prints a short summary; the JSON holds every
figure (BENCHMARKS.md: "What the H100 reaches", the launch floor and the SDPA backend rates;
``kerneltriage/data/gpus.yaml`` and ``attention_perf.yaml`` cite it). Nothing here is a test.

Per-launch floor: the GPU duration of a kernel with (almost) no work, as the PyTorch profiler
records it (that is what a trace shows), and the start-to-start interval of back-to-back
launches, eager and replayed from a CUDA graph. A kernel cannot take less than the first; a
chain of eager launches cannot run faster than the second.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from pathlib import Path


def _kernels_of(prof) -> list[dict]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    ks = [e for e in events if str(e.get("cat", "")).lower() == "kernel" and e.get("ph") == "X"]
    if not ks:
        cats = sorted({str(e.get("cat")) for e in events})
        raise RuntimeError(f"no kernel events in the profile; categories: {cats}")
    ks.sort(key=lambda e: e["ts"])
    return ks


def launch_floor(torch) -> dict:
    from torch.profiler import ProfilerActivity, profile

    dev = "cuda"
    one = torch.ones(1, device=dev)
    small = torch.randn(1024, device=dev)
    mat = torch.randn(16, 16, device=dev)
    ops = {
        "add_1elem": lambda: one.add_(1.0),
        "fill_1elem": lambda: one.fill_(0.5),
        "sum_1k": lambda: small.sum(),
        "softmax_1k": lambda: torch.softmax(small, 0),
        "mm_16": lambda: mat @ mat,
        "copy_1k": lambda: small.clone(),
    }
    out = {}
    for fn in ops.values():
        for _ in range(50):
            fn()
    torch.cuda.synchronize()
    # One profiler session for all ops (separate sessions in one process lost kernel records
    # on the H100 image); each op's kernels are told apart by name.
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for fn in ops.values():
            for _ in range(300):
                fn()
            torch.cuda.synchronize()
    by_name: dict[str, list[dict]] = {}
    for k in _kernels_of(prof):
        by_name.setdefault(k["name"], []).append(k)
    for name, ks in sorted(by_name.items(), key=lambda kv: -len(kv[1])):
        if len(ks) < 100:
            continue
        durs = [k["dur"] for k in ks]
        starts = [k["ts"] for k in ks]
        intervals = [b - a for a, b in itertools.pairwise(starts)]
        out[name[:120]] = {
            "kernels": len(ks),
            "dur_us_median": statistics.median(durs),
            "dur_us_p10": sorted(durs)[len(durs) // 10],
            "start_interval_us_median": statistics.median(intervals),
        }
    # The same tiny add replayed from a CUDA graph: launch overhead without the host.
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            one.add_(1.0)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for _ in range(300):
            one.add_(1.0)
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        g.replay()
    end.record()
    torch.cuda.synchronize()
    out["add_1elem_cuda_graph"] = {"us_per_kernel": start.elapsed_time(end) * 1e3 / 3000}
    # Host cost of one eager launch (no profiler): wall time of many queued tiny adds.
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(5000):
        one.add_(1.0)
    host = (time.perf_counter() - t) / 5000 * 1e6
    torch.cuda.synchronize()
    out["eager_host_us_per_launch"] = host
    return out


def matmul_peaks(torch, bench) -> dict:
    shapes = [
        (4096, 4096, 4096),
        (8192, 8192, 8192),
        (16384, 8192, 8192),
        (8192, 8192, 16384),
        (6144, 6144, 6144),
    ]
    out = {}
    for label, dtype, tf32 in [
        ("bf16", torch.bfloat16, False),
        ("fp16_tensor", torch.float16, False),
        ("tf32", torch.float32, True),
        ("fp32", torch.float32, False),
    ]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        best = []
        for m, n, k in shapes if label not in ("fp32",) else shapes[:2]:
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(k, n, device="cuda", dtype=dtype)
            ms = bench(lambda a=a, b=b: a @ b)
            best.append({"shape": [m, n, k], "tflops": 2 * m * n * k / ms / 1e9})
            del a, b
        out[label] = {"best_tflops": max(x["tflops"] for x in best), "shapes": best}
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        a = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(8192, 8192, device="cuda").to(torch.float8_e4m3fn).t()
        one = torch.tensor(1.0, device="cuda")
        ms = bench(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        out["fp8"] = {"best_tflops": 2 * 8192**3 / ms / 1e9, "shapes": [{"shape": [8192] * 3}]}
    except Exception as exc:  # a probe: record and go on
        out["fp8"] = {"error": str(exc)[:200]}
    return out


def copy_bandwidth(torch, bench) -> float:
    x = torch.empty(1 << 29, device="cuda", dtype=torch.bfloat16).normal_()
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return 2 * x.numel() * 2 / ms / 1e6


def _time_sdpa(torch, F, bench, sdpa_kernel, backend, q, k, v, causal: bool, flops: float) -> dict:
    with sdpa_kernel([backend]):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        do = torch.randn_like(o)
        fwd = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        bwd = bench(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    return {
        "fwd_tflops": flops / fwd / 1e9,
        "bwd_tflops": 2.5 * flops / bwd / 1e9,
        "fwd_bwd_tflops": 3.5 * flops / (fwd + bwd) / 1e9,
    }


def sdpa_backends(torch, bench) -> list[dict]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    rows = []
    backends = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
    }
    for d in (64, 128):
        h = 2048 // d
        for s in (1024, 2048, 4096, 8192):
            b = 16384 // s
            for causal in (False, True):
                q, k, v = (
                    torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                    for _ in range(3)
                )
                flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
                for name, be in backends.items():
                    row = {
                        "head_dim": d,
                        "seq_len": s,
                        "batch": b,
                        "heads": h,
                        "causal": causal,
                        "backend": name,
                    }
                    try:
                        row.update(_time_sdpa(torch, F, bench, sdpa_kernel, be, q, k, v, causal, flops))
                    except Exception as exc:  # a backend may not support the case
                        row["error"] = str(exc).splitlines()[0][:160]
                    rows.append(row)
                del q, k, v
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import torch
    import triton
    from triton.testing import do_bench

    bench = lambda fn: do_bench(fn, warmup=50, rep=300, return_mode="median")
    props = torch.cuda.get_device_properties(0)
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "device": props.name,
        "sms": props.multi_processor_count,
        "memory_gib": props.total_memory / 2**30,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
    }
    result["launch_floor"] = launch_floor(torch)
    result["copy_gbs"] = copy_bandwidth(torch, bench)
    result["matmul"] = matmul_peaks(torch, bench)
    result["sdpa"] = sdpa_backends(torch, bench)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("sdpa", "matmul")}, indent=1))
    print({k: round(v.get("best_tflops", 0), 1) for k, v in result["matmul"].items()})
    for r in result["sdpa"]:
        print(
            r["backend"],
            r["head_dim"],
            r["seq_len"],
            r["causal"],
            round(r.get("fwd_tflops", 0)),
            round(r.get("bwd_tflops", 0)),
            r.get("error", ""),
        )


if __name__ == "__main__":
    main()
