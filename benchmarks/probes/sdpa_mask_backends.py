"""Which SDPA backend takes an additive mask (T5's relative position bias) at T5-base's shapes,
and why the others refuse it: the question behind the ``sdpa-mask-dtype`` fix.

The fix casts an fp32 position bias to q's dtype so that SDPA leaves its fp32 math path for a
fused kernel. On an H100 (torch 2.11, T5-base, bf16 autocast, dropout 0.1) ``verify`` measured
it at -2.5% (-10.5 to 5.6%) against 35-37% predicted: the cast ran, the step did not get
faster. This probe forces each backend in turn on q, k, v of 32 x 12 x 512 x 64 (bf16) and a
1 x 12 x 512 x 512 bias (fp32 or bf16, with and without a gradient, dropout 0 or 0.1), records
PyTorch's own warning for every backend it refuses, and lists the kernels the default dispatch
runs under autocast with the bf16 bias; then times forward + backward as T5 calls it with the
fp32 bias, the bias cast to bf16, and no bias.

    python3 benchmarks/probes/sdpa_mask_backends.py --out OUT_DIR

Needs a CUDA GPU and torch with CUDA. Writes OUT_DIR/sdpa_mask_backends.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the JSON result")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--head-dim", type=int, default=64)
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    torch.manual_seed(0)
    shape = (args.batch, args.heads, args.seq, args.head_dim)

    def inputs(mask_dtype: torch.dtype, mask_grad: bool):
        q, k, v = (
            torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
        )
        bias = torch.randn(
            1, args.heads, args.seq, args.seq, device="cuda", dtype=mask_dtype, requires_grad=mask_grad
        )
        return q, k, v, bias

    rows = []
    for mask_dtype in (torch.float32, torch.bfloat16):
        for mask_grad in (False, True):
            for dropout in (0.0, 0.1):
                for backend in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
                    q, k, v, bias = inputs(mask_dtype, mask_grad)
                    with warnings.catch_warnings(record=True) as caught:
                        warnings.simplefilter("always")
                        try:
                            with sdpa_kernel(backend):
                                out = F.scaled_dot_product_attention(
                                    q, k, v, attn_mask=bias, dropout_p=dropout, scale=1.0
                                )
                                out.sum().backward()
                            result = "ran"
                        except RuntimeError as e:  # no backend left: PyTorch says why in warnings
                            result = "refused: " + str(e).splitlines()[0][:200]
                    rows.append(
                        {
                            "mask_dtype": str(mask_dtype).removeprefix("torch."),
                            "mask_grad": mask_grad,
                            "dropout": dropout,
                            "backend": backend.name,
                            "result": result,
                            "why": [str(w.message).splitlines()[0][:240] for w in caught],
                        }
                    )
                    r = rows[-1]
                    print(
                        f"{r['mask_dtype']:9s} grad={mask_grad!s:5s} p={dropout:<4} {backend.name:20s} "
                        f"{result[:60]}  {' | '.join(r['why'])[:200]}"
                    )

    q, k, v, bias = inputs(torch.bfloat16, True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.1, scale=1.0)
        out.sum().backward()
        torch.cuda.synchronize()
    kernels = sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})
    print("default dispatch, bf16 bias with a gradient, dropout 0.1:")
    for name in kernels:
        print("  ", name[:160])
    timed = time_variants(torch, F, args, shape)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": shape,
        "forced": rows,
        "default_kernels": kernels,
        "timed": timed,
    }
    (args.out / "sdpa_mask_backends.json").write_text(json.dumps(result, indent=1))


def time_variants(torch, F, args, shape) -> list[dict]:
    """Forward + backward of the default dispatch under bf16 autocast, as T5 calls it (dropout
    0.1, a bias with a gradient): the fp32 bias, the bias cast to bf16, and no bias at all
    (the flash kernel's time, a floor). Median of 20 after 5, CUDA events; the kernels each
    ran and their share of its time."""
    import statistics

    out = []
    for name in ("fp32 bias", "bf16 bias", "no bias"):
        q, k, v = (
            torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
        )
        bias = torch.randn(1, args.heads, args.seq, args.seq, device="cuda", requires_grad=True)

        def once(q=q, k=k, v=v, bias=bias, name=name):
            mask = {"fp32 bias": bias, "bf16 bias": bias.to(torch.bfloat16)}.get(name)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.1, scale=1.0)
            o.sum().backward()

        for _ in range(5):
            once()
        times = []
        for _ in range(20):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            once()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            once()
            torch.cuda.synchronize()
        kernels: dict[str, float] = {}
        for e in prof.events():
            if e.device_type.name == "CUDA":
                kernels[e.name[:120]] = kernels.get(e.name[:120], 0.0) + e.device_time / 1e3
        row = {
            "variant": name,
            "median_ms": round(statistics.median(times), 4),
            "kernels_ms": dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:8]),
        }
        out.append(row)
        print(f"timed {name:10s} fwd+bwd {row['median_ms']:.3f} ms")
        for kname, ms in list(row["kernels_ms"].items())[:5]:
            print(f"    {ms:7.3f} ms  {kname}")
    return out


if __name__ == "__main__":
    main()
