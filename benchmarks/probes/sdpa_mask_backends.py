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
    python3 benchmarks/probes/sdpa_mask_backends.py --out OUT_DIR --t5   # the real model

``--t5`` asks the model itself: a Hugging Face T5-base built from its config (no download,
``attn_implementation="sdpa"``, fp32 weights, batch 32 of 512 -> 128 under bf16 autocast, as
``examples/train_hf_t5.py`` trains it) runs one training step while every SDPA call is recorded
(q, k, v and mask: shape, dtype, strides, gradient; dropout, scale, is_causal, autocast on), then
one more step with each fused backend forced, recording PyTorch's reason for each refusal, and
the kernels the default dispatch runs.

Needs a CUDA GPU and torch with CUDA (and transformers for ``--t5``). Writes
OUT_DIR/sdpa_mask_backends.json (``--t5``: OUT_DIR/sdpa_t5.json) and prints a table.
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
    parser.add_argument("--t5", action="store_true", help="record the SDPA calls of a real HF T5-base step")
    parser.add_argument("--device", default="cuda", help="--t5 only: cpu with --tiny checks the probe itself")
    parser.add_argument("--tiny", action="store_true", help="--t5 only: the example's tiny model")
    args = parser.parse_args()
    if args.t5:
        t5_calls(args)
        return

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
        kernels = kernel_ms(torch, once)
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


def kernel_ms(torch, run) -> dict[str, float]:
    """ms of each CUDA kernel (name cut to 120 characters) while ``run()`` runs once."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    kernels: dict[str, float] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            kernels[e.name[:120]] = kernels.get(e.name[:120], 0.0) + e.device_time / 1e3
    return kernels


def t5_calls(args) -> None:
    """What T5-base passes to SDPA in a training step, and why each fused backend refuses it."""
    import sys

    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from train_hf_t5 import build_model, parse_args  # the model exactly as the example builds it

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --device cpu --tiny for a check of the probe itself)")
    torch.manual_seed(0)
    t5 = parse_args(["--tiny", "--device", args.device] if args.tiny else ["--device", args.device])
    model = build_model(t5, device).train()
    src = torch.randint(0, t5.vocab, (t5.batch, t5.src), device=device)
    tgt = torch.randint(0, t5.vocab, (t5.batch, t5.tgt), device=device)

    calls: list[dict] = []
    real = F.scaled_dot_product_attention

    def described(t):
        if t is None:
            return None
        return {
            "shape": list(t.shape),
            "dtype": str(t.dtype).removeprefix("torch."),
            "stride": list(t.stride()),
            "requires_grad": bool(t.requires_grad),
        }

    def recording(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, **kw):
        if len(calls) < 64:
            calls.append(
                {
                    "q": described(q),
                    "k": described(k),
                    "v": described(v),
                    "mask": described(attn_mask),
                    "dropout_p": dropout_p,
                    "is_causal": is_causal,
                    "scale": scale,
                    "extra": sorted(kw),
                    "autocast": torch.is_autocast_enabled(device.type),
                }
            )
        return real(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **kw)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(input_ids=src, labels=tgt).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    F.scaled_dot_product_attention = recording
    torch.nn.functional.scaled_dot_product_attention = recording
    try:
        step()
    finally:
        F.scaled_dot_product_attention = real
    distinct = []
    for c in calls:
        if c not in distinct:
            distinct.append(c)
    print(f"{len(calls)} SDPA calls recorded, {len(distinct)} distinct:")
    for c in distinct:
        print(" ", json.dumps(c)[:400])
    forced = []
    if device.type != "cuda":
        print("no GPU: the SDPA calls only")
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sdpa_t5.json").write_text(json.dumps({"device": "cpu", "calls": distinct}, indent=1))
        return
    for backend in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel(backend):
                    step()
                result = "ran"
            except RuntimeError as e:
                result = "refused: " + str(e).splitlines()[0][:200]
        why = sorted({str(w.message).splitlines()[0][:300] for w in caught})
        forced.append({"backend": backend.name, "result": result, "why": why})
        print(f"{backend.name:20s} {result[:80]}")
        for w in why[:6]:
            print("    ", w)
    kernels = kernel_ms(torch, step)
    top = dict(sorted(kernels.items(), key=lambda kv: -kv[1])[:15])
    print("default dispatch, kernels by time (ms):")
    for name, ms in top.items():
        print(f"  {ms:8.3f}  {name}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sdpa_t5.json").write_text(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(),
                "torch": torch.__version__,
                "calls": distinct,
                "forced": forced,
                "kernels_ms": top,
                "math_sdp_fp32_upcast": not torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
                if hasattr(torch.backends.cuda, "fp16_bf16_reduction_math_sdp_allowed")
                else None,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
