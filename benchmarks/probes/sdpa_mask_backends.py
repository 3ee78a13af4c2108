"""Which SDPA backend takes an additive mask (T5's relative position bias) at T5-base's shapes,
and why the others refuse it: the question behind the ``sdpa-mask-dtype`` fix.

The fix casts an fp32 position bias to q's dtype so that SDPA leaves its fp32 math path for a
fused kernel. On an H100 (torch 2.11, T5-base, bf16 autocast, dropout 0.1) ``verify`` measured
it at -2.5% (-10.5 to 5.6%) against 35-37% predicted: the cast ran, the step did not get
faster. This probe forces each backend in turn on q, k, v of 32 x 12 x 512 x 64 (bf16) and a
1 x 12 x 512 x 512 bias (fp32 or bf16, with and without a gradient, dropout 0 or 0.1), records
PyTorch's own warning for every backend it refuses, and lists the kernels the default dispatch
runs under autocast with the bf16 bias.

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
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": shape,
        "forced": rows,
        "default_kernels": kernels,
    }
    (args.out / "sdpa_mask_backends.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
