"""``kerneltriage calibrate``: measure this GPU's ceilings once, so the roofline is real.

Datasheet peaks are upper bounds no kernel reaches (an H200's 4.8 TB/s HBM measures about
4.2 TB/s device-to-device). Measured here, with ``triton.testing.do_bench`` medians:

- memory: a device-to-device copy of 2 GiB (bytes read + bytes written);
- tensor cores: the best of several matrix products in bf16, fp16 and tf32 (cuBLAS, random
  data): square 4096 and 8192 and a long-K shape, and with ``--run`` the run's own GEMM shapes
  (``gemm_shapes``). One shape is not a peak: a long run of 8192³ products throttles the clock
  (an H200 measures about 680 TFLOP/s there) while a training step's GEMMs, between
  memory-bound kernels, reach 850;
- CUDA cores: a Triton kernel that keeps a long chain of fp32 FMAs in registers.

Results go to ``~/.cache/kerneltriage/calibration/<gpu>.json``; ``profile`` records them in
each run's manifest and ``report`` prefers them to the datasheet. ``--run`` also records the
result in that run's manifest when it measured the run's GPU.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from kerneltriage.ingest.tables import Timeline

# Shapes every calibration measures, (batch, m, n, k); quick mode the first only.
STANDARD_SHAPES = ((1, 4096, 4096, 4096), (1, 8192, 8192, 8192), (1, 8192, 8192, 32768))
# The run's shapes measured: the most FLOPs of the run first (a step's big GEMMs set its peak).
RUN_SHAPES = 8
_TENSOR_DTYPES = {"c10::BFloat16": "bf16", "c10::Half": "fp16_tensor"}
_GEMM_OPS = re.compile(r"^aten::(linear|mm|addmm|_addmm_activation|bmm|baddbmm|matmul)$")


@dataclass(frozen=True)
class GemmShape:
    """One matrix product: ``batch`` × (m×k) @ (k×n) in ``precision`` (bf16 or fp16_tensor)."""

    batch: int
    m: int
    n: int
    k: int
    precision: str
    count: int = 0  # how often the run calls it (0: a standard shape)

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k

    @property
    def label(self) -> str:
        head = f"{self.batch}x" if self.batch > 1 else ""
        return f"{head}{self.m}x{self.n}x{self.k}"


def _mnk(name: str, dims: Any) -> tuple[int, int, int, int] | None:
    """(batch, m, n, k) of a recorded GEMM op's input shapes; None when they do not say."""
    op = name.split("::")[-1]
    tensors = [d for d in (dims or []) if isinstance(d, list) and d and all(isinstance(x, int) for x in d)]
    try:
        if op == "linear":
            x, w = tensors[0], tensors[1]
            m = 1
            for d in x[:-1]:
                m *= d
            return 1, m, w[0], x[-1]
        if op in ("mm", "addmm", "_addmm_activation"):
            a, b = (tensors[0], tensors[1]) if op == "mm" else (tensors[-2], tensors[-1])
            return 1, a[0], b[1], a[1]
        if op in ("bmm", "baddbmm"):
            a, b = (tensors[0], tensors[1]) if op == "bmm" else (tensors[-2], tensors[-1])
            return a[0], a[1], b[2], a[2]
        if op == "matmul" and len(tensors[0]) >= 2 and len(tensors[1]) >= 2:
            a, b = tensors[0], tensors[1]
            lead = 1
            for d in a[:-2]:
                lead *= d
            if len(b) == 2:  # activations @ weight: one product of the flattened rows
                return 1, lead * a[-2], b[-1], a[-1]
            return lead, a[-2], b[-1], a[-1]
    except (IndexError, TypeError):
        return None
    return None


def gemm_shapes(timeline: Timeline, limit: int = RUN_SHAPES) -> list[GemmShape]:
    """The run's tensor-core GEMM shapes (bf16 and fp16 inputs), the ``limit`` with the most
    FLOPs over the run first. Pure: reads the recorded input shapes of the trace's GEMM ops
    (an op and the op it calls with the same shape count once per call of each)."""
    cpu = timeline.cpu
    if cpu.empty:
        return []
    ops = cpu[cpu["name"].astype(str).str.match(_GEMM_OPS.pattern) & (cpu["dims"] >= 0)]
    counts: Counter[GemmShape] = Counter()
    for (name, dims_i, types_i), n in ops.groupby(["name", "dims", "types"]).size().items():
        types = timeline.arg(int(types_i)) or []
        precision = _TENSOR_DTYPES.get(next((t for t in types if t), ""))
        mnk = _mnk(str(name), timeline.arg(int(dims_i)))
        if precision is None or mnk is None or min(mnk) <= 0:
            continue
        counts[GemmShape(*mnk, precision)] += int(n)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[0].flops * kv[1], kv[0].label))
    return [GemmShape(s.batch, s.m, s.n, s.k, s.precision, n) for s, n in ranked[:limit]]


def run_gemm_shapes(path: str | os.PathLike[str], limit: int = RUN_SHAPES) -> list[GemmShape]:
    """``gemm_shapes`` of a run directory or trace (its first rank)."""
    from kerneltriage.ingest.source import load_profile

    profile = load_profile(path)
    return gemm_shapes(profile.timelines[min(profile.timelines)], limit)


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


def measure(device: int = 0, quick: bool = False, shapes: list[GemmShape] | None = None) -> dict[str, Any]:
    """Measure the ceilings of CUDA device ``device`` (needs torch and triton). ``shapes``:
    GEMM shapes measured beside the standard ones (a run's, from ``gemm_shapes``)."""
    import torch
    import triton

    if not torch.cuda.is_available():
        from kerneltriage.errors import ToolError

        raise ToolError("calibrate needs a CUDA GPU; none is visible to torch")
    from triton.testing import do_bench  # imports torch's CUDA parts: only once there is a GPU

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

    standard = STANDARD_SHAPES[:1] if quick else STANDARD_SHAPES
    result["matmul"] = []
    for precision, dtype, tf32 in (
        ("bf16", torch.bfloat16, False),
        ("fp16_tensor", torch.float16, False),
        ("tf32", torch.float32, True),
    ):
        todo = [GemmShape(*shape, precision) for shape in standard]
        todo += [s for s in shapes or [] if s.precision == precision]
        best = 0.0
        for shape in todo:
            tflops = _matmul_tflops(shape, dtype, tf32, reps)
            result["matmul"].append(
                {
                    "precision": precision,
                    "shape": shape.label,
                    "tflops": round(tflops, 1),
                    "from": "run" if shape.count else "standard",
                }
            )
            best = max(best, tflops)
        result["peak_tflops"][precision] = round(best, 1)
    result["peak_tflops"]["fp32"] = round(_fma_tflops(props.multi_processor_count, reps), 1)
    return result


def _matmul_tflops(shape: GemmShape, dtype: Any, tf32: bool, reps: dict[str, int]) -> float:
    """TFLOP/s of one product of ``shape`` (median of ``do_bench``), random data."""
    import torch
    from triton.testing import do_bench

    lead = (shape.batch,) if shape.batch > 1 else ()
    a = torch.randn(*lead, shape.m, shape.k, device="cuda", dtype=dtype)
    b = torch.randn(*lead, shape.k, shape.n, device="cuda", dtype=dtype)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        ms = do_bench(functools.partial(torch.matmul, a, b), return_mode="median", **reps)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return shape.flops / (ms * 1e-3) / 1e12


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


def best_shapes(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per precision, the measured product that set its peak (``result["matmul"]`` entry)."""
    best: dict[str, dict[str, Any]] = {}
    for entry in result.get("matmul", []):
        if entry["tflops"] > best.get(entry["precision"], {}).get("tflops", -1.0):
            best[entry["precision"]] = entry
    return best


def record_in_run(run: str | os.PathLike[str], result: dict[str, Any]) -> str:
    """Write ``result`` into run directory ``run``'s manifest when it measured the run's GPU;
    says what it did, or why not (another GPU's ceilings would be wrong there)."""
    from kerneltriage import rundir

    path = Path(run)
    if not rundir.is_run_dir(path):
        return f"not recorded in {path}: not a run directory (a report of it can take --gpu)"
    manifest = rundir.read_manifest(path)
    gpu = str(manifest.gpu.get("name") or "")
    if gpu != result["gpu"]:
        return f"not recorded in {path}: it ran on {gpu or 'an unnamed GPU'}, this is {result['gpu']}"
    manifest.calibration = result
    rundir.write_manifest(path, manifest)
    return f"recorded in {path / rundir.MANIFEST}: its report uses these ceilings"


def main(argv: list[str] | None = None) -> int:
    """``python -m kerneltriage.profile.calibrate [--quick] [--json PATH]`` in the script's Python."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m kerneltriage.profile.calibrate")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args(argv)
    from kerneltriage.errors import KernelTriageError

    try:
        result = measure(args.device, args.quick)
    except KernelTriageError as exc:  # no GPU: one line for profile's log, not a traceback
        print(f"kerneltriage calibrate: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        print(
            f"kerneltriage calibrate: error: needs the {exc.name} package (pip install {exc.name})",
            file=sys.stderr,
        )
        return 3
    path = save(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"saved": str(path), **result}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
