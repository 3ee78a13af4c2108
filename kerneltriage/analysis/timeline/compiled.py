"""torch.compile in a trace: Inductor's kernels, their work, and the compiled graphs.

- ``decode_inductor``: ``triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_3`` → (``per``,
  ``[_to_copy, add, mean, mul, pow, rsqrt]``). Inductor names a kernel after the ATen ops it
  fuses, sorted by name and joined by ``_``; op names hold ``_`` too, so the split uses a
  vocabulary of multi-word op names (``regions.inductor_op_names`` in the rules).
- ``inductor_work``: a kernel's bytes and FLOPs from its launch record. Inductor wraps every
  launch in a profiler range named after the kernel whose inputs are the kernel's arguments:
  its input and output buffers, i.e. the fused ops' external inputs and outputs. Each buffer
  crosses HBM once; broadcast dims (stride 0) are not counted; a pointwise kernel with too
  few buffers for its inputs and an output reads and writes one in place (counted twice).
- ``compiled_graphs``: the compiled regions of the steps (``Torch-Compiled Region: F/C``,
  ``CompiledFunction``/``Backward``), their graph breaks and recompiles, and the launch-bound
  ones: many small kernels with the GPU idle between them (CUDA graphs remove those gaps).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

import numpy as np

from kerneltriage.analysis.candidates.estimate import TENSOR_PRECISION, Work, dtype_bytes
from kerneltriage.analysis.rules import Rules
from kerneltriage.analysis.timeline.attribution import Attribution
from kerneltriage.ingest.kernel_names import base_name
from kerneltriage.ingest.tables import Timeline

_INDUCTOR = re.compile(r"^triton_(poi|red|per|tem|for)_fused_(.+?)(?:_\d+)?$")
FLAVOURS = {
    "poi": "pointwise",
    "red": "reduction",
    "per": "persistent reduction",
    "tem": "template",
    "for": "foreach",
}
# Ops that move or reinterpret data only: no arithmetic per element.
_LAYOUT_OPS = {
    "view",
    "_unsafe_view",
    "_to_copy",
    "clone",
    "copy",
    "permute",
    "expand",
    "t",
    "transpose",
    "select",
    "slice",
    "squeeze",
    "unsqueeze",
    "cat",
    "stack",
    "split",
    "alias",
    "reshape",
    "as_strided",
    "full",
    "zeros",
    "ones",
    "empty",
    "new_zeros",
    "new_ones",
    "zeros_like",
    "ones_like",
    "full_like",
    "scalar_tensor",
    "lift_fresh",
    "detach",
}
_GATHER_OPS = {"embedding", "index", "index_select", "gather"}
_BINARY_OPS = {
    "add",
    "sub",
    "mul",
    "div",
    "rsub",
    "where",
    "maximum",
    "minimum",
    "atan2",
    "fmod",
    "remainder",
}
_REGION = re.compile(r"^Torch-Compiled Region: (\d+)/(\d+)")
_FX_CALL = re.compile(r"^## Call CompiledFxGraph \w+ ##$")


def decode_inductor(name: str, vocabulary: list[str] | tuple[str, ...] = ()) -> tuple[str, list[str]] | None:
    """(flavour key, fused ATen op names) of an Inductor kernel name, or None."""
    m = _INDUCTOR.match(base_name(name))
    if not m:
        return None
    tokens = m[2].split("_")
    vocab = set(vocabulary)
    longest = max((v.count("_") + 1 for v in vocab), default=1)
    ops: list[str] = []
    i = 0
    while i < len(tokens):
        lead = ""
        while i < len(tokens) and tokens[i] == "":  # an op whose name starts with "_"
            lead += "_"
            i += 1
        if i >= len(tokens):
            break
        taken = 1
        for n in range(min(longest, len(tokens) - i), 1, -1):
            if "" in tokens[i : i + n]:
                continue
            if lead + "_".join(tokens[i : i + n]) in vocab:
                taken = n
                break
        ops.append(lead + "_".join(tokens[i : i + taken]))
        i += taken
    return m[1], ops


def compute_ops(ops: list[str]) -> list[str]:
    """The fused ops that do arithmetic (views, copies and casts left out)."""
    return [op for op in ops if op not in _LAYOUT_OPS]


def inductor_work(
    name: str, dims: Any, types: Any, strides: Any, vocabulary: list[str] | tuple[str, ...] = ()
) -> tuple[Work | None, str]:
    """(work of one launch, why not) from the kernel's launch record (its arguments)."""
    decoded = decode_inductor(name, vocabulary)
    if decoded is None:
        return None, "not an Inductor kernel name (triton_{poi,red,per,tem}_fused_…)"
    flavour, ops = decoded
    if not isinstance(dims, list) or not isinstance(types, list):
        return None, "the trace records no arguments for its launch (no record_shapes)"
    strides = strides if isinstance(strides, list) else [None] * len(dims)
    tensors: list[tuple[list[int], str, int]] = []
    for d, t, s in zip(dims, types, list(strides) + [None] * (len(dims) - len(strides))):
        if not isinstance(d, list) or not d or t in ("Scalar", "ScalarList", "", None, "TensorList"):
            continue
        try:
            dd = [int(x) for x in d]
        except (TypeError, ValueError):
            continue
        if isinstance(s, list) and len(s) == len(dd):
            # A broadcast (expanded) argument holds only its non-stride-0 elements.
            elements = math.prod(x for x, st in zip(dd, s) if st != 0)
        else:
            elements = math.prod(dd)
        tensors.append((dd, str(t), elements))
    if not tensors:
        return None, "its launch record holds no tensor arguments"
    if any(op in _GATHER_OPS for op in ops) and len(tensors) >= 2:
        # A gather reads only the rows it indexes, not its whole table (the largest argument):
        # count the table as large as the next largest argument (the rows it writes out).
        by_size = sorted(range(len(tensors)), key=lambda i: -tensors[i][2])
        table, rest = by_size[0], tensors[by_size[1]][2]
        if len(tensors[table][0]) == 2:
            d, t, _ = tensors[table]
            tensors[table] = (d, t, rest)
    nbytes = float(sum(e * dtype_bytes(t) for _, t, e in tensors))
    largest = max(e for _, _, e in tensors)
    big = [(t, e) for _, t, e in tensors if e == largest]
    binary = any(op in _BINARY_OPS for op in ops)
    if flavour == "poi" and (len(tensors) == 1 or (len(tensors) == 2 and len(big) == 2 and binary)):
        # Too few buffers for its inputs and an output: Inductor reuses one in place
        # (in_out_ptr0, typically the GEMM output an epilogue overwrites), read and written.
        nbytes += largest * dtype_bytes(big[0][0])
    if flavour == "tem":
        # A GEMM template: A (…, M, K) and B (…, K, N) are its first two arguments.
        if len(tensors) >= 2 and len(tensors[0][0]) >= 2 and len(tensors[1][0]) >= 2:
            a, b = tensors[0][0], tensors[1][0]
            if a[-1] == b[-2]:
                batch = max(math.prod(a[:-2]), math.prod(b[:-2]))
                flops = 2.0 * batch * a[-2] * a[-1] * b[-1]
                return Work(flops, nbytes, TENSOR_PRECISION.get(tensors[0][1], "fp32")), ""
        return None, "a template kernel whose GEMM dims the launch record does not show"
    # Triton computes pointwise and reduction math in fp32 registers: one FLOP per computing
    # op and element of the largest argument (memory-bound whatever the exact count).
    flops = float(max(1, len(compute_ops(ops))) * largest)
    return Work(flops, nbytes, "fp32"), ""


def _graph_label(name: str) -> str:
    if _FX_CALL.match(name):
        return "CompiledFxGraph"
    return name.replace("autograd::engine::evaluate_function: ", "")


def compiled_graphs(
    timeline: Timeline,
    attr: Attribution,
    rules: Rules,
    n_steps: int,
    step_ms: float,
    *,
    idle_scale: float = 1.0,
) -> dict[str, Any] | None:
    """The compiled regions of the recorded steps, or None when nothing is compiled.

    Counts per step: compiled regions (Dynamo frames ``F/C``: frame F's C-th compilation),
    AOT graphs (``CompiledFunction``) and their backward, Dynamo cache lookups. A frame with
    C > 0 was recompiled; several frames called from one parent (a module's forward) are
    graph breaks (or functions compiled on their own). Each graph's kernels, GPU time and the
    GPU's idle time between its first and last kernel say whether it is launch-bound.
    """
    cpu = timeline.cpu
    if cpu.empty or not attr.steps:
        return None
    names = attr.cpu_names
    starts = cpu["start"].to_numpy()
    found = _compiled_records(starts, attr, rules)
    if found is None:
        return None
    rows, launch_rows = found
    k_all = attr.kernels
    launched = set(k_all.loc[k_all["step"] >= 0, "op"].tolist())
    counts, frames, region_rows, recompiles = _count_records(rows, names, attr)
    k = attr.kernels
    k = k[k["step"] >= 0]
    graph_rows = region_rows or [r for r in rows if names[r] == "CompiledFunction"]
    breaks, where = _graph_breaks(graph_rows, names, starts, attr, set(k["root"].tolist()), n_steps)
    graphs = _graph_time(timeline, attr, rules, names, k, n_steps, step_ms, idle_scale)
    out: dict[str, Any] = {
        "regions_per_step": counts["regions"] / n_steps,
        "frames": sorted(frames),
        "compiled_functions_per_step": counts["compiled_functions"] / n_steps,
        "compiled_backward_per_step": counts["compiled_backward"] / n_steps,
        "cache_lookups_per_step": counts["cache_lookups"] / n_steps,
        "fx_graph_calls_per_step": counts["fx_graphs"] / n_steps,
        "inductor_launch_records_per_step": len(launch_rows) / n_steps,
        "inductor_launch_records_without_kernel_per_step": sum(
            1 for r in launch_rows.tolist() if r not in launched
        )
        / n_steps,
        "graph_breaks_per_step": breaks / n_steps,
        "graph_breaks": sorted(where.values(), key=lambda e: e["where"]),
        "recompiles": recompiles,
        "graphs": graphs,
        "launch_bound": [g for g in graphs if g.get("launch_bound")],
    }
    return out


def _compiled_records(
    starts: np.ndarray, attr: Attribution, rules: Rules
) -> tuple[list[int], np.ndarray] | None:
    """Rows of the steps' compiled-graph records (Dynamo regions, AOT graphs, cache lookups)
    and of Inductor's launch records; None when the trace has neither."""
    lo = min(s.start for s in attr.steps)
    hi = max(s.end for s in attr.steps)
    compiled = attr.cpu_name_mask(lambda n: rules.match(n, "compiled_ops") or n == "TorchDynamo Cache Lookup")
    # Inductor's launch records (a range named after each kernel it launches): with no GPU
    # kernel under them (captured into a CUDA graph, as vLLM does) they hold no GPU time.
    launch = attr.cpu_name_mask(_INDUCTOR.match)
    window = (starts >= lo) & (starts < hi)
    launch_rows = np.flatnonzero(launch & window) if launch.any() else np.array([], int)
    if not compiled.any() and not len(launch_rows):
        return None
    return np.flatnonzero(compiled & window).tolist(), launch_rows


def _count_records(
    rows: list[int], names: np.ndarray, attr: Attribution
) -> tuple[dict[str, int], dict[int, set[int]], list[int], list[dict[str, Any]]]:
    """Counts of each kind of compiled record, each Dynamo frame's compilations, the rows of
    the compiled regions, and the recompiled frames (with where they run)."""
    counts: dict[str, int] = defaultdict(int)
    frames: dict[int, set[int]] = defaultdict(set)
    region_rows: list[int] = []
    recompiled_at: dict[int, str] = {}  # frame -> where its recompiled region runs
    for r in rows:
        n = names[r]
        m = _REGION.match(n)
        if m:
            frames[int(m[1])].add(int(m[2]))
            region_rows.append(r)
            if int(m[2]) > 0:
                recompiled_at.setdefault(int(m[1]), _place(int(attr.cpu_parent[r]), names, attr))
            counts["regions"] += 1
        elif n == "TorchDynamo Cache Lookup":
            counts["cache_lookups"] += 1
        elif n == "CompiledFunction":
            counts["compiled_functions"] += 1
        elif n == "CompiledFunctionBackward":
            counts["compiled_backward"] += 1
        elif _FX_CALL.match(n):
            counts["fx_graphs"] += 1
    recompiles = [
        {"frame": f, "compilations": max(c) + 1, "where": recompiled_at.get(f, "?")}
        for f, c in sorted(frames.items())
        if max(c) > 0
    ]
    return counts, frames, region_rows, recompiles


def _graph_breaks(
    graph_rows: list[int],
    names: np.ndarray,
    starts: np.ndarray,
    attr: Attribution,
    gpu_roots: set[int],
    n_steps: int,
) -> tuple[int, dict[str, dict[str, Any]]]:
    """Graph breaks: several compiled regions under one parent (a module's forward, a step).
    Returns their count and, per place, how often and how many graphs a call."""
    parent = attr.cpu_parent
    by_parent: dict[int, list[int]] = defaultdict(list)
    for r in graph_rows:
        by_parent[int(parent[r])].append(r)
    breaks = 0
    where: dict[str, dict[str, Any]] = {}
    for p, children in by_parent.items():
        if len(children) < 2:
            continue
        # A frame that launches no GPU work is a wrapper or a resume stub, not a second graph:
        # only graphs with work count as broken apart (Dynamo's own count agrees on GPT-2).
        working = sum(1 for c in children if _launches_under(c, gpu_roots, attr))
        if working < 2:
            continue
        breaks += working - 1
        place = _place(p, names, attr)
        entry = where.setdefault(place, {"where": place, "graphs_per_call": 0, "calls": 0, "empty": 0})
        entry["calls"] += 1
        entry["graphs_per_call"] = max(entry["graphs_per_call"], len(children))
        # A graph with no GPU work under it: an empty frame (a wrapper, or a break's stub).
        entry["empty"] += sum(1 for c in children if not _launches_under(c, gpu_roots, attr))
        between = _between(sorted(children, key=lambda c: starts[c]), names, starts, parent, p)
        if between:
            entry["eager_ops_between"] = between
    for entry in where.values():
        entry["calls_per_step"] = entry.pop("calls") / n_steps
        entry["empty_per_call"] = entry.pop("empty") / max(1, entry["calls_per_step"] * n_steps)
    return breaks, where


def _place(row: int, names: np.ndarray, attr: Attribution) -> str:
    """Where a parent range is: its module (``GPT (GPT)``), else its own name."""
    if row < 0:
        return "top level"
    module = attr.cpu_module[row]
    if module:
        path, _, cls = str(module).partition(":")
        return f"{path} ({cls})" if cls else path
    return names[row].split("#")[0]


def _launches_under(row: int, gpu_roots: set[int], attr: Attribution) -> bool:
    root = int(attr.cpu_root[row])
    return root in gpu_roots if root >= 0 else False


def _between(children: list[int], names, starts, parent, p: int) -> list[str]:
    """Names of the ops that run between consecutive graphs under one parent (eager code at
    the break), not Dynamo's own cache lookups."""
    first, last = starts[children[0]], starts[children[-1]]
    sib = np.flatnonzero((parent == p) & (starts > first) & (starts < last)).tolist()
    skip = {"TorchDynamo Cache Lookup"}
    out = [names[s] for s in sib if names[s] not in skip and not _REGION.match(names[s])]
    return list(dict.fromkeys(out))[:8]


def _graph_time(
    timeline, attr, rules, names, k, n_steps: int, step_ms: float, idle_scale: float = 1.0
) -> list[dict[str, Any]]:
    """Per compiled graph (by its root op's name): kernels, GPU time, the GPU's idle time
    between its first and last kernel, and how much of that idle the host's work inside the
    graph caused (``idle.py``'s gap causes: ``host busy: <graph>``), i.e. launch overhead."""
    from kerneltriage.analysis.timeline.idle import idle_gaps

    roots = {int(r) for r in k["root"].unique() if r >= 0 and rules.match(names[int(r)], "compiled_ops")}
    if not roots:
        return []
    lb = rules.regions.compiled_launch_bound
    min_kernels, max_median_us = lb.min_kernels_per_step, lb.max_median_kernel_us
    min_idle, min_step_share = lb.min_idle_share, lb.min_step_share
    # Every gap's cause, not only the biggest few the report shows.
    _, gaps = idle_gaps(attr, timeline, rules.thresholds.gap_us * 1000, top=10_000)
    host_idle: dict[str, float] = defaultdict(float)
    for gap in gaps:
        if gap.cause.startswith("host busy: "):
            # Scaled as the report's own gaps are when the step time is the plain run's.
            host_idle[_graph_label(gap.cause[len("host busy: ") :])] += gap.ms_per_step * idle_scale
    # The GPU's busy intervals (any kernel, copy or memset): idle inside a graph's span is
    # what no activity covers.
    starts = k["start"].to_numpy(dtype=np.int64)
    order = np.argsort(starts)
    gs, ge = starts[order], (starts + k["dur"].to_numpy(dtype=np.int64))[order]
    merged_s: list[int] = []
    merged_e: list[int] = []
    for a, b in zip(gs.tolist(), ge.tolist()):
        if merged_e and a <= merged_e[-1]:
            merged_e[-1] = max(merged_e[-1], b)
        else:
            merged_s.append(a)
            merged_e.append(b)
    ms_, me_ = np.array(merged_s, dtype=np.int64), np.array(merged_e, dtype=np.int64)

    def busy_within(t0: int, t1: int) -> int:
        lo_i = int(np.searchsorted(me_, t0, side="right"))
        hi_i = int(np.searchsorted(ms_, t1, side="left"))
        if hi_i <= lo_i:
            return 0
        return int((np.minimum(me_[lo_i:hi_i], t1) - np.maximum(ms_[lo_i:hi_i], t0)).clip(min=0).sum())

    sub = k[k["root"].isin(roots) & (k["kind"] == "kernel")]
    acc: dict[str, dict[str, Any]] = {}
    for root, frame in sub.groupby("root"):
        label = _graph_label(names[int(root)])
        s = frame["start"].to_numpy(dtype=np.int64)
        t0, t1 = int(s.min()), int((s + frame["dur"].to_numpy(dtype=np.int64)).max())
        a = acc.setdefault(
            label, {"graph": label, "calls": 0, "kernels": 0, "gpu": 0, "span": 0, "idle": 0, "durs": []}
        )
        a["calls"] += 1
        a["kernels"] += len(frame)
        a["gpu"] += int(frame["dur"].sum())
        a["span"] += t1 - t0
        a["idle"] += (t1 - t0) - busy_within(t0, t1)
        a["durs"].extend(frame["dur"].tolist())
    out = []
    for a in acc.values():
        span_ms = a["span"] / n_steps / 1e6
        idle_ms = a["idle"] / n_steps / 1e6
        launch_idle = (
            min(host_idle.get(a["graph"], 0.0), idle_ms) if idle_ms else host_idle.get(a["graph"], 0.0)
        )
        median_us = float(np.median(a["durs"])) / 1e3 if a["durs"] else 0.0
        g = {
            "graph": a["graph"],
            "calls_per_step": a["calls"] / n_steps,
            "kernels_per_step": a["kernels"] / n_steps,
            "gpu_ms_per_step": a["gpu"] / n_steps / 1e6,
            "span_ms_per_step": span_ms,
            "idle_ms_per_step": idle_ms,
            "host_launch_idle_ms_per_step": launch_idle,
            "idle_share_of_span": launch_idle / span_ms if span_ms else 0.0,
            "median_kernel_us": median_us,
            "launch_bound": False,
        }
        g["launch_bound"] = bool(
            g["kernels_per_step"] >= min_kernels
            and median_us <= max_median_us
            and g["idle_share_of_span"] >= min_idle
            and step_ms
            and launch_idle / step_ms >= min_step_share
        )
        if g["launch_bound"]:
            # CUDA graphs replay the graph's launches at once: the idle time the host's
            # launches leave between its kernels is what they can save, at most.
            g["expected_saving_share"] = launch_idle / step_ms
        out.append(g)
    out.sort(key=lambda g: -g["gpu_ms_per_step"])
    return out
