"""``kerneltriage calibrate``: measure this GPU's ceilings once, so the roofline is real.

Datasheet peaks are upper bounds no kernel reaches (an H200's 4.8 TB/s HBM measures about
4.2 TB/s device-to-device). Measured here, with ``triton.testing.do_bench`` medians:

- memory: a device-to-device copy of 2 GiB (bytes read + bytes written);
- tensor cores: 8192³ matrix products in bf16, fp16 and tf32 (cuBLAS), random data;
- CUDA cores: a Triton kernel that keeps a long chain of fp32 FMAs in registers.

Results go to ``~/.cache/kerneltriage/calibration/<gpu>.json``; ``profile`` records them in
each run's manifest and ``report`` prefers them to the datasheet.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import re
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kerneltriage" / "calibration"


def _cache_file(gpu_name: str) -> Path:
    return cache_dir() / (re.sub(r"[^A-Za-z0-9_.-]+", "_", gpu_name).strip("_") + ".json")


def cached(gpu_name: str | None = None) -> dict[str, Any] | None:
    """The stored calibration for ``gpu_name`` (or the only one stored), if any."""
    folder = cache_dir()
    if gpu_name:
        files = [_cache_file(gpu_name)]
    else:
        files = sorted(folder.glob("*.json")) if folder.is_dir() else []
        if len(files) != 1:
            return None
    try:
        return json.loads(files[0].read_text()) if files[0].is_file() else None
    except (OSError, json.JSONDecodeError):
        return None


def measure(device: int = 0, quick: bool = False) -> dict[str, Any]:
    """Measure the ceilings of CUDA device ``device`` (needs torch and triton)."""
    import torch
    import triton
    from triton.testing import do_bench

    if not torch.cuda.is_available():
        from kerneltriage.errors import ToolError

        raise ToolError("calibrate needs a CUDA GPU; none is visible to torch")
    torch.cuda.set_device(device)
    props = torch.cuda.get_device_properties(device)
    reps = {"warmup": 25, "rep": 100} if quick else {"warmup": 50, "rep": 300}
    result: dict[str, Any] = {
        "gpu": props.name,
        "date": _dt.date.today().isoformat(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "method": "triton.testing.do_bench median",
        "peak_tflops": {},
    }

    n = (1 << 30) // 2  # 1 GiB of bf16 each way: 2 GiB moved per copy
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = do_bench(functools.partial(dst.copy_, src), return_mode="median", **reps)
    result["hbm_gbs"] = round(2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9, 1)
    del src, dst  # free 2 GiB before the matmuls

    size = 4096 if quick else 8192
    for precision, dtype, tf32 in (
        ("bf16", torch.bfloat16, False),
        ("fp16_tensor", torch.float16, False),
        ("tf32", torch.float32, True),
    ):
        a = torch.randn(size, size, device="cuda", dtype=dtype)
        b = torch.randn(size, size, device="cuda", dtype=dtype)
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            ms = do_bench(lambda a=a, b=b: a @ b, return_mode="median", **reps)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
        result["peak_tflops"][precision] = round(2 * size**3 / (ms * 1e-3) / 1e12, 1)
        del a, b
    result["peak_tflops"]["fp32"] = round(_fma_tflops(props.multi_processor_count, reps), 1)
    return result


def _fma_tflops(sms: int, reps: dict[str, int]) -> float:
    import torch
    import triton
    import triton.language as tl
    from triton.testing import do_bench

    @triton.jit
    def _fma_chain_kernel(out_ptr, a, b, ITERS: tl.constexpr, BLOCK: tl.constexpr):
        # Four independent chains per element hide the FMA latency; nothing touches memory
        # until the end, so the kernel measures the FP32 pipe alone.
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        x0 = offs.to(tl.float32) * 1e-9
        x1 = x0 + 1.0
        x2 = x0 + 2.0
        x3 = x0 + 3.0
        for _ in range(ITERS):
            x0 = x0 * a + b
            x1 = x1 * a + b
            x2 = x2 * a + b
            x3 = x3 * a + b
        tl.store(out_ptr + offs, x0 + x1 + x2 + x3)

    block, iters = 1024, 4096
    programs = sms * 16
    out = torch.empty(programs * block, device="cuda", dtype=torch.float32)
    run = lambda: _fma_chain_kernel[(programs,)](out, 0.999, 0.001, ITERS=iters, BLOCK=block, num_warps=8)
    ms = do_bench(run, return_mode="median", **reps)
    flops = 2.0 * 4 * iters * programs * block
    return flops / (ms * 1e-3) / 1e12


def save(result: dict[str, Any]) -> Path:
    path = _cache_file(result["gpu"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m kerneltriage.profile.calibrate [--quick] [--json PATH]`` in the script's Python."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m kerneltriage.profile.calibrate")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args(argv)
    result = measure(args.device, args.quick)
    path = save(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"saved": str(path), **result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
