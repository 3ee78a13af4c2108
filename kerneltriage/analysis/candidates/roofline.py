"""The roofline of a candidate: bytes, FLOPs and the ceiling time they allow on this GPU.

Counters (ncu) where the candidate's kernels are joined to them, analytic estimates from the
recorded shapes where not, and for fused regions the fused ceiling: only external inputs,
outputs and parameters cross HBM.

No kernel runs faster than a launch: the ceiling is never below launches × the GPU's
per-launch floor (one launch per fused instance for a region, the kernels it launches for an
op). A candidate whose floor exceeds its work ceiling is launch-bound: fewer launches pay,
a faster kernel does not. Without a GPU spec there is no ceiling at all.

A point measured above its roof means the roof is wrong, not the kernel: ``raised_roofs``
lifts the run's ceiling of that precision (or its bandwidth) to the best measured and says so.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np
import pandas as pd

from kerneltriage.analysis.candidates import estimate
from kerneltriage.analysis.candidates.estimate import Work, tensor_inputs
from kerneltriage.analysis.candidates.grouping import Group
from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.model import Roofline
from kerneltriage.ingest.kernel_names import base_name
from kerneltriage.ingest.ncu_csv import Counters


def _tensor_precision(g: Group) -> str:
    """The tensor-core precision of the group's dtype (bf16 when it cannot tell)."""
    dtype = g.attrs.get("dtype")
    if dtype is None:
        for _, seg in g.segments[:1]:
            op = seg.ops[0]
            tensors = tensor_inputs(op.dims, op.types)
            dtype = op.compute_type or (tensors[0][1] if tensors else None)
    return estimate.TENSOR_PRECISION.get(dtype or "", "bf16")


def _ceiling_ns(work: Work, gpu: GPUSpec, fill: float = 1.0) -> float:
    """Ceiling time of ``work``: its bytes at the memory roof, its FLOPs at the compute roof of
    its precision times ``fill`` (the share of the SMs its tiles can occupy)."""
    return max(work.bytes / gpu.bandwidth, work.flops / (gpu.peak(work.precision) * fill)) * 1e9


# Kinds whose kernels' names say the unit they compute on (kernel_classes.yaml ``precisions``).
_UNIT_KINDS = ("gemm", "convolution", "attention")


def kernel_unit(g: Group, k: pd.DataFrame) -> str | None:
    """The precision most of the group's kernel time runs at, read from the kernels' names
    (TF32 tensor-op sgemm, FP32 SIMT, bf16/fp16 tensor, FP8); None when the names do not say
    or the group is not a GEMM, convolution or attention."""
    if g.kind not in _UNIT_KINDS or k.empty:
        return None
    by: dict[str, float] = {}
    for name, dur in zip(k["name"].tolist(), k["dur"].to_numpy(dtype=float).tolist()):
        p = estimate.kernel_precision(name)
        if p is not None:
            by[p] = by.get(p, 0.0) + dur
    if not by:
        return None
    best = max(by, key=lambda p: by[p])
    return best if by[best] >= 0.5 * float(k["dur"].sum()) else None


def _bwd_rows(k: pd.DataFrame) -> set[tuple[int, int]]:
    """(step, forward row) of every op whose backward kernels ``k`` holds."""
    bwd = k["phase"] == "bwd"
    return set(zip(k.loc[bwd, "step"].tolist(), k.loc[bwd, "fwd_root"].tolist()))


#: Ops whose backward hands the gradient on unchanged (no kernel of their own).
_PASSTHROUGH_BWD = re.compile(r"^aten::(add|sub)_?$")


def fusion_headroom(g: Group, k: pd.DataFrame) -> float | None:
    """What a compile can take from a region holding a batch norm in training: the bytes its
    ops move one kernel each over those of one fused kernel. The norm's own passes (x three
    times forward, x and dy five times backward: ``regions.batch_statistics``) stay whoever
    writes them: ATen's batch-norm kernels take exactly those, and Inductor's fused ones took
    the norm's part of the step at about the same rate (timm ResNet-50 and EfficientNet-B0 on
    an H200, BENCHMARKS.md). What a compile removes is the traffic of the ops fused into it:
    each op alone reads its inputs and writes its output (and its backward, but for an add's,
    which hands dy on); fused, it adds only the inputs besides the tensor flowing through (a
    residual). None for any other group."""
    if g.level != "region" or not g.segments or not all(seg.stats_bytes for _, seg in g.segments):
        return None
    bwd = _bwd_rows(k)
    fused = alone = 0.0
    for step, seg in g.segments:
        backward = any((step, r) in bwd for r in seg.rows)
        x = seg.stats_bytes
        norm = 3.0 * x + (5.0 * x if backward else 0.0)
        fused, alone = fused + norm, alone + norm
        for op in seg.ops:
            tensors = tensor_inputs(op.dims, op.types)
            if op.kind == "norm" or all(not d for d, _ in tensors):
                continue  # the norm's passes are counted; a 0-dim counter moves nothing
            w = estimate.op_work(op.kind, op.name, op.dims, op.types, op.concrete, op.compute_type)
            if w is None:
                return None
            back = 0.0 if _PASSTHROUGH_BWD.match(op.name) or not backward else estimate.bwd_factor(op.kind)[1]
            alone += w.bytes * (1.0 + back)
            sizes = [estimate.numel(d) * estimate.dtype_bytes(t) for d, t in tensors]
            flowing = next((i for i, b in enumerate(sizes) if b == x), None)
            fused += sum(b for i, b in enumerate(sizes) if i != flowing)
    return max(1.0, alone / fused) if fused else None


def _estimate_total(g: Group, k: pd.DataFrame, sms: int = 0) -> tuple[Work | None, float]:
    """Summed forward + backward work of the group's instances, and the share of the GPU's
    compute its GEMM tiles can fill (FLOP-weighted, wave quantization on ``sms`` SMs)."""
    bwd_steps_rows = _bwd_rows(k)
    total_bytes = total_flops = filled_flops = 0.0
    precision = None
    # Instances share their shapes (the trace interns argument lists): each is estimated once.
    known: dict[tuple, Work | None] = {}
    for step, seg in g.segments:
        if seg.level == "region":
            fwd = seg.ideal
        else:
            op = seg.ops[0]
            key = (seg.kind, op.name, id(op.dims), id(op.types), id(op.concrete), op.compute_type)
            if key not in known:
                known[key] = estimate.op_work(
                    seg.kind, op.name, op.dims, op.types, op.concrete, op.compute_type
                )
            fwd = known[key]
        if fwd is None:
            return None, 1.0
        precision = fwd.precision
        # Batch statistics: x read once more forward; dy and x once more backward.
        works = [dataclasses.replace(fwd, bytes=fwd.bytes + seg.stats_bytes)]
        if any((step, r) in bwd_steps_rows for r in seg.rows):
            fl, by = estimate.bwd_factor(seg.kind)
            bwd = fwd.scaled(fl, by)
            works.append(dataclasses.replace(bwd, bytes=bwd.bytes + 2.0 * seg.stats_bytes))
        for w in works:
            total_bytes += w.bytes
            total_flops += w.flops
            filled_flops += w.flops / estimate.fill(w.tiles, sms)
    if precision is None:
        return None, 1.0
    unit = kernel_unit(g, k)
    if unit is not None:
        # The kernels' own unit: an fp32 GEMM cuBLAS ran on TF32 tensor cores is placed
        # against the TF32 ceiling, not the FP32 SIMT one.
        precision = unit
    fill = total_flops / filled_flops if filled_flops else 1.0
    return Work(total_flops, total_bytes, precision), fill


def _launches(k: pd.DataFrame) -> float:
    """Kernel launches the launch floor counts: as launched (copies run on the copy engines).
    A fused region counts its launches too: how many kernels a fusion would leave is a guess,
    and one launch per instance gave ceilings hundreds of times below what ran."""
    return float((k["kind"] == "kernel").sum())


def _floor_ns(k: pd.DataFrame, per_launch_ns: float) -> float:
    """The launch floor of ``k``: each kernel launch at the GPU's per-launch floor, or at what
    it ran where it ran shorter (the floor is an estimate off its measured family; a kernel
    that ran shorter shows this GPU's floor is lower, not that it beat its ceiling)."""
    dur = k.loc[(k["kind"] == "kernel").to_numpy(), "dur"].to_numpy(dtype=float)
    return float(np.minimum(dur, per_launch_ns).sum())


def place_on_roofline(
    g: Group,
    k: pd.DataFrame,
    rows: pd.Series,
    counters: Counters | None,
    gpu: GPUSpec | None,
    n_steps: int,
    lent: np.ndarray | None = None,
) -> Roofline:
    """``g``'s bytes, FLOPs and ceiling per step. ``k``: its kernels; ``rows``: their ncu rows
    (-1 where not joined); ``lent``: per kernel, the factor on its row's counts (a row lent
    by another size of the same instantiation: ``join.py``'s scaled joins)."""
    total_ns = float(k["dur"].sum())
    if gpu is None:
        joined = float(k.loc[(rows >= 0).to_numpy(), "dur"].sum()) / total_ns if total_ns else 0.0
        return Roofline(None, None, None, None, None, None, None, "none", None, None, joined)
    est, fill = _estimate_total(g, k, gpu.sms) if g.segments else (None, 1.0)
    est_ceiling = _ceiling_ns(est, gpu, fill) if est else None

    joined = rows >= 0
    coverage = float(k.loc[joined.to_numpy(), "dur"].sum()) / total_ns if total_ns else 0.0
    counted: tuple[float, float, float] | None = None  # Nsight Compute's (ceiling ns, bytes, FLOPs)
    measured_bytes = None
    if counters is not None and joined.any():
        c = counters.rows.iloc[rows[joined].to_numpy()]
        factor = lent[joined.to_numpy()] if lent is not None else 1.0
        by = c["dram_bytes"].to_numpy(dtype=float) * factor
        parts = {
            "fp32": c["flops_fp32"].to_numpy(dtype=float) * factor,
            "fp64": c["flops_fp64"].to_numpy(dtype=float) * factor,
            "fp16": c["flops_fp16"].to_numpy(dtype=float) * factor,
        }
        # Tensor FLOPs run at the peak of the precision the counter saw (else the op's dtype).
        fallback = _tensor_precision(g)
        tensor = c["flops_tensor"].to_numpy(dtype=float) * factor
        tensor_peak = np.array([gpu.peak(p or fallback) for p in c["tensor_precision"]], dtype=float)
        if np.isfinite(by).any():
            per_kernel = np.nan_to_num(by) / gpu.bandwidth
            flops_time = sum(np.nan_to_num(v) / gpu.peak(p) for p, v in parts.items())
            flops_time = flops_time + np.nan_to_num(tensor) / tensor_peak
            ceilings = np.maximum(per_kernel, flops_time)
            scale = 1.0 / coverage if coverage else 0.0  # unjoined kernels: same efficiency
            counted = (
                float(ceilings.sum()) * 1e9 * scale,
                float(np.nansum(by)) * scale,
                float(sum(np.nansum(v) for v in parts.values()) + np.nansum(tensor)) * scale,
            )
            measured_bytes = counted[1] / n_steps

    ceiling: float | None
    bytes_: float | None
    if g.level == "region" and est is not None:
        # The fused ceiling: only external inputs, outputs and parameters cross HBM.
        ceiling, bytes_, flops, source = est_ceiling, est.bytes, est.flops, "fused estimate"
    elif counted is not None and coverage >= 0.5:
        cnt_ceiling, bytes_, cnt_flops = counted
        ceiling = max(cnt_ceiling, est_ceiling or 0.0)
        flops = max(cnt_flops, est.flops if est else 0.0)
        source = "ncu+estimate" if est_ceiling and est_ceiling > cnt_ceiling else "ncu"
    elif est is not None:
        ceiling, bytes_, flops, source = est_ceiling, est.bytes, est.flops, "estimate"
    elif counted is not None:
        ceiling, bytes_, flops = counted
        source = "ncu"
    else:
        return Roofline(None, None, None, None, None, None, None, "none", None, measured_bytes, coverage)

    precision = est.precision if est else (kernel_unit(g, k) or _tensor_precision(g))
    if flops and bytes_ and flops / bytes_ < 1.0:
        precision = precision if est else "fp32"
    launches = _launches(k)
    floor_ns = _floor_ns(k, gpu.launch_floor_us * 1e3)
    work_ceiling = ceiling
    launch_bound = bool(floor_ns > (work_ceiling or 0.0))
    ceiling = max(work_ceiling or 0.0, floor_ns) or None
    time_s = total_ns / 1e9
    intensity = flops / bytes_ if bytes_ else None
    mem_time = bytes_ / gpu.bandwidth if bytes_ else 0.0
    compute_time = flops / (gpu.peak(precision) * fill) if flops else 0.0
    return Roofline(
        bytes=bytes_ / n_steps,
        flops=flops / n_steps,
        intensity=intensity,
        achieved_gbs=bytes_ / time_s / 1e9 if time_s and bytes_ else None,
        achieved_tflops=flops / time_s / 1e12 if time_s and flops else None,
        bound="compute" if compute_time > mem_time else "memory",
        ceiling_ms=ceiling / n_steps / 1e6 if ceiling else None,
        source=source,
        precision=precision,
        measured_dram_bytes=measured_bytes,
        counters_coverage=coverage,
        launches_per_step=launches / n_steps,
        launch_floor_ms=floor_ns / n_steps / 1e6,
        work_ceiling_ms=work_ceiling / n_steps / 1e6 if work_ceiling else None,
        launch_bound=launch_bound,
        fill=fill if est is not None else 1.0,
    )


# A point above its roof is a kernel that ran faster than the ceiling allows: the FLOPs (or
# DRAM bytes) Nsight Compute counted for a launch over the time the trace measured for it.
# Shape estimates (a causal mask skips half the FLOPs they count) and fused ceilings are not
# measurements and never move a roof. Launches of one kernel with the same counts are one
# shape; their summed counts over their summed time is its rate.
#
# DRAM bytes come from ncu, which flushes the caches before each kernel; in the run a kernel
# whose data fits in L2 beats the HBM roof without HBM being faster. Only launches moving
# this many times the L2 size say anything about the memory roof, and only those that read
# and write (the roof is a copy's: a write-only fill streams faster than anything that reads).
_L2_MULTIPLE = 2.0
_MIN_DIRECTION_SHARE = 0.1
_PIPES = ("flops_fp32", "flops_fp64", "flops_fp16")


@dataclasses.dataclass(frozen=True)
class RaisedRoof:
    """One ceiling a run measured above: which, from what to what, and the kernel."""

    ceiling: str  # a precision ("bf16") or "bandwidth"
    old: float  # TFLOP/s, or GB/s for bandwidth
    new: float
    kernel: str  # the kernel that ran above it (base name)
    launch: int = -1  # the kernel table's index of one of its launches

    @property
    def unit(self) -> str:
        return "GB/s" if self.ceiling == "bandwidth" else "TFLOP/s"

    def warning(self, candidate: str = "") -> str:
        """What the report says: the kernel (in ``candidate``, the op or region holding it)."""
        what = "memory roof" if self.ceiling == "bandwidth" else f"{self.ceiling} ceiling"
        where = f" in {candidate}" if candidate else ""
        hint = (
            ""
            if self.ceiling == "bandwidth"
            else " (isolated products, as kerneltriage calibrate times them, run slower than GEMMs inside a step)"
        )
        return (
            f"kernel {self.kernel}{where} ran at {self.new:.4g} {self.unit}, above the {what} of "
            f"{self.old:.4g} {self.unit}: that roof was too low, so this report raises it to "
            f"{self.new:.4g} {self.unit}{hint}"
        )


def _round_up(value: float) -> float:
    """One decimal, up: a kernel at the raised roof never draws above it."""
    return float(np.ceil(value * 10.0) / 10.0)


def raised_roofs(
    kernels: pd.DataFrame, rows: pd.Series, counters: Counters | None, gpu: GPUSpec | None
) -> list[RaisedRoof]:
    """The ceilings of ``gpu`` that a kernel measured with counters ran above: per precision
    (and bandwidth), the best such rate. ``kernels``: the step kernels (``name``, ``dur``);
    ``rows``: their ncu rows (-1 where not joined)."""
    if gpu is None or counters is None or kernels.empty:
        return []
    joined = (rows.reindex(kernels.index).fillna(-1).to_numpy() >= 0) & (kernels["dur"].to_numpy() > 0)
    if not joined.any():
        return []
    k = kernels.loc[joined, ["name", "dur"]]
    c = counters.rows.iloc[rows.reindex(kernels.index).to_numpy()[joined].astype(int)]
    fallback = "bf16"
    frame = pd.DataFrame(
        {
            "launch": k.index.to_numpy(),
            "name": k["name"].astype(str).to_numpy(),
            "dur": k["dur"].to_numpy(dtype=float),
            "tensor": np.nan_to_num(c["flops_tensor"].to_numpy(dtype=float)),
            "precision": [gpu.unit(p or fallback) for p in c["tensor_precision"]],
            "bytes": np.nan_to_num(c["dram_bytes"].to_numpy(dtype=float)),
            "mixed": _reads_and_writes(c),
            **{pipe: np.nan_to_num(c[pipe].to_numpy(dtype=float)) for pipe in _PIPES},
        }
    )
    best: dict[str, RaisedRoof] = {}

    def consider(ceiling: str, old: float, rate: float, kernel: str, launch: int) -> None:
        # Above the datasheet no counter or join can be trusted: such a rate moves nothing.
        datasheet = gpu.peak_bandwidth_gbs if ceiling == "bandwidth" else gpu.peak_tflops.get(ceiling)
        if datasheet and rate > datasheet:
            return
        new = _round_up(rate)
        if rate > old and (ceiling not in best or new > best[ceiling].new):
            best[ceiling] = RaisedRoof(ceiling, old, new, base_name(kernel), launch)

    keys = ["name", "precision", "tensor", "bytes", *_PIPES]
    for key, g in frame.groupby(keys, sort=False):
        name, precision, tensor, bytes_ = key[0], key[1], key[2], key[3]
        seconds = float(g["dur"].sum()) * 1e-9
        launches = len(g)
        first = int(g["launch"].iloc[0])
        if tensor > 0:
            consider(precision, gpu.ceiling_tflop(precision), tensor * launches / seconds / 1e12, name, first)
        for pipe, flops in zip(_PIPES, key[4:]):
            unit = gpu.unit(pipe.removeprefix("flops_"))
            if flops > 0:
                consider(unit, gpu.ceiling_tflop(unit), flops * launches / seconds / 1e12, name, first)
        if bytes_ >= gpu.l2_mb * 1e6 * _L2_MULTIPLE and g["mixed"].all():
            consider("bandwidth", gpu.ceiling_bandwidth_gbs, bytes_ * launches / seconds / 1e9, name, first)
    return sorted(best.values(), key=lambda r: r.ceiling)


def _reads_and_writes(c: pd.DataFrame) -> np.ndarray:
    """Rows whose DRAM traffic is both reads and writes (each a tenth of it or more)."""
    total = np.nan_to_num(c["dram_bytes"].to_numpy(dtype=float))
    shares = [np.nan_to_num(c[col].to_numpy(dtype=float)) for col in ("dram_read_bytes", "dram_write_bytes")]
    floor = _MIN_DIRECTION_SHARE * total
    return (total > 0) & (shares[0] >= floor) & (shares[1] >= floor)


def with_raised_roofs(gpu: GPUSpec, raised: Sequence[RaisedRoof]) -> GPUSpec:
    """``gpu`` with the raised ceilings in place of its own; its source says which and why."""
    tflops = dict(gpu.measured_tflops)
    bandwidth = gpu.measured_bandwidth_gbs
    for r in raised:
        if r.ceiling == "bandwidth":
            bandwidth = r.new
        else:
            tflops[r.ceiling] = r.new
    said = ", ".join(f"{r.ceiling} {r.old:.4g} → {r.new:.4g} {r.unit}" for r in raised)
    return dataclasses.replace(
        gpu,
        measured_tflops=tflops,
        measured_bandwidth_gbs=bandwidth,
        measured={
            **gpu.measured,
            "raised": {r.ceiling: {"from": r.old, "to": r.new, "kernel": r.kernel} for r in raised},
        },
        source=f"{gpu.source}; raised by this run's own kernels: {said}",
    )
