"""What an unaligned GEMM dimension costs: the same GEMM with K (or N) one element off a
multiple of 8, and padded to it, in TF32 and bf16, on cuBLAS (eager ``torch.mm``) and on
Inductor with ``force_shape_pad`` (the ``inductor-shape-pad`` recipe).

The report offers the padding for a library GEMM whose kernels are CUTLASS's ``align1`` /
``align2`` variants or whose recorded K or N is off the multiple (``library_advice``); where
Nsight Compute measured the GEMM, its headroom is the prediction. This probe measures what
padding buys where no counters are at hand: the kernel names and the time of each shape, so that
a table of the penalty can stand behind a prediction.

Shapes: DLRM's top MLP input on an A100 trace (M = 4096 × 32, K = 2798), Hugging Face-style
vocabularies (N = 30522, 50257) and a square one, each as recorded and padded. Each case is timed
with CUDA events over ``--iters`` calls after a warm-up, the median of ``--repeats`` rounds.

    python3 benchmarks/probes/gemm_alignment.py --out OUT_DIR

Needs a CUDA GPU and torch. Writes OUT_DIR/gemm_alignment.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

#: (name, M, N, K): the unaligned dimension is the one a padded twin rounds up.
CASES = (
    ("DLRM top MLP, K=2798", 131072, 512, 2798),
    ("square, K=4095", 4096, 4096, 4095),
    ("BERT vocabulary, N=30522", 8192, 30522, 768),
    ("GPT-2 vocabulary, N=50257", 8192, 50257, 768),
)


def _padded(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _time(fn, iters: int, repeats: int) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        rounds.append(start.elapsed_time(end) / iters)
    return statistics.median(rounds)


def _kernels(fn) -> list[str]:
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gemm_alignment.json")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="eager cuBLAS only")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = True
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for dtype, multiple in ((torch.float32, 4), (torch.bfloat16, 8)):
        for name, m, n, k in CASES:
            for label, (nn_, kk) in (
                ("as recorded", (n, k)),
                ("padded", (_padded(n, multiple * 16), _padded(k, multiple * 16))),
            ):
                a = torch.randn(m, kk, device="cuda", dtype=dtype)
                b = torch.randn(kk, nn_, device="cuda", dtype=dtype)
                flops = 2.0 * m * nn_ * kk
                eager_ms = _time(lambda a=a, b=b: torch.mm(a, b), args.iters, args.repeats)
                row = {
                    "case": name,
                    "dtype": str(dtype).replace("torch.", ""),
                    "shape": label,
                    "m": m,
                    "n": nn_,
                    "k": kk,
                    "eager_ms": round(eager_ms, 4),
                    "eager_tflops": round(flops / eager_ms / 1e9, 1),
                    "eager_kernels": _kernels(lambda a=a, b=b: torch.mm(a, b)),
                }
                if not args.no_compile and label == "as recorded":
                    import torch._inductor.config as inductor_config

                    for pad in (False, True):
                        inductor_config.force_shape_pad = pad
                        torch._dynamo.reset()
                        mm = torch.compile(lambda a, b: torch.mm(a, b))
                        ms = _time(lambda a=a, b=b, mm=mm: mm(a, b), args.iters, args.repeats)
                        key = "inductor_force_pad" if pad else "inductor_default"
                        row[f"{key}_ms"] = round(ms, 4)
                        row[f"{key}_kernels"] = _kernels(lambda a=a, b=b, mm=mm: mm(a, b))
                    inductor_config.force_shape_pad = False
                rows.append(row)
                del a, b
                torch.cuda.empty_cache()
    result = {
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "iters": args.iters,
        "repeats": args.repeats,
        "rows": rows,
    }
    (args.out / "gemm_alignment.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"{result['gpu']}, torch {result['torch']}\n")
    print("| case | dtype | shape | M×N×K | eager | TFLOP/s | Inductor | Inductor, force_shape_pad |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        inductor = f"{r['inductor_default_ms']:.3f} ms" if "inductor_default_ms" in r else "—"
        forced = f"{r['inductor_force_pad_ms']:.3f} ms" if "inductor_force_pad_ms" in r else "—"
        print(
            f"| {r['case']} | {r['dtype']} | {r['shape']} | {r['m']}×{r['n']}×{r['k']} | "
            f"{r['eager_ms']:.3f} ms | {r['eager_tflops']} | {inductor} | {forced} |"
        )


if __name__ == "__main__":
    main()
