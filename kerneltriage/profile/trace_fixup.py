"""Finish phase 1's trace in the parent process, after the script has ended.

The timed steps were recorded without input shapes, to keep the profiler's host time out of
the step time; one earlier step ran under a CPU-only profiler that recorded them
(``step_plan.StepPlan``). Here the shapes (``Input Dims``, ``Input type``, ``Input Strides``,
``Concrete Inputs``) are copied onto the timed trace's ops: per thread, each recorded step's op
sequence is aligned with the shapes step's (a training step repeats the same ops) by op name
and the module the op ran in, and every aligned op gets its counterpart's shapes. Ops that
align with nothing keep none, and the counts say how many did. Running the fixup again on a
finished trace gives the same trace.

Module ranges are entered through ``_RecordFunctionFast`` (one C++ call, against ~10 µs for
``record_function``), which the profiler files as ``cpu_op``; they are relabelled
``user_annotation``, the category ``record_function`` ranges have, so the report reads them
as annotations, not ops.
"""

from __future__ import annotations

import bisect
import gzip
import os
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import orjson

from kerneltriage.analysis.timeline.attribution import PROFILER_STEP
from kerneltriage.analysis.timeline.idle import union
from kerneltriage.annotate import MODULE_PREFIX
from kerneltriage.gc_pause import gc_paused
from kerneltriage.ingest.kineto import GPU_KINDS

SHAPE_ARGS = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")
#: How far ahead the alignment looks for the next common op when two sequences differ.
_LOOKAHEAD = 48
#: What the alignment pairs ops by: (name, innermost module range's name), or (name,).
Key = tuple[str, ...]


def finish_trace(trace: Path, shapes: Path | None) -> dict[str, Any]:
    """Relabel module ranges and copy shapes from ``shapes`` (a trace of one step) onto
    ``trace``'s recorded steps; rewrite ``trace`` in place. Returns counts for the manifest.

    Phase 2 waits for this (its plan reads the finished trace). The two parsed traces are
    millions of objects, none in a cycle: with the cyclic collector on, its passes over them
    took 40% of the time (``benchmarks/bench_trace_fixup.py``: 2.3 s against 1.35 s on a trace
    of T5-base's 115,000 events, 2 cores)."""
    with gc_paused():
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


def _is_module_range(e: dict[str, Any]) -> bool:
    # A module range is a ``cpu_op`` as recorded (the shapes step's, or the timed trace before
    # relabel_module_ranges) and a ``user_annotation`` after.
    return e.get("cat") in ("cpu_op", "user_annotation") and str(e.get("name", "")).startswith(MODULE_PREFIX)


class _Ops(NamedTuple):
    """One thread's ops (module ranges left out), parents first: the events, the key the
    alignment pairs each by, and each one's start."""

    events: list[dict[str, Any]]
    keys: list[Key]
    starts: list[float]


def _keyed_ops(events: list[dict[str, Any]]) -> dict[Any, _Ops]:
    """Per thread, its ops (module ranges left out), parents first, each with the key the
    alignment pairs it by: its name and the innermost module range it runs in.

    Op names repeat (``aten::mm`` in every ``Linear``), so a name alone lets a pairing slip to
    another module's op where the sequences differ; with the module in the key a slip stays
    inside one module. The autograd thread runs in no module range: a backward op takes the
    module of the forward op that recorded its autograd node (the same ``Sequence number`` on
    the node, or on the ``evaluate_function`` range around it). Ops that find no module keep
    the name alone."""
    threads: dict[Any, list[dict[str, Any]]] = {}
    for e in events:
        cat = e.get("cat")
        if (cat == "cpu_op" or (cat == "user_annotation" and _is_module_range(e))) and e.get("ph") == "X":
            threads.setdefault(e.get("tid"), []).append(e)
    out: dict[Any, _Ops] = {}
    ends: dict[Any, list[float]] = {}
    numbers: dict[Any, list[Any]] = {}
    # Per sequence number, the innermost module of the last forward op that carries it: an op
    # carries the number the next autograd node will get, so the last one is, or runs inside,
    # the op that made the node (ops before it that made no node carry the same number).
    forward: dict[int, str] = {}
    for tid, evs in threads.items():
        # By start, the longer of two events that start together first; ties keep the order
        # recorded (the index), as a stable sort would.
        order = sorted((float(e.get("ts", 0.0)), -float(e.get("dur", 0.0)), n) for n, e in enumerate(evs))
        opened: list[tuple[float, str]] = []  # module ranges open at this point: (end, name)
        ops = out[tid] = _Ops([], [], [])
        op_ends, op_numbers = ends[tid], numbers[tid] = [], []
        for start, negative_dur, n in order:
            e = evs[n]
            name = str(e.get("name"))
            while opened and opened[-1][0] <= start:
                opened.pop()
            if name.startswith(MODULE_PREFIX):  # every event here is an op or a module range
                opened.append((start - negative_dur, name))
                continue
            module = opened[-1][1] if opened else None
            seq = (e.get("args") or {}).get("Sequence number")
            if module is not None and seq is not None:
                forward[seq] = module
            ops.events.append(e)
            ops.keys.append((name, module) if module is not None else (name,))
            ops.starts.append(start)
            op_ends.append(start - negative_dur)
            op_numbers.append(seq)
    for tid, ops in out.items():
        # Backward ops: the module of their node's forward op, through the innermost op
        # around them (themselves included) that carries a sequence number.
        keys, op_ends, op_numbers = ops.keys, ends[tid], numbers[tid]
        numbered: list[tuple[float, Any]] = []  # (end, sequence number)
        for n, start in enumerate(ops.starts):
            while numbered and numbered[-1][0] <= start:
                numbered.pop()
            if op_numbers[n] is not None:
                numbered.append((op_ends[n], op_numbers[n]))
            if len(keys[n]) == 1 and numbered and numbered[-1][1] in forward:
                keys[n] = (keys[n][0], forward[numbered[-1][1]])
    return out


def copy_shapes(timed: list[dict[str, Any]], source: list[dict[str, Any]]) -> dict[str, Any]:
    """Copy the shape arguments of ``source``'s ops onto the ops of each recorded step of
    ``timed`` (in place; ``source`` is only read). ``source`` holds one step.

    Steps are the host's ``ProfilerStep#N`` ranges (the GPU's copies of them, category
    ``gpu_user_annotation``, overlap the next step and would count its ops twice). A step's
    ops lose any shape arguments first: the timed steps were recorded without them, so those
    present came from an earlier fixup, and an op that now aligns with nothing keeps none
    rather than a stale pairing's. Ops whose name never carries shapes
    (``autograd::engine::evaluate_function: …`` wrappers, step ranges) are counted apart:
    ``ops`` counts those that can."""
    windows = sorted(
        (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
        for e in timed
        if e.get("ph") == "X"
        and e.get("cat") != "gpu_user_annotation"
        and PROFILER_STEP.match(str(e.get("name", "")))
        and "ts" in e
    )
    src = _keyed_ops(source)
    # Each source op's shape arguments, taken once: every recorded step copies them.
    src_shapes = {
        tid: [
            {k: args[k] for k in SHAPE_ARGS if k in args}
            for args in (e.get("args") or {} for e in ops.events)
        ]
        for tid, ops in src.items()
    }
    shaped = {
        str(e.get("name"))
        for ops in src.values()
        for e in ops.events
        if (e.get("args") or {}).get("Input Dims")
    }
    total = matched = unshaped = 0
    missing: dict[str, int] = {}
    for tid, ops in _keyed_ops(timed).items():
        ref = src.get(tid)
        for start, end in windows:
            lo, hi = bisect.bisect_left(ops.starts, start), bisect.bisect_left(ops.starts, end)
            segment = ops.events[lo:hi]
            for e in segment:
                args = e.get("args")
                if args and not args.keys().isdisjoint(SHAPE_ARGS):
                    for k in SHAPE_ARGS:
                        args.pop(k, None)
            if ref and segment:
                shapes_of = src_shapes[tid]
                for i, j in align(ref.keys, ops.keys[lo:hi]):
                    if shapes_of[i]:
                        segment[j].setdefault("args", {}).update(shapes_of[i])
            for e in segment:
                has_shapes = "Input Dims" in (e.get("args") or {})
                name = str(e.get("name"))
                if not has_shapes and name not in shaped:
                    unshaped += 1
                    continue
                total += 1
                if has_shapes:
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


def align(a: Sequence[Hashable], b: Sequence[Hashable], lookahead: int = _LOOKAHEAD) -> list[tuple[int, int]]:
    """Pairs (i, j) with ``a[i] == b[j]``, in order: equal runs pair up; where the sequences
    differ, the next common key within ``lookahead`` (nearest first) resumes the pairing."""
    if a == b:
        return list(zip(range(len(a)), range(len(b))))
    pairs: list[tuple[int, int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            n = _equal_run(a, b, i, j)
            pairs.extend(zip(range(i, i + n), range(j, j + n)))
            i += n
            j += n
            continue
        step = _resync(a, b, i, j, lookahead)
        if step is None:
            i += 1
            j += 1
        else:
            i, j = i + step[0], j + step[1]
    return pairs


def _equal_run(a: Sequence[Hashable], b: Sequence[Hashable], i: int, j: int) -> int:
    """How many items from ``a[i]`` on equal those from ``b[j]`` on (``a[i] == b[j]``): slices
    compared in C, twice as many each time, then halved down to the first that differs (the
    runs between two differences are thousands of ops long)."""
    most = min(len(a) - i, len(b) - j)
    n, step = 1, 1
    while n < most:
        k = min(step, most - n)
        if a[i + n : i + n + k] == b[j + n : j + n + k]:
            n, step = n + k, step * 2
            continue
        equal, differ = 0, k  # the first `equal` items are equal; the first `differ` are not
        while differ - equal > 1:
            mid = (equal + differ) // 2
            if a[i + n : i + n + mid] == b[j + n : j + n + mid]:
                equal = mid
            else:
                differ = mid
        return n + equal
    return n


def _resync(
    a: Sequence[Hashable], b: Sequence[Hashable], i: int, j: int, lookahead: int
) -> tuple[int, int] | None:
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
    with gc_paused():  # a parse of many objects, none in a cycle (finish_trace)
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
