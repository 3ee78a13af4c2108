"""From attributed kernels to ranked write-or-skip verdicts. Pure functions over tables.

1. Segment each step's forward ops into fused regions and single ops (``regions.py``).
2. Group segments across layers and steps into candidates by (kind, variant, ops, key shape);
   backward kernels join their forward op's candidate; optimizer kernels, ops without a
   forward op and unattributed kernels form candidates of their own.
3. Place each candidate on the roofline: counters where joined, analytic estimates where not,
   the fused ceiling for regions.
4. Test the three conditions (headroom, hotness, shape stability) and pick a verdict from the
   rules; expected saving = share × (1 − 1/headroom) (Amdahl).
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import yaml

from kerneltriage.analysis import estimate
from kerneltriage.analysis.attribution import Attribution, attribute
from kerneltriage.analysis.estimate import Work, tensor_inputs
from kerneltriage.analysis.gpus import GPUSpec
from kerneltriage.analysis.idle import communication_overlap, idle_gaps
from kerneltriage.analysis.join import JoinResult, join_counters
from kerneltriage.analysis.model import (
    Candidate,
    Condition,
    KernelInfo,
    Report,
    Roofline,
    Shapes,
)
from kerneltriage.analysis.regions import OpInfo, Segment, segment
from kerneltriage.analysis.rules import Rules
from kerneltriage.errors import TraceFormatError
from kerneltriage.ingest.names import base_name
from kerneltriage.ingest.ncu import Counters
from kerneltriage.ingest.tables import Timeline
from kerneltriage.resources import data_path

_GEMM_LEAF = re.compile(
    r"^aten::(mm|bmm|addmm|baddbmm|_scaled_mm|matmul|_addmm_activation|convolution|_convolution)$"
)
_ROW_WISE = {"norm", "softmax", "elementwise", "reduction", "cross-entropy", "embedding"}
_BACKWARD_PREFIX = "autograd::engine::evaluate_function: "
_ATTENTION_PERF = data_path("attention_perf.yaml")


@dataclass
class _Group:
    key: tuple
    kind: str
    level: str
    variant: str | None = None
    name: str = ""
    ops: list[str] = field(default_factory=list)
    segments: list[tuple[int, Segment]] = field(default_factory=list)  # (step, segment)
    kernel_index: list[int] = field(default_factory=list)
    library: bool = False
    attrs: dict[str, Any] = field(default_factory=dict)


def triage(
    timeline: Timeline,
    gpu: GPUSpec,
    rules: Rules,
    counters: Counters | None = None,
    *,
    step_marker: str | None = None,
    source: dict[str, Any] | None = None,
    hot_kernels: list[str] | None = None,
) -> Report:
    """Analyse one timeline (one process/rank) and return the ranked report.

    ``hot_kernels``: base names the ncu phase targeted; the join then also says how much of
    their time has counters.
    """
    require_gpu_activity(timeline)
    attr = attribute(timeline, step_marker)
    kernels = attr.kernels
    in_step = kernels[kernels["step"] >= 0]
    if in_step.empty:
        raise TraceFormatError(
            "no GPU kernel was launched inside the active steps "
            f"({len(attr.steps)} step(s) found from {attr.step_source})",
            path=timeline.source,
        )
    warnings = list(timeline.warnings) + list(attr.warnings)
    join: JoinResult | None = None
    if counters is not None:
        join = join_counters(kernels, counters, rules.threshold("join_max_duration_ratio"), hot_kernels)
        warnings += counters.warnings + join.warnings
        if join.time_joined_share < rules.threshold("join_warn"):
            warnings.append(
                f"counters cover {join.time_joined_share:.0%} of kernel time; the rest is placed on "
                "the roofline from shape estimates"
            )
    n_steps = len(attr.steps)
    step_ms = float(np.mean(step_walls(attr))) / 1e6
    busy_ns, gaps = idle_gaps(attr, timeline, rules.threshold("gap_us") * 1000)
    busy_ms = busy_ns / n_steps / 1e6
    comm_ns, exposed_ns = communication_overlap(attr, lambda n: rules.classify(None, n) == "communication")
    idle_pct = max(0.0, 100.0 * (1.0 - busy_ms / step_ms)) if step_ms else 0.0

    groups = _group(timeline, attr, rules)
    candidates = [
        _candidate(g, timeline, attr, join, counters, gpu, rules, n_steps, step_ms, busy_ms)
        for g in groups.values()
    ]
    _decide(candidates, rules, gpu)
    candidates.sort(key=lambda c: (c.verdict != "skip", c.expected_saving_share, c.time_share), reverse=True)
    for i, c in enumerate(candidates, 1):
        c.rank = i
    unattributed = in_step[(in_step["op"] < 0) & in_step["module"].isna() & in_step["region"].isna()]
    unattributed_ms = float(unattributed["dur"].sum()) / n_steps / 1e6
    breakdown: dict[str, float] = defaultdict(float)
    for c in candidates:
        breakdown[c.kind] += c.time_ms_per_step
    breakdown["idle"] = max(0.0, step_ms - busy_ms)
    return Report(
        gpu=gpu.to_json(),
        source=dict(source or {"trace": timeline.source}),
        steps=n_steps,
        step_source=attr.step_source,
        step_time_ms=step_ms,
        gpu_busy_ms=busy_ms,
        gpu_busy_pct=100.0 * busy_ms / step_ms if step_ms else 0.0,
        idle_pct=idle_pct,
        gaps=gaps,
        join=join.to_json() if join else None,
        unattributed_ms_per_step=unattributed_ms,
        unattributed_share=unattributed_ms / busy_ms if busy_ms else 0.0,
        kind_breakdown=dict(sorted(breakdown.items(), key=lambda kv: -kv[1])),
        communication_ms_per_step=comm_ns / n_steps / 1e6,
        exposed_communication_ms_per_step=exposed_ns / n_steps / 1e6,
        rank=timeline.rank,
        candidates=candidates,
        thresholds=dict(rules.thresholds),
        warnings=warnings,
    )


def step_walls(attr: Attribution) -> list[int]:
    """Wall time of each step (ns): the longer of its CPU range and its GPU period.

    With an asynchronous GPU the CPU range says little: a script that never synchronizes
    launches steps ahead of the GPU (its ranges are short), and one that synchronizes spends
    its range waiting for the previous step. The GPU period runs from the step's first kernel
    to the next step's first kernel (the last step: to its last kernel's end).
    """
    k = attr.kernels[attr.kernels["step"] >= 0]
    first = k.groupby("step")["start"].min().to_dict()
    last = (k["start"] + k["dur"]).groupby(k["step"]).max().to_dict()
    walls = []
    for i, s in enumerate(attr.steps):
        if s.index not in first:
            walls.append(s.dur)
            continue
        nxt = attr.steps[i + 1].index if i + 1 < len(attr.steps) else None
        end = first.get(nxt) if nxt is not None and nxt in first else last[s.index]
        walls.append(max(s.dur, int(end - first[s.index])))
    return walls


def require_gpu_activity(timeline: Timeline) -> None:
    if timeline.kernels.empty:
        raise TraceFormatError(
            "the trace holds no GPU kernels (a CPU-only run?); kerneltriage needs CUDA activity",
            path=timeline.source,
        )


# --- grouping -------------------------------------------------------------------------------


def _compute_types(timeline: Timeline, attr: Attribution, roots: set[int]) -> dict[int, str | None]:
    """The dtype a GEMM-like top-level op computes in: its innermost matmul's input type
    (under autocast ``aten::linear`` sees float inputs and casts them inside)."""
    cpu = timeline.cpu
    names = cpu["name"].astype(str).to_numpy()
    types = cpu["types"].to_numpy()
    out: dict[int, str | None] = {}
    for r in roots:
        found = None
        for c in attr.cpu_children_of_root.get(r, []):
            if _GEMM_LEAF.match(names[c]) and types[c] >= 0:
                t = timeline.arg(int(types[c]))
                if t:
                    found = t[0]
        out[r] = found
    return out


def _group(timeline: Timeline, attr: Attribution, rules: Rules) -> dict[tuple, _Group]:
    cpu = timeline.cpu
    names = cpu["name"].astype(str).to_numpy()
    starts = cpu["start"].to_numpy()
    dims_ix, types_ix, concrete_ix = (cpu[c].to_numpy() for c in ("dims", "types", "concrete"))

    def op_info(row: int, name: str, kind: str, compute_type: str | None = None) -> OpInfo:
        return OpInfo(
            row,
            name,
            kind,
            timeline.arg(int(dims_ix[row])),
            timeline.arg(int(types_ix[row])),
            timeline.arg(int(concrete_ix[row])),
            compute_type,
        )

    k = attr.kernels
    in_step = k[k["step"] >= 0]
    groups: dict[tuple, _Group] = {}
    row_group: dict[tuple[int, int], tuple] = {}  # (step, forward top-level op row) -> group key

    # Communication kernels are their own candidates, whatever op launched them: they are
    # never a Triton candidate, and folding them into that op would hide them.
    comm_names = {n for n in in_step["name"].unique() if rules.classify(None, n) == "communication"}
    comm = in_step["name"].isin(comm_names) & (in_step["kind"] == "kernel")
    fwd_mask = (in_step["fwd_root"] >= 0) & in_step["phase"].isin(["fwd", "bwd"]) & ~comm
    fwd = in_step[fwd_mask]
    first = fwd.groupby("fwd_root")[["name", "kind"]].first()
    first_kernel, first_activity = first["name"].to_dict(), first["kind"].to_dict()
    # An op whose GPU work is only copies and memsets is a memcpy, whatever its name says.
    copy_only = (~(fwd["kind"] == "kernel").groupby(fwd["fwd_root"]).any()).to_dict()

    compute_types = _compute_types(timeline, attr, set(fwd["fwd_root"].unique().tolist()))
    for step, frame in fwd.groupby("step"):
        rows = sorted(set(frame["fwd_root"].tolist()), key=lambda r: starts[r])
        ops = []
        for r in rows:
            # An op's class comes from the op; copies or memsets inside it are part of it.
            if copy_only.get(r):
                kind = "memcpy"
            else:
                kind = rules.classify_op(names[r]) or rules.classify(
                    None, first_kernel.get(r), first_activity.get(r, "kernel")
                )
            ops.append(op_info(r, names[r], kind, compute_types.get(r)))
        region_of = [attr.cpu_region[r] for r in rows]
        for seg in _segments_with_regions(ops, region_of, rules):
            key = _segment_key(seg)
            g = groups.get(key)
            if g is None:
                g = groups[key] = _new_group(key, seg, rules)
            g.segments.append((int(step), seg))
            for r in seg.rows:
                row_group[(int(step), r)] = key

    # Kernels of forward/backward work: their forward op's group (one lookup per kernel).
    for index, step, fr in zip(fwd.index, fwd["step"].tolist(), fwd["fwd_root"].tolist()):
        groups[row_group[(step, fr)]].kernel_index.append(index)

    # The rest: optimizer ops, backward ops with no forward op, annotated or bare kernels.
    seen_roots: set[tuple[int, int]] = set()
    rest = in_step[~fwd_mask]
    for index, step, phase, root, name, region, module, activity in zip(
        rest.index,
        rest["step"].tolist(),
        rest["phase"].tolist(),
        rest["root"].tolist(),
        rest["name"].tolist(),
        rest["region"].tolist(),
        rest["module"].tolist(),
        rest["kind"].tolist(),
    ):
        if name in comm_names and activity == "kernel":
            kind, label = "communication", base_name(name)
            key, level = ("kernel", kind, label), "kernel"
        elif root >= 0:
            label = names[root]
            if label.startswith(_BACKWARD_PREFIX):
                label = label[len(_BACKWARD_PREFIX) :]
            kind = rules.classify_op(label) or rules.classify(None, name, activity)
            key, level = ("op", kind, label, phase == "opt"), "op"
        elif region is not None or module is not None:
            # Kernels launched from Python inside a module or region (Triton kernels): one
            # candidate per place in the model, layers folded (blocks.0.attn → blocks.*.attn).
            label = region or _module_label([module])
            kind = rules.classify(None, name, activity)
            key, level = ("annotation", label, kind), "region"
        else:
            kind = rules.classify(None, name, activity)
            label = base_name(name)
            key, level = ("kernel", kind, label), "kernel"
        g = groups.get(key)
        if g is None:
            g = groups[key] = _Group(key, kind, level, name=label, ops=[label] if level == "op" else [])
            g.library = level == "op" and rules.is_library_op(label)
        if level == "op" and (step, root) not in seen_roots:
            # The op itself is the instance (optimizer ops, backward ops with no forward).
            seen_roots.add((step, root))
            g.segments.append((step, Segment("op", kind, None, [op_info(root, label, kind)])))
        g.kernel_index.append(index)
    return {key: g for key, g in groups.items() if g.kernel_index}


def _segments_with_regions(ops: list[OpInfo], region_of: list[str | None], rules: Rules) -> list[Segment]:
    """Ops inside one named region (kerneltriage.region or a user record_function) form one
    segment; the rest is segmented structurally."""
    out: list[Segment] = []
    i = 0
    while i < len(ops):
        name = region_of[i]
        if name is None:
            j = i
            while j < len(ops) and region_of[j] is None:
                j += 1
            out.extend(segment(ops[i:j], rules))
            i = j
            continue
        j = i
        while j < len(ops) and region_of[j] == name:
            j += 1
        inner = segment(ops[i:j], rules)
        if len(inner) == 1:
            inner[0].attrs["region"] = name
            out.extend(inner)
        else:
            kinds = [s.kind for s in inner]
            kind = (
                "attention"
                if "attention" in kinds
                else next(
                    (k for k in ("norm", "gemm", *rules.regions.get("kind_priority", [])) if k in kinds),
                    "other",
                )
            )
            out.append(Segment("region", kind, None, ops[i:j], {"region": name}, None))
        i = j
    return out


def _key_shape(seg: Segment) -> tuple:
    if seg.kind == "attention" and seg.level == "region":
        a = seg.attrs
        return (a.get("heads"), a.get("head_dim"), a.get("dtype"), a.get("mask"), a.get("softcap"))
    op = seg.ops[0]
    tensors = tensor_inputs(op.dims, op.types)
    if not tensors:
        return ()
    key = [("x", tensors[0][0][-1] if tensors[0][0] else None, tensors[0][1])]
    for d, t in tensors[1:]:
        key.append(("p", tuple(d), t) if len(d) <= 2 else ("x", d[-1] if d else None, t))
    return tuple(key)


def _segment_key(seg: Segment) -> tuple:
    if seg.level == "op":
        return ("op", seg.kind, seg.ops[0].name, _key_shape(seg))
    return ("region", seg.kind, seg.variant, seg.attrs.get("region"), seg.signature_ops, _key_shape(seg))


def _new_group(key: tuple, seg: Segment, rules: Rules) -> _Group:
    g = _Group(key, seg.kind, seg.level, seg.variant, ops=list(seg.signature_ops), attrs=dict(seg.attrs))
    g.library = seg.level == "op" and rules.is_library_op(seg.ops[0].name)
    g.name = _segment_name(seg)
    return g


def _segment_name(seg: Segment) -> str:
    if "region" in seg.attrs:
        return f"region '{seg.attrs['region']}'"
    if seg.level == "op":
        shapes = ", ".join(
            "x".join(map(str, d)) for d, _ in tensor_inputs(seg.ops[0].dims, seg.ops[0].types)[:3]
        )
        return f"{seg.ops[0].name}({shapes})" if shapes else seg.ops[0].name
    if seg.kind == "attention":
        a = seg.attrs
        mask = {"causal": "causal", "custom-mask": "masked", "none": "unmasked"}[a["mask"]]
        extra = ", softcap" if a.get("softcap") else ""
        return f"attention ({a['written']}, {mask}{extra}) " + "x".join(map(str, a["q"]))
    if seg.kind == "norm":
        label = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}
        base = (seg.variant or "").replace("fused_add_", "")
        prefix = "residual add + " if seg.variant and seg.variant.startswith("fused_add_") else ""
        x = tensor_inputs(seg.ops[0].dims, seg.ops[0].types)
        shape = "x".join(map(str, x[0][0])) if x else ""
        fused = next((op.name for op in seg.ops if op.kind == "norm"), None)
        how = f"via {fused}" if fused else f"eager, {len(seg.ops)} ops"
        return f"{prefix}{label.get(base, base)} ({how}) {shape}".rstrip()
    short = " → ".join(dict.fromkeys(op.name.replace("aten::", "") for op in seg.ops))
    x = tensor_inputs(seg.ops[0].dims, seg.ops[0].types)
    shape = " " + "x".join(map(str, x[0][0])) if x and x[0][0] else ""
    return f"{seg.kind} region [{short}]{shape}"


# --- numbers --------------------------------------------------------------------------------


def _candidate(
    g: _Group, timeline, attr, join, counters, gpu: GPUSpec, rules: Rules, n_steps, step_ms, busy_ms
) -> Candidate:
    k = attr.kernels.loc[g.kernel_index]
    total_ns = float(k["dur"].sum())
    per_step_ms = total_ns / n_steps / 1e6
    fwd_ms = float(k.loc[k["phase"] != "bwd", "dur"].sum()) / n_steps / 1e6
    bwd_ms = float(k.loc[k["phase"] == "bwd", "dur"].sum()) / n_steps / 1e6
    rows = join.row.loc[k.index] if join is not None else pd.Series(-1, index=k.index)
    kernels_info = _kernel_info(k, rows, n_steps)
    module = _module_label(k["module"].dropna().tolist())
    roof = _roofline(g, k, rows, counters, gpu, n_steps)
    headroom = (total_ns / n_steps / 1e6) / roof.ceiling_ms if roof.ceiling_ms else None
    shapes = _shapes(g, timeline, attr, k)
    instances = len(g.segments) / n_steps if g.segments else float(len(k)) / n_steps
    name = g.name
    if module and g.level != "kernel":
        name = f"{name} in {module}"
    return Candidate(
        id="",
        name=name,
        kind=g.kind,
        level=g.level,
        variant=g.variant,
        time_ms_per_step=per_step_ms,
        time_share=per_step_ms / step_ms if step_ms else 0.0,
        gpu_share=per_step_ms / busy_ms if busy_ms else 0.0,
        fwd_ms_per_step=fwd_ms,
        bwd_ms_per_step=bwd_ms,
        instances_per_step=instances,
        ops=g.ops,
        module=module,
        kernels=kernels_info,
        roofline=roof,
        headroom=headroom,
        shapes=shapes,
        conditions={},
        attrs=_json_attrs(g),
        builtin=None,
        example=_example(g),
    )


def _example(g: _Group) -> list[dict[str, Any]]:
    if not g.segments:
        return []
    _, seg = g.segments[0]
    return [
        {
            "name": op.name,
            "dims": op.dims,
            "types": op.types,
            "concrete": op.concrete,
            "compute_type": op.compute_type,
        }
        for op in seg.ops
    ]


def _json_attrs(g: _Group) -> dict[str, Any]:
    attrs = dict(g.attrs)
    if g.library:
        attrs["library_op"] = True
    return attrs


def _module_label(modules: list[str]) -> str | None:
    """``blocks.0.attn:Attention``, ``blocks.1.attn:Attention`` → ``blocks.*.attn (Attention)``."""
    if not modules:
        return None
    counts = Counter(re.sub(r"\.\d+(?=\.|:|$)", ".*", m) for m in modules)
    label, _ = counts.most_common(1)[0]
    path, _, cls = label.partition(":")
    return f"{path} ({cls})" if cls else path


def _kernel_info(k: pd.DataFrame, rows: pd.Series, n_steps: int) -> list[KernelInfo]:
    frame = k.assign(_joined=(rows >= 0).to_numpy())
    out = []
    for (name, phase), g in frame.groupby(["name", "phase"], sort=False):
        out.append(
            KernelInfo(
                name=base_name(name),
                full_name=name,
                launches_per_step=len(g) / n_steps,
                time_ms_per_step=float(g["dur"].sum()) / n_steps / 1e6,
                phase=phase,
                joined=bool(g["_joined"].all()),
            )
        )
    out.sort(key=lambda x: -x.time_ms_per_step)
    return out


def _tensor_precision(g: _Group) -> str:
    dtype = g.attrs.get("dtype")
    if dtype is None:
        for _, seg in g.segments[:1]:
            op = seg.ops[0]
            dtype = op.compute_type or (tensor_inputs(op.dims, op.types) or [(None, None)])[0][1]
    return estimate.TENSOR_PRECISION.get(dtype or "", "bf16")


def _ceiling_ns(work: Work, gpu: GPUSpec) -> float:
    return max(work.bytes / gpu.bandwidth, work.flops / gpu.peak(work.precision)) * 1e9


def _estimate_total(g: _Group, k: pd.DataFrame) -> tuple[Work | None, float, float]:
    """Summed forward + backward work of the group's instances: (work, bytes, flops)."""
    bwd_steps_rows = set(
        zip(k.loc[k["phase"] == "bwd", "step"].tolist(), k.loc[k["phase"] == "bwd", "fwd_root"].tolist())
    )
    total_bytes = total_flops = 0.0
    precision = None
    for step, seg in g.segments:
        if seg.level == "region":
            fwd = seg.ideal
        else:
            op = seg.ops[0]
            fwd = estimate.op_work(seg.kind, op.name, op.dims, op.types, op.concrete, op.compute_type)
        if fwd is None:
            return None, 0.0, 0.0
        precision = fwd.precision
        works = [fwd]
        if any((step, r) in bwd_steps_rows for r in seg.rows):
            fl, by = estimate.bwd_factor(seg.kind)
            works.append(fwd.scaled(fl, by))
        for w in works:
            total_bytes += w.bytes
            total_flops += w.flops
    if precision is None:
        return None, 0.0, 0.0
    return Work(total_flops, total_bytes, precision), total_bytes, total_flops


def _roofline(
    g: _Group, k: pd.DataFrame, rows: pd.Series, counters: Counters | None, gpu: GPUSpec, n_steps: int
) -> Roofline:
    total_ns = float(k["dur"].sum())
    est, _, _ = _estimate_total(g, k) if g.segments else (None, 0.0, 0.0)
    est_ceiling = _ceiling_ns(est, gpu) if est else None

    joined = rows >= 0
    coverage = float(k.loc[joined.to_numpy(), "dur"].sum()) / total_ns if total_ns else 0.0
    cnt_bytes = cnt_flops = cnt_ceiling = None
    measured_bytes = None
    if counters is not None and joined.any():
        c = counters.rows.iloc[rows[joined].to_numpy()]
        by = c["dram_bytes"].to_numpy(dtype=float)
        parts = {
            "fp32": c["flops_fp32"].to_numpy(dtype=float),
            "fp64": c["flops_fp64"].to_numpy(dtype=float),
            "fp16": c["flops_fp16"].to_numpy(dtype=float),
        }
        # Tensor FLOPs run at the peak of the precision the counter saw (else the op's dtype).
        fallback = _tensor_precision(g)
        tensor = c["flops_tensor"].to_numpy(dtype=float)
        tensor_peak = np.array([gpu.peak(p or fallback) for p in c["tensor_precision"]], dtype=float)
        if np.isfinite(by).any():
            per_kernel = np.nan_to_num(by) / gpu.bandwidth
            flops_time = sum(np.nan_to_num(v) / gpu.peak(p) for p, v in parts.items())
            flops_time = flops_time + np.nan_to_num(tensor) / tensor_peak
            ceilings = np.maximum(per_kernel, flops_time)
            scale = 1.0 / coverage if coverage else 0.0  # unjoined kernels: same efficiency
            cnt_ceiling = float(ceilings.sum()) * 1e9 * scale
            cnt_bytes = float(np.nansum(by)) * scale
            cnt_flops = float(sum(np.nansum(v) for v in parts.values()) + np.nansum(tensor)) * scale
            measured_bytes = cnt_bytes / n_steps

    fused = g.level == "region" and est is not None
    if fused:
        # The fused ceiling: only external inputs, outputs and parameters cross HBM.
        ceiling, bytes_, flops, source = est_ceiling, est.bytes, est.flops, "fused estimate"
    elif cnt_ceiling is not None and coverage >= 0.5:
        ceiling = max(cnt_ceiling, est_ceiling or 0.0)
        bytes_ = cnt_bytes
        flops = max(cnt_flops or 0.0, est.flops if est else 0.0)
        source = "ncu+estimate" if est_ceiling and est_ceiling > cnt_ceiling else "ncu"
    elif est is not None:
        ceiling, bytes_, flops, source = est_ceiling, est.bytes, est.flops, "estimate"
    elif cnt_ceiling is not None:
        ceiling, bytes_, flops, source = cnt_ceiling, cnt_bytes, cnt_flops, "ncu"
    else:
        return Roofline(None, None, None, None, None, None, None, "none", None, measured_bytes, coverage)

    precision = est.precision if est else _tensor_precision(g)
    if flops and bytes_ and flops / bytes_ < 1.0:
        precision = precision if est else "fp32"
    time_s = total_ns / 1e9
    intensity = flops / bytes_ if bytes_ else None
    mem_time = bytes_ / gpu.bandwidth if bytes_ else 0.0
    compute_time = flops / gpu.peak(precision) if flops else 0.0
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
    )


def _shapes(g: _Group, timeline: Timeline, attr: Attribution, k: pd.DataFrame) -> Shapes:
    by_time: dict[tuple, float] = defaultdict(float)
    counts: Counter = Counter()
    fallback = False
    if g.segments:
        seg_time: dict[tuple[int, int], float] = defaultdict(float)
        launches: dict[tuple[int, int], list[tuple]] = defaultdict(list)
        config_columns = [
            k[c].tolist() for c in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
        ]
        for step, fr, root, dur, *cfg in zip(k["step"], k["fwd_root"], k["root"], k["dur"], *config_columns):
            anchor = int(fr) if fr >= 0 else int(root)
            seg_time[(int(step), anchor)] += float(dur)
            if cfg[0] >= 0:
                launches[(int(step), anchor)].append(tuple(int(c) for c in cfg))
        for step, seg in g.segments:
            sig = _signature(seg)
            if not sig:
                # No recorded shapes (Nsight Systems without emit_nvtx shapes): judge stability
                # from the launch configurations instead.
                fallback = True
                configs = sorted(c for r in seg.rows for c in launches.get((step, r), []))
                sig = tuple((f"k{j}.grid+block", c) for j, c in enumerate(configs))
            t = sum(seg_time.get((step, r), 0.0) for r in seg.rows)
            by_time[sig] += t
            counts[sig] += 1
    else:
        for (gx, gy, gz, bx, by, bz), frame in k.groupby(
            ["grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"]
        ):
            sig = (("grid", (gx, gy, gz)), ("block", (bx, by, bz)))
            by_time[sig] += float(frame["dur"].sum())
            counts[sig] += len(frame)
    total = sum(by_time.values()) or 1.0
    ordered = sorted(by_time, key=lambda s: -by_time[s])
    varying = _varying(ordered)
    return Shapes(
        distinct=len(ordered),
        dominant_coverage=0.0,  # filled in _decide, which knows max_shapes
        varying_dims=varying,
        signatures=[
            {"shape": _sig_text(s), "share": by_time[s] / total, "count": counts[s]} for s in ordered[:12]
        ],
        row_wise_stable=g.kind in _ROW_WISE
        and bool(ordered)
        and not fallback
        and not any(v.endswith("[-1]") for v in varying),
        from_launch_config=fallback or not g.segments,
    )


def _signature(seg: Segment) -> tuple:
    if seg.kind == "attention" and seg.level == "region" and "q" in seg.attrs:
        a = seg.attrs
        return (("q", tuple(a["q"])), ("k", tuple(a["k"])), ("v", tuple(a["v"])))
    ops = seg.ops if seg.level == "op" else seg.ops[:1]
    out = []
    for op in ops:
        for i, (d, _t) in enumerate(tensor_inputs(op.dims, op.types)):
            out.append((f"arg{i}", tuple(d)))
    return tuple(out)


def _varying(signatures: list[tuple]) -> list[str]:
    if len(signatures) < 2:
        return []
    varying = []
    names = [n for n, _ in signatures[0]]
    for pos, name in enumerate(names):
        dims = [s[pos][1] for s in signatures if len(s) > pos]
        if len({len(d) for d in dims}) > 1:
            varying.append(f"{name}.rank")
            continue
        for j in range(len(dims[0])):
            if len({d[j] for d in dims}) > 1:
                varying.append(f"{name}[{j - len(dims[0])}]" if j == len(dims[0]) - 1 else f"{name}[{j}]")
    return varying


def _sig_text(sig: tuple) -> str:
    return " ".join(f"{n}={'x'.join(map(str, d))}" for n, d in sig)


# --- conditions and verdicts ----------------------------------------------------------------


def _decide(candidates: list[Candidate], rules: Rules, gpu: GPUSpec) -> None:
    t = rules.thresholds
    by_time = sorted(candidates, key=lambda c: -c.time_share)
    top_n = max(1, math.ceil(t["top_fraction"] * len(candidates)))
    top = {id(c) for c in by_time[:top_n]}
    for i, c in enumerate(by_time, 1):
        c.id = f"C{i}"
    max_shapes = int(t["max_shapes"])
    for c in candidates:
        shares = [s["share"] for s in c.shapes.signatures]
        c.shapes.dominant_coverage = float(sum(shares[:max_shapes])) if shares else 0.0
        h = c.headroom
        c.conditions["headroom"] = Condition(
            value=h,
            threshold=t["min_headroom"],
            passed=None if h is None else h >= t["min_headroom"],
            detail=_headroom_detail(c),
        )
        hot = c.time_share >= t["min_share"] or (id(c) in top and c.time_share >= t["min_share_floor"])
        c.conditions["hotness"] = Condition(
            value=c.time_share,
            threshold=t["min_share"],
            passed=hot,
            detail=f"{c.time_share:.1%} of step time ({c.gpu_share:.1%} of GPU-busy time)"
            + (f"; among the hottest {t['top_fraction']:.0%}" if id(c) in top else ""),
        )
        stable = (
            c.shapes.distinct <= max_shapes
            or c.shapes.dominant_coverage >= t["min_dominant_coverage"]
            or c.shapes.row_wise_stable
        )
        detail = (
            f"{c.shapes.distinct} shape signature(s); top {max_shapes} cover {c.shapes.dominant_coverage:.0%}"
        )
        if c.shapes.varying_dims:
            detail += f"; varying: {', '.join(c.shapes.varying_dims[:6])}"
            if c.shapes.row_wise_stable:
                detail += " (row-wise op, last dim fixed: stable)"
        c.conditions["stability"] = Condition(
            value=float(c.shapes.distinct), threshold=float(max_shapes), passed=stable, detail=detail
        )
        c.expected_saving_share = c.time_share * (1.0 - 1.0 / h) if h and h > 1.0 else 0.0
        _verdict(c, rules, gpu)


def _headroom_detail(c: Candidate) -> str:
    r = c.roofline
    if c.headroom is None:
        return "no counters and no shape model for this op: headroom unknown"
    what = (
        "fused ceiling (external inputs/outputs only)"
        if r.source == "fused estimate"
        else f"{r.bound}-bound ceiling"
    )
    return f"{c.time_ms_per_step:.3g} ms measured vs {r.ceiling_ms:.3g} ms {what} [{r.source}]"


def _verdict(c: Candidate, rules: Rules, gpu: GPUSpec) -> None:
    rec = rules.recommendation(c.kind, c.variant)
    c.note = str(rec.get("note", ""))
    cond = c.conditions
    if rec["verdict"] == "skip":
        c.verdict, c.reason = "skip", str(rec["reason"])
        return
    if not cond["hotness"].passed:
        c.verdict, c.reason = "skip", "cold"
        return
    if cond["headroom"].passed is None:
        c.verdict, c.reason = "skip", "no-ceiling"
        c.note = "run with Nsight Compute counters (kerneltriage profile) to place it on the roofline"
        return
    if not cond["headroom"].passed:
        library = c.attrs.get("library_op") or _already_uses(c, rec)
        c.verdict, c.reason = "skip", "library-at-roof" if library else "at-roof"
        return
    if not cond["stability"].passed:
        c.verdict, c.reason = "skip", "unstable-shapes"
        return
    c.verdict = str(rec["verdict"])
    c.builtin = rec.get("builtin")
    if c.kind == "attention":
        c.builtin, c.reason = _attention_choice(c, rec, gpu)
    else:
        c.reason = "all three conditions hold"
    used = _already_uses(c, rec)
    if used:
        # It already runs the fused kernel the rules would recommend: nothing to swap in.
        c.verdict, c.builtin = "write", None
        c.reason = f"all three conditions hold, and it already uses {used}: that kernel runs well below its ceiling here"


def _already_uses(c: Candidate, rec: dict[str, Any]) -> str | None:
    """The op of ``c`` that is already the fused kernel ``rec`` would recommend, if any."""
    for pattern in rec.get("already") or []:
        for op in c.ops:
            if re.search(pattern, op):
                return op
    return None


def _attention_choice(c: Candidate, rec: dict[str, Any], gpu: GPUSpec) -> tuple[str | None, str]:
    """SDPA or the built-in flash attention: variants SDPA cannot fuse get the built-in; plain
    attention gets whichever the shipped benchmark table measured faster on this GPU."""
    library, ours = rec.get("builtin"), rec.get("variant_builtin")
    if c.attrs.get("softcap") or c.attrs.get("mask") == "custom-mask":
        return ours, "all three conditions hold; a variant SDPA cannot run fused"
    perf = _attention_perf(gpu.name, c.attrs.get("head_dim"), c.attrs.get("mask") == "causal")
    if perf is None:
        return (
            library,
            f"all three conditions hold; no benchmark of the built-in on {gpu.name}: the library op",
        )
    sdpa, built = perf
    if built > sdpa:
        return (
            ours,
            f"all three conditions hold; built-in measured faster than SDPA here ({built:.0f} vs {sdpa:.0f} TFLOP/s)",
        )
    return (
        library,
        f"all three conditions hold; SDPA measured faster than the built-in here ({sdpa:.0f} vs {built:.0f} TFLOP/s)",
    )


def _attention_perf(gpu_name: str, head_dim: int | None, causal: bool) -> tuple[float, float] | None:
    """(SDPA, built-in) fwd+bwd TFLOP/s from the shipped table, or None."""
    if not _ATTENTION_PERF.is_file() or head_dim is None:
        return None
    try:
        table = yaml.safe_load(_ATTENTION_PERF.read_text()) or {}
    except yaml.YAMLError:
        return None
    return attention_perf_lookup(table, gpu_name, int(head_dim), causal)


def attention_perf_lookup(
    table: dict, gpu_name: str, head_dim: int, causal: bool
) -> tuple[float, float] | None:
    for gpu_key, entries in (table.get("gpus") or {}).items():
        if gpu_key.lower() not in gpu_name.lower() and gpu_name.lower() not in gpu_key.lower():
            continue
        for e in entries or []:
            if (
                int(e.get("head_dim", -1)) == head_dim
                and bool(e.get("causal")) == causal
                and e.get("variant", "plain") == "plain"
            ):
                try:
                    return float(e["sdpa_tflops"]), float(e["builtin_tflops"])
                except (KeyError, TypeError, ValueError):
                    return None
    return None
