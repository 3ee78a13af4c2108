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
#: What the alignment pairs ops by: (name, innermost module range's name), or (name,).
Key = tuple[str, ...]


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


def _is_module_range(e: dict[str, Any]) -> bool:
    # A module range is a ``cpu_op`` as recorded (the shapes step's, or the timed trace before
    # relabel_module_ranges) and a ``user_annotation`` after.
    return e.get("cat") in ("cpu_op", "user_annotation") and str(e.get("name", "")).startswith(MODULE_PREFIX)


def _parents_first(e: dict[str, Any]) -> tuple[float, float]:
    # By start, the longer of two events that start together first.
    return float(e.get("ts", 0.0)), -float(e.get("dur", 0.0))


def _keyed_ops(events: list[dict[str, Any]]) -> dict[Any, list[tuple[dict[str, Any], Key]]]:
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
        if e.get("ph") == "X" and (e.get("cat") == "cpu_op" or _is_module_range(e)):
            threads.setdefault(e.get("tid"), []).append(e)
    out: dict[Any, list[tuple[dict[str, Any], Key]]] = {}
    # Per sequence number, the innermost module of the last forward op that carries it: an op
    # carries the number the next autograd node will get, so the last one is, or runs inside,
    # the op that made the node (ops before it that made no node carry the same number).
    forward: dict[int, str] = {}
    for tid, evs in threads.items():
        evs.sort(key=_parents_first)
        opened: list[tuple[float, str]] = []  # module ranges open at this point: (end, name)
        keyed: list[tuple[dict[str, Any], Key]] = []
        out[tid] = keyed
        for e in evs:
            start, name = float(e.get("ts", 0.0)), str(e.get("name"))
            while opened and opened[-1][0] <= start:
                opened.pop()
            if _is_module_range(e):
                opened.append((start + float(e.get("dur", 0.0)), name))
                continue
            module = opened[-1][1] if opened else None
            seq = (e.get("args") or {}).get("Sequence number")
            if module is not None and seq is not None:
                forward[seq] = module
            keyed.append((e, (name, module) if module is not None else (name,)))
    for keyed in out.values():
        # Backward ops: the module of their node's forward op, through the innermost op
        # around them (themselves included) that carries a sequence number.
        numbered: list[tuple[float, Any]] = []  # (end, sequence number)
        for n, (e, key) in enumerate(keyed):
            start = float(e.get("ts", 0.0))
            while numbered and numbered[-1][0] <= start:
                numbered.pop()
            seq = (e.get("args") or {}).get("Sequence number")
            if seq is not None:
                numbered.append((start + float(e.get("dur", 0.0)), seq))
            if len(key) == 1 and numbered and numbered[-1][1] in forward:
                keyed[n] = (e, (key[0], forward[numbered[-1][1]]))
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
    src_keys = {tid: [key for _, key in ops] for tid, ops in src.items()}
    shaped = {
        str(e.get("name")) for ops in src.values() for e, _ in ops if (e.get("args") or {}).get("Input Dims")
    }
    total = matched = unshaped = 0
    missing: dict[str, int] = {}
    for tid, ops in _keyed_ops(timed).items():
        starts = [float(e.get("ts", 0.0)) for e, _ in ops]
        ref = src.get(tid)
        for start, end in windows:
            lo, hi = bisect.bisect_left(starts, start), bisect.bisect_left(starts, end)
            segment = ops[lo:hi]
            for e, _ in segment:
                for k in SHAPE_ARGS:
                    (e.get("args") or {}).pop(k, None)
            if ref and segment:
                for i, j in align(src_keys[tid], [key for _, key in segment]):
                    args = ref[i][0].get("args") or {}
                    shapes = {k: args[k] for k in SHAPE_ARGS if k in args}
                    if shapes:
                        segment[j][0].setdefault("args", {}).update(shapes)
            for e, _ in segment:
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


def align(a: Sequence[Hashable], b: Sequence[Hashable], lookahead: int = _LOOKAHEAD) -> list[tuple[int, int]]:
    """Pairs (i, j) with ``a[i] == b[j]``, in order: equal runs pair up; where the sequences
    differ, the next common key within ``lookahead`` (nearest first) resumes the pairing."""
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
