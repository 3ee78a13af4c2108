"""GPU idle time inside the steps, and what the host was doing during the biggest gaps.

Busy time is the union of the step's kernel intervals (all streams). Idle = step wall time −
busy. A gap between two kernels where the second was launched only after the first had
finished is the host's doing: the CPU work on the launching thread in between (an
``aten::item`` sync, ``nonzero``, the data loader, Python) names the cause. A gap where the
next kernel was already queued is a dependency (another stream, an event).
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np

from kerneltriage.analysis.attribution import Attribution
from kerneltriage.analysis.model import Gap
from kerneltriage.ingest.tables import Timeline


def _union(starts: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    order = np.argsort(starts, kind="stable")
    merged: list[list[int]] = []
    for i in order.tolist():
        s, e = int(starts[i]), int(ends[i])
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def idle_gaps(
    attr: Attribution, timeline: Timeline, min_gap_ns: float, top: int = 5
) -> tuple[int, list[Gap]]:
    """(busy ns summed over steps, the biggest gap causes averaged per step)."""
    k = attr.kernels
    cpu = timeline.cpu
    names = cpu["name"].astype(str).to_numpy()
    runtime = timeline.runtime
    busy_total = 0
    by_cause: dict[str, list[float]] = defaultdict(list)
    for step in attr.steps:
        mine = k[k["step"] == step.index]
        if mine.empty:
            continue
        starts = mine["start"].to_numpy()
        ends = starts + mine["dur"].to_numpy()
        spans = _union(starts, ends)
        busy_total += sum(e - s for s, e in spans)
        first_launch = {}
        for s, launch, tid in zip(
            starts.tolist(), mine["launch_start"].tolist(), mine["launch_tid"].tolist()
        ):
            if s not in first_launch or launch < first_launch[s][0]:
                first_launch[s] = (launch, tid)
        for (_, prev_end), (next_start, _) in itertools.pairwise(spans):
            gap = next_start - prev_end
            if gap < min_gap_ns:
                continue
            launch, tid = first_launch.get(next_start, (-1, -1))
            if launch > prev_end:
                cause = _host_cause(cpu, names, runtime, tid, prev_end, launch)
            else:
                cause = "dependency wait (kernel queued, waiting on another stream or event)"
            by_cause[cause].append(gap / 1e6)
    n = max(1, len(attr.steps))
    gaps = [
        Gap(cause=c, ms_per_step=sum(v) / n, count_per_step=len(v) / n, example_ms=max(v))
        for c, v in by_cause.items()
    ]
    gaps.sort(key=lambda g: -g.ms_per_step)
    return busy_total, gaps[:top]


def _host_cause(cpu, names, runtime, tid: int, t0: int, t1: int) -> str:
    """The longest CPU activity on the launching thread overlapping (t0, t1)."""
    rt = runtime[(runtime["tid"] == tid) & (runtime["start"] < t1) & (runtime["start"] + runtime["dur"] > t0)]
    sync = rt[
        rt["name"].astype(str).str.contains("Synchronize|Memcpy|cudaStreamWait|EventSynchronize", regex=True)
    ]
    if len(sync):
        longest = sync.loc[(sync["dur"]).idxmax()]
        op = _enclosing_op(cpu, names, tid, int(longest["start"]))
        return f"host sync: {longest['name']}" + (f" in {op}" if op else "")
    ops = cpu[
        (cpu["tid"] == tid)
        & (cpu["cat"] == "cpu_op")
        & (cpu["start"] < t1)
        & (cpu["start"] + cpu["dur"] > t0)
    ]
    if len(ops):
        overlap = np.minimum(ops["start"] + ops["dur"], t1) - np.maximum(ops["start"], t0)
        # The outermost (longest overlapping) op says what the host was busy with.
        i = int(overlap.idxmax())
        return f"host busy: {names[i]}"
    return "host: no profiled CPU activity (Python, data loading, or untraced work)"


def _enclosing_op(cpu, names, tid: int, t: int) -> str | None:
    hold = cpu[
        (cpu["tid"] == tid)
        & (cpu["cat"] == "cpu_op")
        & (cpu["start"] <= t)
        & (cpu["start"] + cpu["dur"] >= t)
    ]
    if hold.empty:
        return None
    return names[int(hold["dur"].idxmax())]
