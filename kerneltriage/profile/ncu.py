"""Phase 2: Nsight Compute on the hot kernels only.

From the phase-1 trace: the kernels covering ``coverage`` of GPU time in the recorded steps
(capped by ``max_kernels``, communication kernels left out: ncu serializes kernels, which can
hang collectives). The run profiles one recorded step (NVTX start/end range set by the
runner on the profiled rank), ``-k regex:`` on the hot kernels' base names, and
``--filter-mode per-launch-config --launch-count 1``: each unique (kernel, grid, block) once.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from kerneltriage.profile.hooks import NCU_RANGE

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
    "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
    "sm__ops_path_tensor_src_fp16.sum",
    "sm__ops_path_tensor_src_tf32_dst_fp32.sum",
    "sm__ops_path_tensor_src_fp8.sum",
    "sm__ops_path_tensor_src_fp64.sum",
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


@dataclass
class HotKernels:
    names: list[str]  # base names, hottest first
    configs: int  # distinct (kernel, grid, block) among them in one step: the expected row count
    coverage: float  # share of in-step GPU kernel time they cover
    left_out: list[str]  # communication kernels excluded on purpose
    # Kernels whose one launch configuration runs different problem sizes (persistent GEMMs
    # launch #SMs blocks whatever the size): one profiled launch cannot stand for the others,
    # so a pass of its own, run first, profiles every launch of these in the step.
    variable: list[str] = field(default_factory=list)
    variable_launches: int = 0
    variable_configs: int = 0  # the configurations of ``configs`` that belong to ``variable``


#: Launches of one (kernel, grid, block) whose durations differ by more than this factor run
#: different problem sizes.
VARIABLE_SPREAD = 2.0
#: ... and only when they take at least this share of the step's kernel time.
VARIABLE_MIN_SHARE = 0.02


def select_hot_kernels(
    trace: Path, coverage: float = 0.95, max_kernels: int = 64, max_variable_launches: int = 48
) -> HotKernels:
    """The base names of the kernels covering ``coverage`` of GPU kernel time in the steps."""
    from kerneltriage.analysis.attribution import attribute
    from kerneltriage.analysis.rules import load_rules
    from kerneltriage.ingest.names import base_name
    from kerneltriage.ingest.source import read_timeline

    timeline = read_timeline(Path(trace))
    attr = attribute(timeline)
    k = attr.kernels
    k = k[(k["step"] >= 0) & (k["kind"] == "kernel")]
    if k.empty:
        return HotKernels([], 0, 0.0, [])
    rules = load_rules()
    k = k.assign(base=k["name"].map(base_name))
    k = k.assign(kindof=[rules.classify(None, n) for n in k["name"]])
    comm = sorted(set(k.loc[k["kindof"] == "communication", "base"]))
    compute = k[k["kindof"] != "communication"]
    by_name = compute.groupby("base")["dur"].sum().sort_values(ascending=False)
    total = float(by_name.sum()) or 1.0
    chosen: list[str] = []
    covered = 0.0
    for name, dur in by_name.items():
        if covered / total >= coverage or len(chosen) >= max_kernels:
            break
        chosen.append(str(name))
        covered += float(dur)
    one_step = compute[(compute["step"] == compute["step"].min()) & compute["base"].isin(chosen)]
    key = ["name", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]
    configs = len(one_step.drop_duplicates(key))
    # Kernels whose one configuration runs several sizes, if they matter: heaviest first, as
    # long as profiling every launch of their base name stays within the launch budget.
    groups = one_step.groupby(key)["dur"]
    spread = groups.max() / groups.min().clip(lower=1)
    weight = groups.sum() / max(1.0, float(one_step["dur"].sum()))
    heavy = spread[(spread > VARIABLE_SPREAD) & (weight >= VARIABLE_MIN_SHARE)].index
    variable: list[str] = []
    launches = 0
    for name in sorted(
        {base_name(k[0]) for k in heavy}, key=lambda n: -one_step.loc[one_step["base"] == n, "dur"].sum()
    ):
        count = int((one_step["base"] == name).sum())
        if launches + count <= max_variable_launches:
            variable.append(name)
            launches += count
    variable_configs = len(one_step[one_step["base"].isin(variable)].drop_duplicates(key))
    return HotKernels(chosen, configs, covered / total, comm, variable, launches, variable_configs)


def available_metrics(ncu: str) -> set[str] | None:
    """Metric names the attached GPU supports (None when ncu cannot tell)."""
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


def metric_list(available: set[str] | None) -> list[str]:
    if available is None:
        return list(ROOFLINE_METRICS)
    # --query-metrics lists base names (dram__bytes_read); ours carry a roll-up suffix (.sum).
    return [m for m in ROOFLINE_METRICS if m.split(".")[0] in available]


def kernel_regex(names: list[str]) -> str:
    """``-k`` filter on mangled names (``--kernel-name-base mangled``).

    A mangled C++ name spells each identifier as <length><name> (``_ZN2at6native29vectorized_
    elementwise_kernelILi4E…``), so ``29vectorized_elementwise_kernel`` matches that kernel and
    ``18elementwise_kernel`` does not. The length may follow another digit: functions in an
    anonymous namespace mangle as ``…_GLOBAL__N_120softmax_warp_forward…``. Unmangled names
    (cuBLAS ``nvjet_…``, Triton kernels) match whole.
    """
    whole = "|".join(re.escape(n) for n in names)
    spelled = "|".join(f"{len(n)}{re.escape(n)}" for n in names)
    return f"regex:^(?:{whole})$|(?:{spelled})"


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
) -> list[str]:
    """The ncu command line for phase 2 (``report`` without the .ncu-rep suffix).

    By default one launch per unique launch configuration; ``every_launch=N`` profiles the
    first N launches instead (the second pass, for kernels that run several sizes).
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
    if nvtx:
        # A start/end range (no trailing slash): process-wide, so backward kernels count.
        cmd += ["--nvtx", "--nvtx-include", NCU_RANGE]
    if kernels:
        # Mangled names tell template instantiations apart, so per-launch-config profiles
        # each instantiation (with base names, one bf16 copy would stand for every functor).
        cmd += ["--kernel-name-base", "mangled", "-k", kernel_regex(kernels)]
    if every_launch is None:
        cmd += ["--filter-mode", "per-launch-config", "--launch-count", "1"]
    else:
        cmd += ["--launch-count", str(every_launch)]
    if full_set:
        cmd += ["--set", "full"]
    cmd += ["--metrics", ",".join(metrics)]
    return [*cmd, *app]


def export_command(ncu: str, report: Path) -> list[str]:
    return [ncu, "--import", str(report), "--csv", "--page", "raw", "--print-kernel-base", "demangled"]


@dataclass
class Progress:
    index: int  # 1-based count of profiled launches so far
    kernel: str


def parse_progress(line: str, seen: int) -> Progress | None:
    """ncu prints ``==PROF== Profiling "name" - 4 (5/150): …`` per profiled launch."""
    match = _PROGRESS.search(line)
    if match is None:
        return None
    return Progress(index=seen + 1, kernel=match.group("name"))


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
    try:
        out = subprocess.run(
            [ncu, "--version"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"Version (\S+)", out)
    return match.group(1) if match else None
