"""What the profiled process says about itself: versions and GPU, Dynamo's own counts, whether
a profiler is on, its peak host memory and its peak GPU memory.

Runs inside the user's process (``hooks.py``): torch is passed in, never imported here, and
Dynamo is read only when the program already loaded it.
"""

from __future__ import annotations

import sys
from typing import Any


def max_rss_mb() -> float | None:
    """This process's peak resident host memory so far, in MiB (None where the OS does not say)."""
    try:
        import resource
    except ImportError:  # not a POSIX system
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)  # bytes on macOS


def dynamo_graphs() -> int:
    """Graphs Dynamo has compiled in this process so far (0 when it never ran)."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    return int(counters["stats"]["unique_graphs"]) if counters is not None else 0


def dynamo_facts() -> dict[str, Any] | None:
    """Dynamo's own counts so far, as ``TORCH_LOGS=graph_breaks,recompiles`` reports them:
    graph breaks (with the first line of each reason), graphs compiled, and recompiles with
    the guard that failed. None when Dynamo never ran in this process."""
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    if counters is None or (not counters["stats"]["unique_graphs"] and not counters["graph_break"]):
        return None
    breaks = counters["graph_break"]
    failures = getattr(utils, "guard_failures", None) or {}
    recompiles = [
        {"code": getattr(code, "co_name", str(code)), "reason": str(reason).strip()[:300]}
        for code, reasons in list(failures.items())
        for reason in reasons
    ]
    return {
        "graph_breaks": int(sum(breaks.values())),
        "graph_break_reasons": [
            {"reason": str(r).strip().splitlines()[0][:300], "count": int(n)}
            for r, n in list(breaks.items())[:20]
        ],
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "frames": int(counters["frames"]["total"]),
        "recompiles": len(recompiles),
        "recompile_reasons": recompiles[:20],
    }


def profiler_enabled(torch: Any) -> bool:
    """Whether any torch profiler (autograd or Kineto) is on in this process now."""
    if torch is None:
        return False
    check = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None)
    try:
        return bool(check()) if check is not None else False
    except Exception:
        return False


def environment(torch: Any) -> dict[str, Any]:
    """Python, torch, CUDA and Triton versions, and the current GPU (the manifest's)."""
    import platform

    env: dict[str, Any] = {"python": platform.python_version()}
    if torch is None:
        return env
    env["torch"] = torch.__version__
    env["cuda"] = torch.version.cuda
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        env["gpu"] = {
            "name": p.name,
            "sms": p.multi_processor_count,
            "memory_gb": round(p.total_memory / 1e9, 1),
            "capability": f"{p.major}.{p.minor}",
            "count": torch.cuda.device_count(),
        }
    return env


def gpu_peak_mb(torch: Any) -> float | None:
    """The most GPU memory the process's caching allocator held on any one GPU (MiB); None
    without CUDA."""
    try:
        if torch is None or not torch.cuda.is_initialized():
            return None
        peak = max(torch.cuda.max_memory_reserved(d) for d in range(torch.cuda.device_count()))
        return round(peak / 2**20, 1)
    except Exception:  # a failed CUDA context must not lose the status
        return None
