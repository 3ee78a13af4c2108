"""Finish phase 1's trace in the parent process, after the script has ended.

The timed steps were recorded without input shapes, to keep the profiler's host time out of
the step time; one earlier step ran under a CPU-only profiler that recorded them
(``step_plan.StepPlan``). Here the shapes (``Input Dims``, ``Input type``, ``Input Strides``,
``Concrete Inputs``) are copied onto the timed trace's ops: per thread, each recorded step's op
sequence is aligned with the shapes step's by op name (a training step repeats the same ops),
and every aligned op gets its counterpart's shapes. Ops that align with nothing keep none, and
the counts say how many did.

Module ranges are entered through ``_RecordFunctionFast`` (one C++ call, against ~10 µs for
``record_function``), which the profiler files as ``cpu_op``; they are relabelled
``user_annotation``, the category ``record_function`` ranges have, so the report reads them
as annotations, not ops.
"""

from __future__ import annotations

import bisect
import gzip
import os
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from kerneltriage.analysis.timeline.attribution import PROFILER_STEP
from kerneltriage.analysis.timeline.idle import union
from kerneltriage.annotate import MODULE_PREFIX
from kerneltriage.ingest.kineto import GPU_KINDS

SHAPE_ARGS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")
#: How far ahead the alignment looks for the next common op when two sequences differ.
_LOOKAHEAD = 48


def finish_trace(trace: Path, shapes: Path | None) -> dict[str, Any]:
    """Relabel module ranges and copy shapes from ``shapes`` (a trace of one step) onto
    ``trace``'s recorded steps; rewrite ``trace`` in place. Returns counts for the manifest."""
    data = _load(trace)
    events = data.get("traceEvents") or []
    stats: dict[str, Any] = {"module_ranges": relabel_module_ranges(events)}
    if shapes is not None:
        source = _load(shapes).get("traceEvents") or []
        stats.update(copy_shapes(events, source))
        data["record_shapes"] = 1
    if stats["module_ranges"] or shapes is not None:
        _write(trace, data)
    return stats


def relabel_module_ranges(events: list[dict[str, Any]]) -> int:
    n = 0
    for e in events:
        if e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith(MODULE_PREFIX):
            e["cat"] = "user_annotation"
            n += 1
    return n


def _ops_by_thread(events: list[dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
    out: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op":
            out.setdefault(e.get("tid"), []).append(e)
    for ops in out.values():
        # Parents first: by start, the longer of two events that start together first.
        ops.sort(key=lambda e: (float(e.get("ts", 0.0)), -float(e.get("dur", 0.0))))
    return out


def copy_shapes(timed: list[dict[str, Any]], source: list[dict[str, Any]]) -> dict[str, Any]:
    """Copy the shape arguments of ``source``'s ops onto the ops of each recorded step of
    ``timed`` (in place). ``source`` holds one step.

    Steps are the host's ``ProfilerStep#N`` ranges (the GPU's copies of them, category
    ``gpu_user_annotation``, overlap the next step and would count its ops twice). Ops whose
    name never carries shapes (``autograd::engine::evaluate_function: …`` wrappers, module and
    step ranges) are counted apart: ``ops`` counts those that can."""
    windows = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
        for e in timed
        if e.get("ph") == "X"
        and e.get("cat") != "gpu_user_annotation"
        and PROFILER_STEP.match(str(e.get("name", "")))
        and "ts" in e
    )
    src = _ops_by_thread(source)
    src_names = {tid: [str(e.get("name")) for e in ops] for tid, ops in src.items()}
    shaped = {
        str(e.get("name")) for ops in src.values() for e in ops if (e.get("args") or {}).get("Input Dims")
    }
    total = matched = unshaped = 0
    missing: dict[str, int] = {}
    for tid, ops in _ops_by_thread(timed).items():
        starts = [float(e.get("ts", 0.0)) for e in ops]
        ref = src.get(tid)
        for start, end in windows:
            lo, hi = bisect.bisect_left(starts, start), bisect.bisect_left(starts, end)
            segment = ops[lo:hi]
            if ref and segment:
                for i, j in align(src_names[tid], [str(e.get("name")) for e in segment]):
                    args = ref[i].get("args") or {}
                    shapes = {k: args[k] for k in SHAPE_ARGS if k in args}
                    if shapes:
                        segment[j].setdefault("args", {}).update(shapes)
            for e in segment:
                name = str(e.get("name"))
                if name not in shaped and "Input Dims" not in (e.get("args") or {}):
                    unshaped += 1
                    continue
                total += 1
                if "Input Dims" in (e.get("args") or {}):
                    matched += 1
                else:
                    missing[name] = missing.get(name, 0) + 1
    return {
        "steps": len(windows),
        "ops": total,
        "ops_with_shapes": matched,
        "ops_without_shape_args": unshaped,
        "missing": dict(sorted(missing.items(), key=lambda kv: -kv[1])[:10]),
    }


def align(a: list[str], b: list[str], lookahead: int = _LOOKAHEAD) -> list[tuple[int, int]]:
    """Pairs (i, j) with ``a[i] == b[j]``, in order: equal runs pair up; where the sequences
    differ, the next common name within ``lookahead`` (nearest first) resumes the pairing."""
    if a == b:
        return list(zip(range(len(a)), range(len(b))))
    pairs: list[tuple[int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            pairs.append((i, j))
            i += 1
            j += 1
            continue
        step = _resync(a, b, i, j, lookahead)
        if step is None:
            i += 1
            j += 1
        else:
            i, j = i + step[0], j + step[1]
    return pairs


def _resync(a: list[str], b: list[str], i: int, j: int, lookahead: int) -> tuple[int, int] | None:
    for k in range(1, lookahead):
        for di in range(k + 1):
            dj = k - di
            if i + di < len(a) and j + dj < len(b) and a[i + di] == b[j + dj]:
                return di, dj
    return None


def summarize_clean(path: Path, steps: int) -> dict[str, Any]:
    """The clean steps' trace (CUDA activity only, ``steps`` steps): the GPU's busy share of
    the window from its first activity's start to its last one's end, and kernels per step.

    The trace has no step boundaries (they are CPU events), so the share is taken over the
    whole window: work of the step before it that still runs at its start, or launched in its
    last step after it closed, moves the share only at the window's edges.
    """
    events = _load(path).get("traceEvents") or []
    by_device: dict[Any, list[tuple[float, float]]] = {}
    kernels: dict[Any, int] = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in GPU_KINDS or "ts" not in e:
            continue
        start = float(e["ts"])
        by_device.setdefault(e.get("pid"), []).append((start, start + float(e.get("dur", 0.0))))
        if e.get("cat") == "kernel":
            kernels[e.get("pid")] = kernels.get(e.get("pid"), 0) + 1
    if not by_device:
        raise ValueError("no GPU activity in the clean steps' trace")
    device = max(by_device, key=lambda d: len(by_device[d]))
    spans = union(*np.array(by_device[device], dtype=float).T)
    busy = sum(end - start for start, end in spans)
    window = spans[-1][1] - spans[0][0]
    return {
        "gpu_busy_share": round(busy / window, 4) if window > 0 else None,
        "window_ms": round(window / 1000.0, 4),
        "kernels_per_step": round(kernels.get(device, 0) / max(1, steps), 1),
    }


def _load(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    data = orjson.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a chrome trace object")
    return data


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    blob = orjson.dumps(data)
    with open(tmp, "wb") as f:
        f.write(gzip.compress(blob, compresslevel=6) if path.name.endswith(".gz") else blob)
    os.replace(tmp, path)  # a reader never sees half a trace
