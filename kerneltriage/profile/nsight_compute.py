"""Phase 2: Nsight Compute on the hot kernels only.

The hot kernels come from the phase-1 trace (``kerneltriage.analysis.timeline.hot_kernels``). The run
profiles one recorded step (NVTX start/end range set by the runner on the profiled rank),
``-k regex:`` on the hot kernels' base names, and ``--filter-mode per-launch-config
--launch-count 1``: each unique (kernel, grid, block) once.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kerneltriage.profile.step_plan import NCU_RANGE, SKIP_RANGE, TAKE_RANGE

#: Tensor-pipe FLOPs by source precision. Each costs a replay pass of every profiled launch
#: (five of the full set's six on an H200: BENCHMARKS.md), so only the precisions the hot
#: kernels' ops run in are collected (``HotKernels.tensor_precisions``).
TENSOR_METRICS = {
    "bf16": "sm__ops_path_tensor_src_bf16_dst_fp32",
    "fp16": "sm__ops_path_tensor_src_fp16",
    "tf32": "sm__ops_path_tensor_src_tf32_dst_fp32",
    "fp8": "sm__ops_path_tensor_src_fp8",
    "fp64": "sm__ops_path_tensor_src_fp64",
}
#: The roofline metric set: duration, DRAM and L2 bytes, FP32/FP16/FP64 instruction counts,
#: tensor-pipe FLOPs by source type, and speed-of-light percentages.
ROOFLINE_METRICS = [
    "gpu__time_duration.sum",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_bytes.sum",
    *(
        f"smsp__sass_thread_inst_executed_op_{p}{op}_pred_on.sum"
        for p in "fhd"
        for op in ("add", "mul", "fma")
    ),
    *(f"{TENSOR_METRICS[p]}.sum" for p in ("bf16", "fp16", "tf32", "fp8", "fp64")),
    # DRAM speed-of-light % rides in the passes above. The SM and compute-memory SOL %
    # (sm__throughput, gpu__compute_memory_throughput) would cost 9 more replay passes on every
    # launch (15 instead of 6 on an H200: benchmarks/probes/ncu_passes.sh) and the roofline
    # does not use them; --ncu-set full collects them with the full sections.
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
]
PERMISSION_HELP = (
    "Nsight Compute needs access to the GPU performance counters (ERR_NVGPUCTRPERM). Run as root, "
    "or allow all users: add 'options nvidia NVreg_RestrictProfilingToAdminUsers=0' to a file in "
    "/etc/modprobe.d/ and reload the driver (or reboot); in a container, add --cap-add=SYS_ADMIN. "
    "See https://developer.nvidia.com/ERR_NVGPUCTRPERM"
)
# "==PROF== Profiling "name" - 4 (5/150): 0%…" or, with NVTX filters, "==PROF== Profiling "name": 0%…"
_PROGRESS = re.compile(
    r'==PROF== Profiling "(?P<name>[^"]*)"(?: - (?P<id>\d+))?(?: \((?P<i>\d+)/(?P<n>\d+)\))?'
)


#: (ncu, what) -> its answer being asked for in the background (``prefetch``).
_ASKED: dict[tuple[str, str], Future[Any]] = {}


def prefetch(ncu: str) -> None:
    """Ask ncu for its version and the GPU's metrics now, in the background: phase 2's plan
    needs them only after phase 1, and each is a process of ncu's own (``--query-metrics``
    takes seconds). ``ncu_version`` and ``available_metrics`` then wait for these answers."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="ncu-query")
    for what, ask in (("version", _ncu_version), ("metrics", _available_metrics)):
        if (ncu, what) not in _ASKED:
            _ASKED[(ncu, what)] = pool.submit(ask, ncu)
    pool.shutdown(wait=False)  # its threads end with their queries


def available_metrics(ncu: str) -> set[str] | None:
    """Metric names the attached GPU supports (None when ncu cannot tell)."""
    asked = _ASKED.get((ncu, "metrics"))
    return asked.result() if asked is not None else _available_metrics(ncu)


def _available_metrics(ncu: str) -> set[str] | None:
    try:
        proc = subprocess.run(
            [ncu, "--query-metrics"], capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = {
        line.split()[0] for line in proc.stdout.splitlines() if line and not line.startswith(("-", " ", "="))
    }
    return names or None


def metric_list(available: set[str] | None, precisions: list[str] | None = None) -> list[str]:
    """The roofline metrics the GPU supports (all when ``available`` is None), the tensor-pipe
    counters only for ``precisions`` (all when None)."""
    left_out = {m for p, m in TENSOR_METRICS.items() if precisions is not None and p not in precisions}
    metrics = [m for m in ROOFLINE_METRICS if m.split(".")[0] not in left_out]
    if available is None:
        return metrics
    # --query-metrics lists base names (dram__bytes_read); ours carry a roll-up suffix (.sum).
    return [m for m in metrics if m.split(".")[0] in available]


def light_metrics(metrics: list[str]) -> list[str]:
    """``metrics`` without the instruction and tensor-pipe counters: what a kernel of a
    memory-bound kind needs (time, DRAM and L2 bytes), in one replay pass instead of three,
    without the save and restore of the process's GPU memory between passes
    (``kernel_classes.yaml``, ``memory_bound``)."""
    return [m for m in metrics if not m.startswith(("smsp__sass_", "sm__ops_path_tensor"))]


def kernel_regex(names: list[str], instances: dict[str, list[str]] | None = None) -> str:
    """``-k`` filter on mangled names (``--kernel-name-base mangled``).

    A mangled C++ name spells each identifier as <length><name> (``_ZN2at6native29vectorized_
    elementwise_kernelILi4E…``), so ``29vectorized_elementwise_kernel`` matches that kernel and
    ``18elementwise_kernel`` does not. The length may follow another digit: functions in an
    anonymous namespace mangle as ``…_GLOBAL__N_120softmax_warp_forward…``. Unmangled names
    (cuBLAS ``nvjet_…``, Triton kernels) match whole.

    ``instances``: base names of which only some instantiations are wanted -> their names as
    the trace spells them. Each is matched by its base name followed by the identifiers of its
    template arguments, in the order a mangled name spells them (``kernel_names.
    template_identifiers``): ``29vectorized_elementwise_kernel.*13AUnaryFunctor.*10MulFunctor``.
    Instantiations those identifiers do not tell apart (one functor of two dtypes) are all
    taken: more launches, never fewer.
    """
    from kerneltriage.ingest.kernel_names import template_identifiers

    instances = instances or {}
    whole = [re.escape(n) for n in names if n not in instances]
    spelled = []
    for n in names:
        if n not in instances:
            spelled.append(f"{len(n)}{re.escape(n)}")
            continue
        for full in instances[n]:
            if full.startswith("_Z") or full == n:  # left mangled by the trace, or no C++ name
                whole.append(re.escape(full))
                continue
            spelled.append(
                f"{len(n)}{re.escape(n)}"
                + "".join(f".*{len(w)}{re.escape(w)}" for w in template_identifiers(full))
            )
    alternatives = []
    if whole:
        alternatives.append(f"^(?:{'|'.join(whole)})$")
    if spelled:
        alternatives.append(f"(?:{'|'.join(spelled)})")
    return "regex:" + "|".join(alternatives)


def ncu_command(
    ncu: str,
    report: Path,
    kernels: list[str],
    metrics: list[str],
    app: list[str],
    *,
    nvtx: bool = True,
    full_set: bool = False,
    every_launch: int | None = None,
    from_start: bool = True,
    first_of_size: bool = False,
    instances: dict[str, list[str]] | None = None,
    skip: bool = False,
) -> list[str]:
    """The ncu command line for phase 2 (``report`` without the .ncu-rep suffix).

    By default one launch per unique launch configuration; ``every_launch=N`` profiles the
    first N launches instead (the second pass, for kernels that run several sizes), and with
    ``first_of_size`` only those inside the range the runner opens around the first call of
    each op signature of the step (``first_of_size.py``).
    """
    cmd = [
        ncu,
        "--target-processes",
        "all",
        "--clock-control",
        "none",
        "--force-overwrite",
        "-o",
        str(report),
    ]
    if not from_start:
        # The runner calls cudaProfilerStart at the profiled step: the launches before it
        # (start-up, warm-up) are not intercepted one by one.
        cmd += ["--profile-from-start", "off"]
    if nvtx:
        # A start/end range (no trailing slash): process-wide, so backward kernels count.
        cmd += ["--nvtx", "--nvtx-include", TAKE_RANGE if first_of_size else NCU_RANGE]
        if skip:  # calls of sizes whose counters are scaled from another (one_size.py)
            cmd += ["--nvtx-exclude", SKIP_RANGE]
    if kernels:
        # Mangled names tell template instantiations apart, so per-launch-config profiles
        # each instantiation (with base names, one bf16 copy would stand for every functor).
        cmd += ["--kernel-name-base", "mangled", "-k", kernel_regex(kernels, instances)]
    if every_launch is None:
        cmd += ["--filter-mode", "per-launch-config", "--launch-count", "1"]
    else:
        cmd += ["--launch-count", str(every_launch)]
    if full_set:
        cmd += ["--set", "full"]
    cmd += ["--metrics", ",".join(metrics)]
    return [*cmd, *app]


def export_command(ncu: str, report: Path, names: str = "demangled") -> list[str]:
    """The CSV export of a report, kernel names ``demangled`` (or ``mangled``: ncu_names.py)."""
    return [ncu, "--import", str(report), "--csv", "--page", "raw", "--print-kernel-base", names]


@dataclass
class NcuProgress:
    index: int  # 1-based count of profiled launches so far
    kernel: str


def parse_progress(line: str, seen: int) -> NcuProgress | None:
    """ncu prints ``==PROF== Profiling "name" - 4 (5/150): …`` per profiled launch."""
    match = _PROGRESS.search(line)
    if match is None:
        return None
    return NcuProgress(index=seen + 1, kernel=match.group("name"))


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for candidate in [
        *sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu")),
        Path("/usr/local/cuda/bin/ncu"),
    ]:
        if candidate.is_file():
            return str(candidate)
    return None


def ncu_version(ncu: str) -> str | None:
    asked = _ASKED.get((ncu, "version"))
    return asked.result() if asked is not None else _ncu_version(ncu)


def _ncu_version(ncu: str) -> str | None:
    try:
        out = subprocess.run(
            [ncu, "--version"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"Version (\S+)", out)
    return match.group(1) if match else None
